"""ApproxPrefixIndex: routing history in, prefix matches out; TTL, LRU bound, replica merge."""

from __future__ import annotations

import random

import pytest

from routing.index_approx import ApproxPrefixIndex
from tests.routing.builders import chain

CHAIN = chain(8)  # hashes 1..8
OTHER = (*CHAIN[:2], 50, 51, 52)  # shares two blocks with CHAIN


def matched(index: ApproxPrefixIndex, query: tuple[int, ...], now_s: float) -> dict[str, int]:
    return dict(index.match(query, now_s).num_blocks)


@pytest.mark.parametrize(
    ("records", "query", "expected"),
    [
        pytest.param([(CHAIN, "a")], CHAIN, {"a": 8}, id="whole-chain"),
        pytest.param([(CHAIN[:3], "a")], CHAIN, {"a": 3}, id="held-prefix"),
        pytest.param([(CHAIN, "a")], CHAIN[:5], {"a": 5}, id="shorter-request"),
        pytest.param([(CHAIN, "a"), (OTHER, "b")], OTHER, {"a": 2, "b": 5},
                     id="shared-then-diverging"),
        pytest.param([(CHAIN, "a")], (99, *CHAIN), {}, id="different-root"),
        pytest.param([(CHAIN, "a")], (), {}, id="empty-request"),
    ],
)
def test_record_then_match(records: list[tuple[tuple[int, ...], str]], query: tuple[int, ...],
                           expected: dict[str, int]) -> None:
    index = ApproxPrefixIndex(block_tokens=12)
    for hashes, backend in records:
        index.record(hashes, backend, now_s=0.0)
    match = index.match(query, now_s=1.0)
    assert dict(match.num_blocks) == expected
    assert match.block_tokens == 12
    assert not match.is_exact


@pytest.mark.parametrize(
    ("now_s", "expected"),
    [
        pytest.param(106.0, {"a": 8, "b": 3}, id="both-live"),
        pytest.param(110.0, {"a": 8, "b": 3}, id="at-ttl-still-live"),
        pytest.param(112.0, {"b": 3}, id="a-expired"),
        pytest.param(120.0, {}, id="all-expired"),
    ],
)
def test_ttl_per_backend(now_s: float, expected: dict[str, int]) -> None:
    index = ApproxPrefixIndex(ttl_s=10.0)
    index.record(CHAIN, "a", now_s=100.0)
    index.record(CHAIN[:3], "b", now_s=105.0)
    assert matched(index, CHAIN, now_s) == expected


def test_recording_again_refreshes_the_ttl_and_prunes_expired_blocks() -> None:
    index = ApproxPrefixIndex(ttl_s=10.0)
    index.record(CHAIN, "a", now_s=0.0)
    index.record(CHAIN[:2], "a", now_s=8.0)
    assert matched(index, CHAIN, 15.0) == {"a": 2}
    index.record(OTHER[2:], "b", now_s=30.0)  # every block of "a" has expired by now
    assert len(index) == 3
    assert matched(index, CHAIN, 30.0) == {}


def test_lru_bound_trims_the_oldest_chain_from_its_tail() -> None:
    index = ApproxPrefixIndex(max_entries=10)
    index.record(CHAIN, "a", now_s=0.0)  # 8 blocks
    index.record(chain(4, start=100), "b", now_s=1.0)  # 4 more: 2 of a's must go
    assert len(index) == 10
    assert matched(index, CHAIN, 2.0) == {"a": 6}
    assert matched(index, chain(4, start=100), 2.0) == {"b": 4}


def test_remove_backend() -> None:
    index = ApproxPrefixIndex()
    index.record(CHAIN, "a", now_s=0.0)
    index.record(CHAIN[:3], "b", now_s=0.0)
    index.remove_backend("a")
    assert matched(index, CHAIN, 1.0) == {"b": 3}
    assert len(index) == 3


def test_replicas_converge_through_entries_and_merge() -> None:
    east, west = ApproxPrefixIndex(ttl_s=100.0), ApproxPrefixIndex(ttl_s=100.0)
    east.record(CHAIN, "a", now_s=10.0)
    east.record(OTHER, "b", now_s=11.0)
    west.record(CHAIN[:4], "c", now_s=12.0)
    west.record(CHAIN[:2], "a", now_s=20.0)  # newer than east's claim on those blocks
    east_entries, west_entries = east.entries(), west.entries()
    east.merge(west_entries)
    west.merge(east_entries)
    assert sorted(east.entries()) == sorted(west.entries())
    for query in (CHAIN, OTHER, CHAIN[:3]):
        assert matched(east, query, 30.0) == matched(west, query, 30.0)
    assert matched(east, CHAIN, 30.0) == {"a": 8, "b": 2, "c": 4}
    assert (CHAIN[0], "a", 20.0) in east.entries(), "the latest time per (hash, backend) wins"
    assert matched(east, CHAIN, 115.0) == {"a": 2}, "a's older claims expire first"


