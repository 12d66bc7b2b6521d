"""The worker benchmark runs end to end in its quick mode (tiny random model) and writes sane
results; its calibration file loads in the simulator.

No speed is asserted: the figures depend on the machine. This proves every section runs, every
figure is finite and in range, and the files are where the JSON says.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.sim.cli import build_parser, config_from_args
from backends.sim.host import worker_profiles
from backends.sim.profile import LatencyModel

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results_dir = tmp_path_factory.mktemp("worker-bench")
    done = subprocess.run(
        [sys.executable, "-m", "bench.worker", "--quick", "--device", "cpu",
         "--results-dir", str(results_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| target | goal | measured | result |" in done.stdout
    [path] = results_dir.glob("worker-cpu-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _numbers(value: object) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list | tuple):
        return [n for v in value for n in _numbers(v)]
    return []


def test_every_section_ran_and_every_figure_is_finite(results: dict[str, Any]) -> None:
    for section in ("sweep", "prefix", "capacity", "quality", "calibration", "targets"):
        assert section in results, section
    assert all(math.isfinite(n) for n in _numbers(results))


def test_sweep(results: dict[str, Any]) -> None:
    points = results["sweep"]["points"]
    assert [p["batch_size"] for p in points] == [1, 2, 4]
    for point in points:
        assert point["decode_step_ms"] > 0
        assert point["prefill_tokens_per_s"] > 0
        assert point["decode_tokens_per_s"] == pytest.approx(
            1000 * point["batch_size"] / point["decode_step_ms"])
    assert Path(results["sweep"]["plot"]).stat().st_size > 10_000
    assert set(results["sweep"]["best_under_limit"]) == {"50", "100"}


def test_prefix_cache_hit_is_reported(results: dict[str, Any]) -> None:
    prefix = results["prefix"]
    # 128 tokens: every full block but the one holding the last token comes from the cache.
    assert prefix["cached_tokens"] == 112
    assert prefix["shared_prefix_cached_tokens"] == 112  # 120 shared tokens: 7 full blocks
    assert prefix["uncached_ttft_ms"] > 0 and prefix["cached_ttft_ms"] > 0


def test_capacity_figures_follow_the_cache_accounting(results: dict[str, Any]) -> None:
    capacity = results["capacity"]
    rows = capacity["rows"]
    # Tiny model: 2 layers, 2 KV heads of 16; int8 adds a 2-byte scale per vector.
    assert rows["bfloat16"]["bytes_per_token"] == 2 * 2 * 2 * 16 * 2
    assert rows["int8"]["bytes_per_token"] == 2 * 2 * 2 * (16 + 2)
    assert capacity["gqa_bytes_ratio"] == capacity["gqa_expected_ratio"] == 2
    for row in rows.values():
        assert row["num_sequences"] == row["num_blocks"] // (2048 // 16)


def test_quality_shares_are_fractions(results: dict[str, Any]) -> None:
    quality = results["quality"]
    greedy = quality["greedy"]
    for share in (greedy["teacher_forced_agreement"], greedy["free_running"]["matched_share"],
                  greedy["free_running"]["identical_share"],
                  quality["perplexity"]["int8_top1_agreement_with_baseline"]):
        assert 0 <= share <= 1
    # The engine's own greedy output, fed back: only batch-shape rounding can differ.
    assert greedy["teacher_forced_baseline_self_agreement"] >= 0.95
    by_dtype = quality["perplexity"]["by_kv_dtype"]
    assert by_dtype["float32"]["mean_abs_logit_error"] == 0  # the reference itself
    assert all(row["perplexity"] > 1 for row in by_dtype.values())


def test_targets_are_listed(results: dict[str, Any]) -> None:
    assert len(results["targets"]) == 5
    assert all(isinstance(t["passed"], bool) for t in results["targets"])


def test_the_simulator_loads_the_calibration(results: dict[str, Any]) -> None:
    path = results["calibration"]["path"]
    fitted = LatencyModel.from_json(path)
    assert fitted.step_time_s(64, 4, 256) > 0
    config = config_from_args(build_parser().parse_args(["--workers", "2",
                                                         "--latency-json", path]))
    assert config.latency == fitted
    assert all(profile.latency == fitted for profile in worker_profiles(config))
