"""Shortlist: a large fleet's decision scores the deepest prefix holders and a random draw, and
falls back to the whole fleet when those cannot decide."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from routing.profiles import profile_by_name
from routing.scheduler import schedule
from routing.shortlist import Shortlist
from routing.types import BackendState, FleetSnapshot
from tests.routing.builders import NOW_S, backend, request, snapshot


def fleet(num_backends: int, matched: dict[str, int] | None = None,
          **fields: object) -> FleetSnapshot:
    return snapshot(*(backend(f"w{i:02d}", **fields) for i in range(num_backends)),
                    matched=matched)


def names(backends: list[BackendState]) -> list[str]:
    return [b.name for b in backends]


def test_applies_only_above_its_size() -> None:
    shortlist = Shortlist(above=16)
    assert not shortlist.applies(fleet(16))
    assert shortlist.applies(fleet(17))


def test_holds_the_deepest_holders_and_a_draw_of_distinct_backends() -> None:
    matched = {"w03": 10, "w40": 200, "w41": 150, "w50": 5, "w60": 180, "w07": 1}
    shortlist = Shortlist(above=16, holders=4, sampled=8)
    for seed in range(50):
        chosen = names(shortlist.candidates(fleet(64, matched), random.Random(seed)))
        assert len(chosen) == len(set(chosen)), "no backend twice"
        assert {"w40", "w41", "w60", "w03"} <= set(chosen), "the four deepest holders"
        assert 8 + 4 - 2 <= len(chosen) <= 12  # the draw may hit a holder
        drawn = [n for n in chosen if n not in {"w40", "w41", "w60", "w03"}]
        assert len(drawn) >= 6


def test_every_backend_is_drawn_about_equally_often() -> None:
    shortlist = Shortlist(above=16, holders=0, sampled=8)
    rng = random.Random(1)
    counts = Counter(n for _ in range(4_000)
                     for n in names(shortlist.candidates(fleet(64), rng)))
    assert len(counts) == 64
    expected = 4_000 * 8 / 64  # 500
    assert min(counts.values()) > 0.8 * expected
    assert max(counts.values()) < 1.2 * expected


def test_a_prefix_many_hold_equally_deep_is_spread_over_all_of_them() -> None:
    matched = {f"w{i:02d}": 100 for i in range(0, 64, 2)}  # 32 holders, same depth
    shortlist = Shortlist(above=16, holders=4, sampled=0)
    rng = random.Random(2)
    counts = Counter(n for _ in range(2_000)
                     for n in names(shortlist.candidates(fleet(64, matched), rng)))
    assert set(counts) == set(matched)
    assert min(counts.values()) > 0.5 * 2_000 * 4 / 32


def test_same_seed_same_shortlist() -> None:
    matched = {f"w{i:02d}": 100 for i in range(20)}
    shortlist = Shortlist()
    first = names(shortlist.candidates(fleet(64, matched), random.Random(5)))
    assert first == names(shortlist.candidates(fleet(64, matched), random.Random(5)))


def test_prefix_affinity_shortlists_large_fleets_only() -> None:
    profile = profile_by_name("prefix_affinity")
    assert profile.shortlist is not None
    small = fleet(16)
    everyone = schedule(request(), small, profile, NOW_S, random.Random(0))
    assert len(everyone) == 16, "16 backends: all scored"
    large = schedule(request(), fleet(64), profile, NOW_S, random.Random(0))
    assert 0 < len(large) <= 12, "64 backends: the shortlist only"


def test_a_large_fleet_still_goes_to_the_holder() -> None:
    matched = {"w37": 60}  # 60 of the prompt's 63 blocks (1,000 tokens / 16)
    ranked = schedule(request(1000, block_hashes=tuple(range(63))), fleet(64, matched),
                      profile_by_name("prefix_affinity"), NOW_S, random.Random(3))
    assert ranked[0].backend == "w37"
    assert ranked[0].expected_cached_tokens == 960


@pytest.mark.parametrize(
    ("holder_fields", "why"),
    [
        pytest.param({"num_waiting": 500}, "saturated: a soft filter passes none of them",
                     id="saturated"),
        pytest.param({"age_s": 60.0}, "stale: a soft filter passes none of them", id="stale"),
        pytest.param({"is_healthy": False}, "unhealthy: a hard filter leaves nobody",
                     id="unhealthy"),
    ],
)
def test_a_shortlist_that_cannot_decide_widens_to_the_whole_fleet(
        holder_fields: dict[str, object], why: str) -> None:
    """The shortlist is the holders alone (``sampled: 0``); all fail a filter, so the decision
    is taken over the whole fleet and goes to a backend that passes."""
    base = profile_by_name("prefix_affinity")
    profile = replace(base, shortlist=Shortlist(above=16, holders=4, sampled=0))
    holders = [f"w{i:02d}" for i in range(4)]
    backends = [backend(n, **holder_fields) if n in holders else backend(n)  # type: ignore[arg-type]
                for n in (f"w{i:02d}" for i in range(40))]
    snap = snapshot(*backends, matched=dict.fromkeys(holders, 60))
    ranked = schedule(request(1000, block_hashes=tuple(range(63))), snap, profile, NOW_S,
                      random.Random(4))
    assert ranked, why
    assert ranked[0].backend not in holders, why
    assert len(ranked) == 36, "every backend that passes was scored"


def test_positions_find_the_same_holders_and_a_wrong_mapping_is_not_trusted() -> None:
    matched = {"w03": 10, "w40": 200, "w41": 150, "w60": 180, "w07": 1, "w99": 300}
    without = fleet(64, matched)
    positions = {b.name: i for i, b in enumerate(without.backends)}
    with_positions = replace(without, positions=positions)
    shortlist = Shortlist()
    for seed in range(20):
        expected = names(shortlist.candidates(without, random.Random(seed)))
        assert names(shortlist.candidates(with_positions, random.Random(seed))) == expected
        assert "w99" not in expected, "a holder the snapshot does not have"
    holders_only = Shortlist(holders=4, sampled=0)
    # the four deepest are w99 (not in this snapshot), w40, w60, w41
    assert sorted(names(holders_only.candidates(with_positions, random.Random(0)))) == [
        "w40", "w41", "w60"]
    # a mapping that does not fit the snapshot (w40 -> w41's index, w41 -> past the end, or a
    # snapshot cut down without updating it) is not trusted: the holders are found by a scan
    wrong = replace(without, positions={**positions, "w40": positions["w41"],
                                        "w41": len(positions) + 5})
    assert sorted(names(holders_only.candidates(wrong, random.Random(0)))) == [
        "w40", "w41", "w60"]
    cut = replace(with_positions, backends=with_positions.backends[1::2])  # odd ones only
    assert sorted(names(holders_only.candidates(cut, random.Random(0)))) == ["w41"]