def test_entries_since_and_merge_skips_expired() -> None:
    source = ApproxPrefixIndex(ttl_s=10.0)
    source.record(CHAIN[:2], "a", now_s=0.0)
    source.record(OTHER[2:], "b", now_s=5.0)
    assert sorted(source.entries(since_s=1.0)) == sorted((h, "b", 5.0) for h in OTHER[2:])
    target = ApproxPrefixIndex(ttl_s=10.0)
    target.merge(source.entries(), now_s=12.0)
    assert sorted(target.entries()) == sorted((h, "b", 5.0) for h in OTHER[2:])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"ttl_s": 0}, "ttl_s must be > 0", id="ttl"),
        pytest.param({"max_entries": 0}, "max_entries must be >= 1", id="bound"),
        pytest.param({"block_tokens": 0}, "block_tokens must be >= 1", id="block-tokens"),
    ],
)
def test_settings_are_checked(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ApproxPrefixIndex(**settings)  # type: ignore[arg-type]


def test_random_history_agrees_with_a_naive_model() -> None:
    rng = random.Random(11)
    chains = [(*chain(3, start=1), *chain(12, start=100 * k)) for k in range(1, 5)]
    index = ApproxPrefixIndex(ttl_s=20.0)
    claims: dict[tuple[int, str], float] = {}
    for step in range(400):
        now_s = step * 0.5
        backend = rng.choice("abcd")
        hashes = rng.choice(chains)[:rng.randint(1, 15)]
        index.record(hashes, backend, now_s)
        claims.update({(h, backend): now_s for h in hashes})
        for query in chains:
            expected = {}
            for name in "abcd":
                depth = 0
                while (depth < len(query)
                       and claims.get((query[depth], name), -1e9) >= now_s - 20.0):
                    depth += 1
                if depth:
                    expected[name] = depth
            assert matched(index, query, now_s) == expected


def test_a_reported_miss_drops_that_backends_older_claims_at_once() -> None:
    index = ApproxPrefixIndex(ttl_s=600.0)
    index.record(CHAIN, "a", now_s=100.0)
    index.record(OTHER, "a", now_s=150.0)
    index.record(OTHER, "b", now_s=100.0)
    assert index.claim_s(CHAIN, 8, "a") == 100.0
    assert matched(index, CHAIN, 200.0) == {"a": 8, "b": 2}
    # "a" served CHAIN's claim (100 s old) with nothing cached: it evicted it, and everything
    # claimed before it too; "b" is not affected
    index.observe("a", claim_age_s=100.0, is_hit=False)
    assert index.ttl_for("a") == 100.0 and index.ttl_for("b") == 600.0
    assert matched(index, CHAIN, 201.0) == {"a": 2, "b": 2}  # a's shared blocks: from 150 s
    assert matched(index, OTHER, 201.0) == {"a": 5, "b": 5}
    assert matched(index, OTHER, 251.0) == {"b": 5}


def test_hits_near_the_lifetime_let_it_grow_back() -> None:
    index = ApproxPrefixIndex(ttl_s=600.0)
    index.observe("a", claim_age_s=40.0, is_hit=False)
    index.observe("a", claim_age_s=5.0, is_hit=True)  # young: says nothing new
    assert index.ttl_for("a") == 40.0
    index.observe("a", claim_age_s=36.0, is_hit=True)
    assert index.ttl_for("a") == 50.0
    for _ in range(40):
        index.observe("a", claim_age_s=index.ttl_for("a"), is_hit=True)
    assert index.ttl_for("a") == 600.0  # back to the configured lifetime, never beyond
    index.observe("a", claim_age_s=0.5, is_hit=False)  # young: maybe still in prefill there
    assert index.ttl_for("a") == 600.0
    index.observe("a", claim_age_s=1.0, is_hit=False)
    assert index.ttl_for("a") == 1.0  # the floor
    index.remove_backend("a")
    assert index.ttl_for("a") == 600.0


def test_learned_lifetimes_agree_with_a_naive_model() -> None:
    rng = random.Random(5)
    chains = [(*chain(3, start=1), *chain(12, start=100 * k)) for k in range(1, 5)]
    index = ApproxPrefixIndex(ttl_s=20.0)
    claims: dict[tuple[int, str], float] = {}
    for step in range(300):
        now_s = step * 0.5
        backend = rng.choice("abc")
        hashes = rng.choice(chains)[:rng.randint(1, 15)]
        index.record(hashes, backend, now_s)
        claims.update({(h, backend): now_s for h in hashes})
        if step % 7 == 0:
            index.observe(rng.choice("abc"), rng.uniform(0, 20), is_hit=rng.random() < 0.5)
        for query in chains:
            expected = {}
            for name in "abc":
                depth = 0
                while (depth < len(query) and claims.get((query[depth], name), -1e9)
                       >= now_s - index.ttl_for(name)):
                    depth += 1
                if depth:
                    expected[name] = depth
            assert matched(index, query, now_s) == expected


def test_observe_says_whether_the_lifetime_changed() -> None:
    index = ApproxPrefixIndex(ttl_s=100.0)
    assert not index.observe("a", claim_age_s=0.5, is_hit=False)  # too young: no evidence
    assert not index.observe("a", claim_age_s=10.0, is_hit=True)  # a hit far inside it
    assert index.observe("a", claim_age_s=10.0, is_hit=False)  # shortened to 10 s
    assert not index.observe("a", claim_age_s=20.0, is_hit=False)  # older than it: no change
    assert index.observe("a", claim_age_s=9.0, is_hit=True)  # near it: grows to 12.5 s
    assert index.ttl_for("a") == pytest.approx(12.5)
