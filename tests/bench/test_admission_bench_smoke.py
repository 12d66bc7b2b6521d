"""The admission benchmark runs end to end in its quick mode and writes every figure.

No timing or target is asserted: the figures depend on the machine. This proves that both
fleets (the own simulated fleet and the mock one) come up, every load level runs with
admission on and off, the retry run runs, and the results file holds every figure of the
tables, finite. The third-party fleet: `test_admission_bench_third_party`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.admission.bench import QUICK
from bench.admission.quota import COST_SETUPS

REPO_ROOT = Path(__file__).resolve().parents[2]
TIERS = ("interactive", "standard", "batch")
TIER_FIGURES = ("num_offered", "num_admitted", "num_rejected", "num_unresolved", "num_ok",
                "num_met_slo", "attainment_offered", "attainment_admitted", "offered_rps",
                "goodput_rps", "num_rejected_while_pending")
FAIRNESS_FIGURES = ("jain_equal_weight", "heavy_normalised_service",
                    "light_normalised_service_mean", "heavy_service_over_max_min_share",
                    "jain_max_min")
COST_FIGURES = ("gateway_cpu_us_per_request", "redis_cpu_us_per_request", "requests_per_s",
                "p50_ms", "p99_ms", "evalsha_per_request", "quota_round_trips_per_request",
                "script_commands_per_request", "other_redis_calls_per_request")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results_dir = tmp_path_factory.mktemp("admission-results")
    done = subprocess.run(
        [sys.executable, "-m", "bench.admission", "--quick", "--mode", "own",
         "--results-dir", str(results_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = results_dir.glob("admission-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_capacity_is_measured(results: dict[str, Any]) -> None:
    assert results["modes"] == ["own"] and "third_party" not in results
    capacity = results["own"]["capacity"]
    assert capacity["saturation_rps"] > 0
    assert capacity["capacity_rps"] > 0
    assert len(capacity["sweep"]) == len(QUICK.sweep_fractions)


def test_every_level_ran_with_admission_on_and_off(results: dict[str, Any]) -> None:
    ran = [(run["level"], run["mode"]) for run in results["own"]["levels"]]
    assert ran == [(level, mode) for level in QUICK.levels for mode in ("on", "off")]


@pytest.mark.parametrize("tier", [pytest.param(t, id=t) for t in TIERS])
def test_tier_figures_are_present_and_finite(results: dict[str, Any], tier: str) -> None:
    for run in results["own"]["levels"]:
        figures = run["figures"]["tiers"][tier]
        where = f"{run['level']}x {run['mode']} {tier}"
        # A share of nothing is undefined: with no request of the tier admitted in a short
        # run (e.g. batch at 3x), attainment of the admitted has no value.
        undefined = {"attainment_admitted"} if figures["num_admitted"] == 0 else set()
        assert [name for name in TIER_FIGURES
                if name not in undefined and not _finite(figures[name])] == [], where
        assert figures["num_offered"] > 0, where
        ttft = figures["ttft_ms"]
        if ttft["num"]:  # percentiles exist where some request of the tier got a first token
            assert _finite(ttft["p50"]) and _finite(ttft["p99"]), where


def test_fairness_and_goodput_are_present_and_finite(results: dict[str, Any]) -> None:
    for run in results["own"]["levels"]:
        figures = run["figures"]
        where = f"{run['level']}x {run['mode']}"
        assert _finite(figures["goodput_rps"]) and _finite(figures["offered_rps"]), where
        fairness = figures["fairness"]
        assert [name for name in FAIRNESS_FIGURES if not _finite(fairness[name])] == [], where
        assert len(fairness["tokens_demanded"]) == 10, where  # every tenant sent something
        assert all(_finite(v) for v in run["rejections"].values()), where


def test_quota_figures_are_present_and_finite(results: dict[str, Any]) -> None:
    quota = results["quota"]
    for name in ("num_sent", "num_admitted", "allowance", "error_pct", "admitted_by_gateways",
                 "evalsha_per_request"):
        assert _finite(quota[name]), name
    assert quota["num_replicas"] == 3
    assert quota["num_refused"] > 0  # the limit was reached


@pytest.mark.parametrize("setup", [pytest.param(name, id=name) for name, _, _ in COST_SETUPS])
def test_cost_figures_are_present_and_finite(results: dict[str, Any], setup: str) -> None:
    costs = results["costs"][setup]
    assert [name for name in COST_FIGURES if not _finite(costs[name])] == []
    assert costs["gateway_cpu_us_per_request"] > 0
    # Every quota script call is an EVALSHA; concurrent ones share round trips.
    assert costs["quota_round_trips_per_request"] <= costs["evalsha_per_request"] + 1e-9
    # (a set-up without limits still sees the usage book's flushes: well under 0.05 a request)
    assert (costs["quota_round_trips_per_request"] > 0) == (costs["evalsha_per_request"] > 0.05)


def test_the_retry_run_is_reported(results: dict[str, Any]) -> None:
    retry = results["own"]["retry"]
    assert retry["policy"]["tiers"] == ["interactive", "standard"]
    assert retry["retries"]["tiers"] == ["interactive", "standard"]
    assert set(retry["retries"]["by_tier"]) == {"interactive", "standard"}
    figures = retry["retries"]
    # Every retry answers a refusal; at most one retry per refused request.
    assert figures["num_retried"] <= figures["num_with_retry_after"] <= figures["num_refused"]
    assert len(retry["retry_records"]) == figures["num_retried"]
    assert retry["figures"]["tiers"]["interactive"]["num_offered"] > 0


def test_targets_are_judged_not_asserted(results: dict[str, Any]) -> None:
    assert [t["mode"] for t in results["targets"]] == ["own"] * 8 + ["-"]
    assert all(isinstance(t["passed"], bool) for t in results["targets"])
