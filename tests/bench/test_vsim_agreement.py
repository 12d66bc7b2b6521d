"""bench.vsim.agreement --quick: live and virtual-time runs of the same requests (~35 s).

Checks the JSON's structure and sanity only; agreement itself is measured, not asserted.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.vsim.agreement import PROFILES

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs redis-server")


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("vsim-agreement") / "agreement.json"
    done = subprocess.run([sys.executable, "-m", "bench.vsim.agreement", "--quick",
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, object] = json.loads(out.read_text())
    return loaded


def test_every_profile_ran_on_both_sides(document: dict[str, object]) -> None:
    results = document["results"]
    assert isinstance(results, dict) and set(results) == set(PROFILES)
    for run in results.values():
        assert set(run) == {"live", "vsim", "vsim_no_path", "compare"}


@pytest.mark.parametrize("profile", [pytest.param(p, id=p) for p in PROFILES])
def test_both_sides_ran_the_same_requests(document: dict[str, object], profile: str) -> None:
    run = document["results"][profile]  # type: ignore[index]
    live, vsim = run["live"], run["vsim"]
    assert live["num_requests"] > 0
    assert live["num_requests"] == vsim["num_requests"] == run["vsim_no_path"]["num_requests"]
    assert live["num_counted"] == vsim["num_counted"]
    assert live["num_errors"] == 0
    assert vsim["num_completed"] == vsim["num_counted"]


@pytest.mark.parametrize("profile", [pytest.param(p, id=p) for p in PROFILES])
def test_figures_are_present_and_sane(document: dict[str, object], profile: str) -> None:
    run = document["results"][profile]  # type: ignore[index]
    for side in ("live", "vsim", "vsim_no_path"):
        figures = run[side]
        assert 0.0 <= figures["cached_fraction"] <= 1.0
        assert 0.0 <= figures["ideal_cached_fraction"] <= 1.0
        p50, p99 = figures["ttft_ms"]["p50"], figures["ttft_ms"]["p99"]
        assert 0.0 < p50 <= p99 and math.isfinite(p99)
    if profile == "round_robin":
        # round robin reads no fleet state, so a fixed path latency shifts every request's
        # engine timeline by the same amount: TTFT p50 moves by exactly that latency (a
        # prefix-aware profile routes on a fleet state the delay changes, either way)
        shift = run["vsim"]["ttft_ms"]["p50"] - run["vsim_no_path"]["ttft_ms"]["p50"]
        assert shift == pytest.approx(run["vsim"]["dispatch_ms"], abs=1.0)
    compare = run["compare"]
    assert compare["ttft_p50_ratio"] > 0 and compare["cached_ratio"] > 0
    assert isinstance(compare["ttft_p50_within"], bool)


def test_probe_measured_the_live_path(document: dict[str, object]) -> None:
    probe = document["probe"]
    assert isinstance(probe, dict)
    assert probe["path_latency"]["num_requests"] > 0
    assert math.isfinite(probe["path_latency"]["median_ms"])
    config = document["config"]
    assert isinstance(config, dict) and config["num_workers"] == 2
