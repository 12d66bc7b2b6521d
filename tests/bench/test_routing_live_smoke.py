"""The live routing benchmark runs end to end in its quick mode and writes every figure.

No timing is asserted: the figures depend on the machine. The quick run (own fleet only, 2
workers, 2 s per run, each worker's KV the default share of the 6 prompts' working set)
calibrates round_robin, runs the shared-prefix workload under round_robin and prefix_affinity
(exact index), and the hot-prefix pair under prefix_affinity; about 30 s. Both fleet modes
side by side: `test_routing_live_third_party`. The pure parts (the ideal cache, the
hot-prefix weights and rate) are checked on hand-made values.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.routing.figures import ideal_cached_tokens
from bench.routing.live import KV_FRACTION, hot_rate, kv_blocks_for
from bench.routing.workloads import hot_weights

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES = ("round_robin", "prefix_affinity (exact)")
# Figures every run must have, finite and > 0.
POSITIVE = ("throughput_rps", "cached_fraction", "ideal_cached_fraction", "share_of_ideal",
            "max_mean_requests", "busy_max_mean", "work_max_mean", "in_flight_max_mean",
            "busy_s_per_request", "window_s")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("routing-live") / "routing-live.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.routing", "--quick", "--mode", "own",
         "--profiles", "round_robin,prefix_affinity:exact",
         "--experiments", "shared-prefix,hot-prefix", "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| target |" in done.stdout
    document: dict[str, Any] = json.loads(out.read_text())
    return document


def _runs(results: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    runs = [("calibration", results["calibration"])]
    runs += [(f"shared/{label}", f) for label, f in results["own"]["shared_prefix"].items()]
    for label, pair in results["own"]["hot_prefix"].items():
        runs += [(f"{workload}/{label}", f) for workload, f in pair.items()]
    return runs


def _is_positive(value: Any) -> bool:
    return isinstance(value, float | int) and math.isfinite(value) and value > 0


def test_every_experiment_ran_every_profile(results: dict[str, Any]) -> None:
    kv = results["kv"]  # the default: KV_FRACTION of the quick run's 6 prompts
    assert kv["num_kv_blocks"] == kv_blocks_for(KV_FRACTION, kv["working_set_blocks"])
    assert {f["num_kv_blocks"] for _, f in _runs(results)} == {kv["num_kv_blocks"]}
    assert results["modes"] == ["own"] and "third_party" not in results
    assert tuple(results["own"]["shared_prefix"]) == PROFILES
    assert tuple(results["own"]["hot_prefix"]) == ("prefix_affinity (exact)",)
    assert [name for name, f in _runs(results) if f["num_ok"] < 1] == []


def test_every_figure_is_finite_and_positive(results: dict[str, Any]) -> None:
    bad = [f"{name}: {key}" for name, f in _runs(results) for key in POSITIVE
           if not _is_positive(f[key])]
    bad += [f"{name}: ttft {q}" for name, f in _runs(results) for q in ("p50", "p90", "p99")
            if not _is_positive(f["ttft_ms"][q])]
    bad += [f"{name}: busy of {w}" for name, f in _runs(results)
            for w, s in f["busy_s_per_worker"].items() if not _is_positive(s)]
    assert bad == []
    assert all(_is_positive(v) for v in results["rates"].values())
    assert _is_positive(results["calibration"]["capacity_rps"])


def test_every_target_is_judged(results: dict[str, Any]) -> None:
    targets = {(t["target"], t["label"]) for t in results["targets"] if t["mode"] == "own"}
    label = "prefix_affinity (exact)"
    assert {("TTFT p50 / round_robin's", label), ("TTFT p99 / round_robin's", label),
            ("cached fraction / ideal", label), ("hot TTFT p90 / uniform's", label),
            ("hot: busiest / mean busy time", label)} <= targets
    assert all(_is_positive(t["value"]) for t in results["targets"])


@pytest.mark.parametrize(("prompts", "expected"), [
    pytest.param([[1] * 40], [0], id="first-prompt-is-never-cached"),
    pytest.param([[1] * 40, [1] * 40], [0, 32], id="repeat-all-full-blocks"),
    pytest.param([[1] * 32, [1] * 32], [0, 16], id="never-the-last-token"),
    pytest.param([[1] * 16 + [2] * 16, [1] * 16 + [3] * 20], [0, 16], id="diverges-in-block-2"),
    pytest.param([[2] * 40, [1] * 16 + [2] * 24], [0, 0], id="same-block-other-parent"),
])
def test_ideal_cache_counts_shared_leading_blocks(prompts: list[list[int]],
                                                  expected: list[int]) -> None:
    assert ideal_cached_tokens(prompts, block_size=16) == expected


def test_hot_weights_give_group_zero_its_share() -> None:
    weights = hot_weights(24, 0.3)
    assert weights[0] == 0.3 and math.isclose(sum(weights), 1.0)
    assert len(set(weights[1:])) == 1


@pytest.mark.parametrize(("num_workers", "expected_rps"), [
    pytest.param(4, 100.0, id="4-workers-capacity"),
    pytest.param(2, 100.0, id="2-workers-capped-at-capacity"),
    pytest.param(8, 75.0, id="8-workers-at-least-75pct"),
])
def test_hot_rate(num_workers: int, expected_rps: float) -> None:
    assert math.isclose(hot_rate(100.0, num_workers), expected_rps)
