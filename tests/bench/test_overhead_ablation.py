"""The ablation bench (``bench.overhead.ablation``) runs end to end in a small run: every
endpoint measured, the table and the results file written; its table is relative to the
gateway's floor and the bare proxy."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from bench.overhead.ablation import GATEWAYS, table


@pytest.mark.parametrize("mode", ["third-party", "own"])
def test_a_small_run_measures_every_endpoint(tmp_path: Path, mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead.ablation", "--requests", "150", "--rounds", "1",
         "--mode", mode, "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("ablation-*.json")
    document = orjson.loads(path.read_bytes())
    assert document["mode"] == mode
    figures = document["cpu_us_per_request"]
    assert set(figures) == {"floor", "bare", *GATEWAYS}
    # CPU is read in clock ticks (10 ms): the floor's 150 requests may cost it less than one,
    # so a figure may be 0; none is negative, and the run as a whole used some.
    assert all(len(runs) == 1 and math.isfinite(runs[0]) and runs[0] >= 0
               for runs in figures.values()), figures
    assert sum(runs[0] for runs in figures.values()) > 0, figures
    for name in ("floor", "bare", *GATEWAYS):
        assert f"| {name} |" in done.stdout


def test_the_table_is_relative_to_the_floor_and_the_bare_proxy() -> None:
    text = table({"floor": [60.0, 70.0], "bare": [140.0], "full": [200.0, 220.0, 210.0]})
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert rows["full"] == "| full | 210 | +145 | 1.50 | 200, 220, 210 |"
    assert rows["floor"].startswith("| floor | 65 | +0 |")
