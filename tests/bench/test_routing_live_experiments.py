"""Which runs each experiment makes in each mode, in which order: with a `run` that records
what it was asked for instead of starting a fleet."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from bench.common.fleet_modes import Mode
from bench.routing.drive import Load
from bench.routing.experiments import interleaved, run_experiments
from bench.routing.fleet import FleetSpec
from bench.routing.live import PROFILES

LOAD, HOT_LOAD = Load(rate_per_s=10.0), Load(rate_per_s=12.0)


def specs(own: list[str], third_party: list[str]) -> dict[Mode, dict[str, FleetSpec]]:
    return {"own": {p: replace(PROFILES[p], num_kv_blocks=500) for p in own},
            "third-party": {p: replace(PROFILES[p], num_kv_blocks=500, mode="third-party")
                            for p in third_party}}


OWN = ["round_robin", "least_load", "prefix_affinity:approx", "prefix_affinity:exact"]
THIRD = ["round_robin", "prefix_affinity:approx"]


def test_a_profiles_runs_in_both_modes_go_back_to_back() -> None:
    assert interleaved(specs(OWN, THIRD), lambda p: True) == [
        ("own", "round_robin"), ("third-party", "round_robin"), ("own", "least_load"),
        ("own", "prefix_affinity:approx"), ("third-party", "prefix_affinity:approx"),
        ("own", "prefix_affinity:exact")]


def test_every_experiment_in_every_mode() -> None:
    calls: list[tuple[str, str, str, float | None, int | None]] = []

    def run(spec: FleetSpec, workload: str, load: Load) -> dict[str, Any]:
        calls.append((spec.mode, spec.label, workload, load.rate_per_s, spec.num_kv_blocks))
        return {"label": spec.label}

    out = run_experiments(run, specs(OWN, THIRD), ["shared-prefix", "multi-turn", "hot-prefix",
                                                   "kv-pressure"], LOAD, HOT_LOAD, {"25%": 300})
    approx, exact = "prefix_affinity (approx)", "prefix_affinity (exact)"
    assert list(out["own"]["shared_prefix"]) == ["round_robin", "least_load", approx, exact]
    assert list(out["third-party"]["shared_prefix"]) == ["round_robin", approx]
    assert list(out["own"]["multi_turn"]) == ["round_robin", approx, exact]
    assert list(out["third-party"]["multi_turn"]) == ["round_robin", approx]
    assert list(out["third-party"]["hot_prefix"]) == [approx]
    assert set(out["own"]["hot_prefix"][exact]) == {"uniform", "hot"}
    assert list(out["third-party"]["kv_pressure"]["points"]["25%"]) == ["round_robin", approx]
    assert {c[3] for c in calls if c[2] in ("hot", "uniform")} == {12.0}
    assert {c[4] for c in calls if c[4] != 500} == {300}  # only kv-pressure resizes the KV
    assert len(calls) == 6 + 5 + 2 * 3 + 5
