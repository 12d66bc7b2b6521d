"""bench.replicas' figures on hand-made runs: ratios to one replica, the token quota against
its GCRA allowance, revocation, convergence, and the verdicts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from bench.replicas.convergence import split_rounds
from bench.replicas.figures import (
    agreement,
    converged_after_s,
    hit_share,
    ratios,
    revocation_figures,
    token_quota_figures,
    verdicts,
)


def run(cached: float, p90: float, p99: float) -> dict[str, Any]:
    return {"cached_fraction": cached, "ttft_ms": {"p50": p90 / 2, "p90": p90, "p99": p99}}


@dataclass(frozen=True)
class _Probe:
    is_hit: bool


def test_ratios_are_to_the_one_replica_run() -> None:
    got = ratios({"1": run(0.80, 200.0, 400.0), "4": run(0.78, 210.0, 380.0),
                  "1 again": run(0.80, 190.0, 400.0)})
    assert got["1"] == {"cached_fraction": 1.0, "ttft_p90_ms": 1.0, "ttft_p99_ms": 1.0}
    assert got["4"] == pytest.approx({"cached_fraction": 0.975, "ttft_p90_ms": 1.05,
                                      "ttft_p99_ms": 0.95})
    assert got["1 again"]["ttft_p90_ms"] == pytest.approx(0.95)


def test_no_reference_run_no_ratios() -> None:
    assert ratios({"2": run(0.8, 1.0, 2.0)}) == {}


@pytest.mark.parametrize(("sent", "tpm", "expected"), [
    pytest.param([(0.0, 200, 100), (30.0, 200, 100)], 120, {"allowance_tokens": 180,
                 "admitted_tokens": 200, "num_admitted": 2}, id="over-the-allowance"),
    pytest.param([(0.0, 200, 100), (6.0, 429, 0), (60.0, 200, 100)], 100,
                 {"allowance_tokens": 200, "admitted_tokens": 200, "num_refused": 1,
                  "admitted_to_allowance": 1.0}, id="burst-then-a-minute"),
    pytest.param([(0.0, 0, 0), (1.0, 503, 0)], 600, {"num_other": 2, "admitted_tokens": 0},
                 id="failures-are-neither"),
])
def test_token_quota_against_the_gcra_allowance(sent: Sequence[tuple[float, int, int]],
                                                tpm: int, expected: Mapping[str, Any]) -> None:
    figures = token_quota_figures(sent, tpm)
    assert {key: figures[key] for key in expected} == expected


def test_revocation_takes_the_slowest_replica_of_each_trial() -> None:
    figures = revocation_figures([{"a": 0.01, "b": 0.03}, {"a": 0.02, "b": 0.01},
                                  {"a": 0.05, "b": 0.04}])
    assert figures["slowest_s"] == [0.03, 0.02, 0.05]
    assert figures["median_s"] == pytest.approx(0.03)
    assert figures["max_s"] == pytest.approx(0.05)


def test_a_replica_that_never_refuses_leaves_no_worst_figure() -> None:
    figures = revocation_figures([{"a": 0.01, "b": None}, {"a": 0.02, "b": 0.01}])
    assert figures["slowest_s"] == [None, 0.02]
    assert figures["num_never"] == 1
    assert figures["max_s"] is None


def test_agreement_and_hit_share() -> None:
    holders = {0: "b", 1: "c", 2: "a"}
    assert agreement(holders, {0: "b", 1: "a"}) == 0.5
    assert agreement(holders, {7: "a"}) is None
    assert hit_share([_Probe(True), _Probe(False), _Probe(True), _Probe(True)]) == 0.75
    assert hit_share([]) is None


@pytest.mark.parametrize(("shares", "baseline", "expected"), [
    pytest.param([1.0, 1.0, 1.0], 1.0, 0.0, id="at-once"),
    pytest.param([0.25, 0.5, 1.0, 1.0], 1.0, 1.0, id="from-the-third-round"),
    pytest.param([1.0, 0.5, 1.0, 1.0], 1.0, 1.0, id="a-later-miss-restarts-the-count"),
    pytest.param([1.0, 1.0, 0.5], 1.0, None, id="not-by-the-last-round"),
    pytest.param([0.75, 0.8], 0.75, 0.0, id="as-good-as-the-running-replica"),
])
def test_converged_after(shares: list[float], baseline: float, expected: float | None) -> None:
    offsets = [0.0, 0.5, 1.0, 2.0]
    rounds = [{"offset_s": offsets[i], "hit_share": s} for i, s in enumerate(shares)]
    assert converged_after_s(rounds, baseline) == expected


def test_rounds_ask_each_group_once() -> None:
    rounds = split_rounds(list(range(10)), 4)
    assert rounds == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_verdicts_judge_n_against_one_quota_both_ways_and_revocation() -> None:
    results = {"ratios": {"1": {"cached_fraction": 1.0, "ttft_p90_ms": 1.0, "ttft_p99_ms": 1.0},
                          "4": {"cached_fraction": 0.96, "ttft_p90_ms": 1.04,
                                "ttft_p99_ms": 1.20},
                          "1 again": {"cached_fraction": 0.5, "ttft_p90_ms": 9.0,
                                      "ttft_p99_ms": 9.0}},
               "quota": {"num_replicas": 4, "rpm": {"admitted_to_allowance": 1.0},
                         "tpm": {"admitted_to_allowance": 1.002}},
               "revocation": {"num_replicas": 4, "figures": {"max_s": 0.02}}}
    judged = {(v["target"], v["limit"]): v["is_met"] for v in verdicts({"own": results})}
    assert judged == {
        ("cached_fraction, N replicas / 1", 0.95): True,
        ("ttft_p90_ms, N replicas / 1", 1.05): True,
        ("ttft_p99_ms, N replicas / 1", 1.05): False,
        ("RPM: admitted / allowance", 0.99): True, ("RPM: admitted / allowance", 1.0): True,
        ("TPM: admitted / allowance", 0.99): True, ("TPM: admitted / allowance", 1.0): False,
        ("revocation: slowest replica (s)", 1.0): True,
    }
