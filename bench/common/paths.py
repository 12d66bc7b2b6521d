"""Where benchmarks write their results (``bench/results``, git-ignored) and read their data."""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
RESULTS_DIR = BENCH_DIR / "results"
DATA_DIR = BENCH_DIR / "data"
