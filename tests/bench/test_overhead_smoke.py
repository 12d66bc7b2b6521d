"""The overhead benchmark runs end to end in its quick mode and writes every figure.

No timing is asserted: the figures depend on the machine. This only proves that the fleet comes
up, every phase runs against every endpoint, and the results file is complete.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.common.report import ROWS, TARGETS
from bench.overhead.bench import LARGE_FLEET_PHASES, QUICK, phases
from routing import native

REPO_ROOT = Path(__file__).resolve().parents[2]
ENDPOINTS = ("direct", "floor", "gateway")
# Differences of two measurements, and measures of idleness: zero or negative is valid.
MAY_BE_ZERO_OR_NEGATIVE = ("added_p50_ms", "added_p99_ms", "loadgen_lag_p99_ms",
                           "others_cores_busy")
# CPU read in clock ticks (10 ms): a quick run's few hundred requests may cost Redis less than
# one tick, so its figure may be 0 (never negative: the first test checks that).
MAY_BE_ZERO = ("redis_cpu_us_per_request",)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results_dir = tmp_path_factory.mktemp("bench-results")
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--quick", "--results-dir", str(results_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=110, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = results_dir.glob("overhead-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_every_figure_is_finite_and_none_is_negative(results: dict[str, Any]) -> None:
    for key, value in results["median"].items():
        assert isinstance(value, float | int) and math.isfinite(value), key
        if not key.endswith(MAY_BE_ZERO_OR_NEGATIVE):
            assert value >= 0, key


def test_table_and_target_figures_are_present_and_positive(results: dict[str, Any]) -> None:
    median = results["median"]
    expected = [t.key for t in TARGETS]
    absent = []
    for _, template, direct_key in ROWS:
        # The interpreted gateway runs only beside a compiled one (routing.native).
        is_interpreted = "interpreted" in template
        (expected if native.STATUS.startswith("compiled") or not is_interpreted
         else absent).append(template.format("gateway"))
        # the gateway against the floor, and Redis (the bare proxy uses none): no floor figure
        if not template.endswith(("to_floor_ratio", "redis_cpu_us_per_request")) \
                and "{}64" not in template and "{}_" not in template \
                and not is_interpreted:  # nor the other gateways
            expected.append(template.format("floor"))
        expected += [direct_key] if direct_key else []
    assert [key for key in expected if key not in median] == []
    assert [key for key in absent if key in median] == []
    headline = [key for key in expected
                if not key.endswith((*MAY_BE_ZERO_OR_NEGATIVE, *MAY_BE_ZERO))]
    assert [key for key in headline if median[key] <= 0] == []


@pytest.mark.parametrize("phase", [pytest.param(p.name, id=p.name) for p in phases(QUICK)])
def test_each_phase_ran_against_each_endpoint(results: dict[str, Any], phase: str) -> None:
    median = results["median"]
    large = ("gateway64",) if phase in LARGE_FLEET_PHASES else ()
    for endpoint in (*ENDPOINTS, *large):
        assert median[f"{phase}.{endpoint}.requests_per_s"] > 0, endpoint
        assert median[f"{phase}.{endpoint}.p50_ms"] > 0, endpoint
    if not large:
        assert not [key for key in median if key.startswith(f"{phase}.gateway64.")]


def test_targets_are_judged_not_asserted(results: dict[str, Any]) -> None:
    assert [t["key"] for t in results["targets"]] == [t.key for t in TARGETS]
    assert all(isinstance(t["passed"], bool) for t in results["targets"])
    assert results["plan"]["runs"] == 1
    assert len(results["runs"]) == 1


def test_own_fleet_mode_runs_on_heartbeating_workers(tmp_path: Path) -> None:
    """``--mode own``: the gateway finds simulated workers through their heartbeats (no
    ``backends:``); the phases run but the paced one and the 64-backend gateway, and only the
    targets measured are judged."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.overhead", "--quick", "--mode", "own",
         "--results-dir", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=110, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("overhead-*.json")
    document = json.loads(path.read_text())
    median = document["median"]
    assert document["mode"] == "own"
    assert median["nonstream.gateway.proxy_cpu_us_per_request"] > 0
    assert median["nonstream.gateway.cpu_to_floor_ratio"] > 0
    assert not [key for key in median if ".gateway64." in key or key.startswith("paced_stream.")]
    judged = [t["key"] for t in document["targets"]]
    assert "nonstream.gateway.proxy_cpu_us_per_request" in judged
    assert "paced_stream.gateway.proxy_cpu_us_per_chunk" not in judged
