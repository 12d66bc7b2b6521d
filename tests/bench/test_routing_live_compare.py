"""Own against third-party, side by side, on hand-made figures: which pairs are compared, the
ratios, and the targets judged."""

from __future__ import annotations

from typing import Any

import pytest

from bench.routing.compare import (
    all_verdicts,
    comparison,
    comparison_tables,
    document_markdown,
)
from bench.routing.live import chosen_profiles

APPROX, EXACT = "prefix_affinity (approx)", "prefix_affinity (exact)"


def figures(p90: float, p99: float, cached: float, kept: float | None = None) -> dict[str, Any]:
    return {"ttft_ms": {"p50": p90 / 2, "p90": p90, "p99": p99}, "cached_fraction": cached,
            "busy_max_mean": 1.1, "max_mean_requests": 1.2, "work_max_mean": 1.1,
            "throughput_rps": 10.0, "ideal_cached_fraction": 0.9, "share_of_ideal": 0.9,
            "num_errors": 0, "turns_kept": {"num_turns": 10, "num_kept": 9, "share": kept}}


def results(own: dict[str, Any], third_party: dict[str, Any]) -> dict[str, Any]:
    return {"modes": ["own", "third-party"], "own": own, "third_party": third_party,
            "rates": {"main_rps": 20.0, "hot_rps": 25.0}, "kv": None}


OWN = {"shared_prefix": {"round_robin": figures(400, 900, 0.70), APPROX: figures(110, 300, 0.85),
                         EXACT: figures(100, 250, 0.90)},
       "multi_turn": {"round_robin": figures(300, 700, 0.5, 0.25), EXACT: figures(80, 200, 0.8,
                                                                                  0.95)}}
THIRD = {"shared_prefix": {"round_robin": figures(400, 900, 0.70),
                           APPROX: figures(105, 300, 0.80)},
         "multi_turn": {APPROX: figures(100, 200, 0.78, 0.9)}}


def test_pairs_compared_where_both_modes_ran() -> None:
    compared = comparison(results(OWN, THIRD))
    assert [(r["third_party"], r["own"]) for r in compared["shared-prefix"]] == [
        ("round_robin", "round_robin"), (APPROX, APPROX), (APPROX, EXACT)]
    assert [(r["third_party"], r["own"]) for r in compared["multi-turn"]] == [(APPROX, EXACT)]
    row = compared["shared-prefix"][2]
    assert row["ratio"] == pytest.approx({"ttft_p90_ms": 1.05, "ttft_p99_ms": 1.2,
                                          "cached_fraction": 0.8 / 0.9})
    assert compared["multi-turn"][0]["turns_kept"] == {"own": 0.95, "third_party": 0.9}


def test_targets_judge_approx_against_the_own_fleets_best() -> None:
    document = results(OWN, THIRD)
    document["comparison"] = comparison(document)
    judged = {(v["target"], v["label"]): v["is_met"] for v in all_verdicts(document)
              if v["mode"] == "third-party / own"}
    label = f"shared-prefix: {APPROX} / own {EXACT}"
    assert judged[("third-party / own TTFT p90", label)] is True  # 1.05 <= 1.10
    assert judged[("third-party / own TTFT p99", label)] is False  # 1.20
    assert judged[("third-party / own cached share", label)] is False  # 0.89 < 0.90
    assert len(judged) == 6  # 3 targets x 2 workloads, one pair each


def test_without_the_exact_index_approx_is_judged_against_approx() -> None:
    own = {"shared_prefix": {APPROX: figures(100, 300, 0.85)}}
    document = results(own, {"shared_prefix": {APPROX: figures(100, 300, 0.85)}})
    labels = {v["label"] for v in all_verdicts(document) if v["mode"] == "third-party / own"}
    assert labels == {f"shared-prefix: {APPROX} / own {APPROX}"}


def test_one_mode_has_no_comparison() -> None:
    document = {**results(OWN, THIRD), "modes": ["own"]}
    del document["third_party"]
    assert comparison(document) == {}
    assert comparison_tables({}) == []


def test_the_document_shows_both_modes_and_the_side_by_side_table() -> None:
    document = results(OWN, THIRD)
    document["comparison"] = comparison(document)
    document["targets"] = all_verdicts(document)
    text = document_markdown(document)
    assert text.startswith("Targets: third-party within 10 % of own-fleet")
    assert "### Own fleet" in text and "### Third-party fleet" in text
    assert f"| shared-prefix | {APPROX} | {EXACT} | 100 / 105 (**1.05**) |" in text


@pytest.mark.parametrize(("mode", "own", "third_party", "expected"), [
    pytest.param("both", "round_robin", "prefix_affinity:approx",
                 {"own": ["round_robin"], "third-party": ["prefix_affinity:approx"]}, id="both"),
    pytest.param("third-party", "nonsense", "round_robin", {"third-party": ["round_robin"]},
                 id="own-profiles-unused"),
    pytest.param("both", "round_robin", "prefix_affinity:exact", "no exact index",
                 id="exact-refused-in-third-party"),
    pytest.param("own", "prefix_affinity:exact", "", {"own": ["prefix_affinity:exact"]},
                 id="exact-fine-in-own"),
    pytest.param("own", "fastest", "", "unknown own profile: fastest", id="unknown"),
])
def test_chosen_profiles(mode: str, own: str, third_party: str,
                         expected: dict[str, list[str]] | str) -> None:
    chosen = chosen_profiles(mode, own, third_party)
    if isinstance(expected, str):
        assert isinstance(chosen, str) and expected in chosen
    else:
        assert chosen == expected
