"""schedule(): filters, scorers, picker; the pick first, retries by score; reasons recorded."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from random import Random

import pytest

from routing.plugin import Cycle, Picker
from routing.plugins.filters import FreshFilter, HealthyFilter, ModelFilter, NotSaturatedFilter
from routing.plugins.pickers import MaxScorePicker, RoundRobinPicker
from routing.profile import SchedulingProfile, WeightedScorer, build_profile
from routing.scheduler import schedule
from routing.types import BackendState, FleetSnapshot, Ranked
from tests.routing.builders import NOW_S, backend, request, snapshot


class Fixed:
    """A scorer returning given scores by backend name (an in-memory plugin for the seam)."""

    def __init__(self, by_name: dict[str, float]) -> None:
        self.by_name = by_name

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        return [self.by_name.get(b.name, 0.0) for b in candidates]


class PickIndex:
    def __init__(self, index: int) -> None:
        self.index = index

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        return self.index


def profile_of(*scorers: tuple[str, dict[str, float], float],
               picker: Picker | None = None) -> SchedulingProfile:
    return SchedulingProfile(
        "test", (ModelFilter(), HealthyFilter()),
        tuple(WeightedScorer(name, Fixed(scores), weight) for name, scores, weight in scorers),
        picker or MaxScorePicker())


FLEET = snapshot(backend("a"), backend("b"), backend("c"), backend("d"))


def run(profile: SchedulingProfile, snap: FleetSnapshot = FLEET, seed: int = 0,
        max_ranked: int | None = None) -> list[Ranked]:
    return schedule(request(), snap, profile, NOW_S, random.Random(seed), max_ranked=max_ranked)


def order(ranked: list[Ranked]) -> list[str]:
    return [r.backend for r in ranked]


@pytest.mark.parametrize(
    ("scores", "picker", "expected"),
    [
        pytest.param({"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.3}, None, ["b", "c", "d", "a"],
                     id="best-first-then-by-score"),
        pytest.param({"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.3}, PickIndex(3),
                     ["d", "b", "c", "a"], id="the-pick-first-even-if-not-best"),
        pytest.param({}, PickIndex(2), ["c", "d", "a", "b"],
                     id="ties-in-candidate-order-after-the-pick"),
    ],
)
def test_order(scores: dict[str, float], picker: Picker | None, expected: list[str]) -> None:
    assert order(run(profile_of(("s", scores, 1.0), picker=picker))) == expected


def test_round_robin_retries_walk_the_rotation() -> None:
    profile = SchedulingProfile("rr", (), (), RoundRobinPicker())
    assert [order(run(profile)) for _ in range(3)] == [
        ["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"]]


def test_reasons_are_clamped_weighted_and_sum_to_the_score() -> None:
    profile = profile_of(("first", {"a": 1.7, "b": -0.3, "c": math.nan, "d": 0.5}, 2.0),
                         ("second", {"a": 0.25, "b": 1.0, "c": 1.0}, 1.0))
    by_name = {r.backend: r for r in run(profile)}
    assert by_name["a"].reasons == (("first", 2.0), ("second", 0.25))
    assert by_name["b"].reasons == (("first", 0.0), ("second", 1.0))
    assert by_name["c"].reasons == (("first", 0.0), ("second", 1.0))
    assert by_name["d"].reasons == (("first", 1.0), ("second", 0.0))
    for r in by_name.values():
        assert r.score == pytest.approx(sum(weighted for _, weighted in r.reasons))


def test_no_scorers_no_reasons() -> None:
    ranked = run(SchedulingProfile("bare", (), (), MaxScorePicker()))
    assert {r.reasons for r in ranked} == {()}
    assert {r.score for r in ranked} == {0.0}


def test_expected_cached_tokens_from_the_match() -> None:
    snap = snapshot(backend("a"), backend("b"), backend("c"), matched={"a": 10, "b": 100},
                    block_tokens=16)
    ranked = schedule(request(1000), snap, profile_of(), NOW_S, random.Random(0))
    assert {r.backend: r.expected_cached_tokens for r in ranked} == {"a": 160, "b": 1000, "c": 0}


@pytest.mark.parametrize(
    "backends",
    [
        pytest.param([backend("a", models=frozenset({"x"}))], id="wrong-model"),
        pytest.param([backend("a", is_healthy=False)], id="all-unhealthy"),
        pytest.param([], id="empty-fleet"),
    ],
)
def test_nobody_eligible_is_an_empty_list(backends: list[BackendState]) -> None:
    assert run(profile_of(), snapshot(*backends)) == []


def test_max_ranked_keeps_the_pick_and_the_best_retries() -> None:
    profile = profile_of(("s", {"a": 0.1, "b": 0.9, "c": 0.5, "d": 0.3}, 1.0),
                         picker=PickIndex(0))
    assert order(run(profile, max_ranked=2)) == ["a", "b"]
    with pytest.raises(ValueError, match="max_ranked"):
        run(profile, max_ranked=0)


def test_ranked_items_carry_score_reasons_and_expected_tokens() -> None:
    profile = profile_of(("s", {"a": 0.5}, 1.0))
    snap = snapshot(backend("a"), matched={"a": 2})
    (item,) = schedule(request(1000), snap, profile, NOW_S, random.Random(0))
    assert item == Ranked("a", 0.5, (("s", 0.5),), 32)


def test_a_scorer_returning_the_wrong_count_is_an_error() -> None:
    class Short:
        def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
            return [1.0]

    profile = SchedulingProfile("bad", (), (WeightedScorer("short", Short(), 1.0),),
                                MaxScorePicker())
    with pytest.raises(ValueError, match="'short' returned 1 scores for 4 candidates"):
        run(profile)


def test_same_seed_same_decisions_and_the_snapshot_is_untouched() -> None:
    config = {"scorers": [{"type": "queue"}], "picker": {"type": "softmax", "temperature": 1}}
    snap = snapshot(*(backend(f"w{i}", num_in_flight=i % 3) for i in range(8)))
    before = repr(snap)
    first = [order(run(build_profile(config), snap, seed=s)) for s in range(20)]
    second = [order(run(build_profile(config), snap, seed=s)) for s in range(20)]
    assert first == second
    assert len({tuple(o) for o in first}) > 1, "the seed matters"
    assert repr(snap) == before


def test_a_picker_out_of_range_is_an_error() -> None:
    with pytest.raises(ValueError, match="picked 9 of 4 candidates"):
        run(profile_of(picker=PickIndex(9)))


def test_a_soft_filter_passing_nobody_keeps_everyone_a_hard_one_nobody() -> None:
    soft = SchedulingProfile("soft", (ModelFilter(), FreshFilter(),
                                      NotSaturatedFilter(max_waiting=4)), (), MaxScorePicker())
    stale = snapshot(backend("a", age_s=9.0), backend("b", age_s=8.0, num_waiting=9))
    assert sorted(order(run(soft, stale))) == ["a", "b"]
    # the soft filters still drop what fails them while someone passes
    mixed = snapshot(backend("a", age_s=9.0), backend("b", num_waiting=9), backend("c"))
    assert order(run(soft, mixed)) == ["c"]
    hard = SchedulingProfile("hard", (ModelFilter(), HealthyFilter(), FreshFilter()), (),
                             MaxScorePicker())
    assert run(hard, snapshot(backend("a", is_healthy=False, age_s=9.0))) == []
