"""ExactPrefixIndex: KV events in, leading-block matches out, bounded per backend."""

from __future__ import annotations

import random

import pytest

from routing.index_exact import ExactPrefixIndex
from tests.routing.builders import chain

CHAIN = chain(10)  # hashes 1..10


def index_with(*events: tuple[str, str, tuple[int, ...]], **settings: int) -> ExactPrefixIndex:
    index = ExactPrefixIndex(**settings)
    for backend, kind, hashes in events:
        index.apply(backend, kind, hashes)  # type: ignore[arg-type]
    return index


@pytest.mark.parametrize(
    ("events", "query", "expected"),
    [
        pytest.param([("a", "stored", CHAIN[:6])], CHAIN, {"a": 6}, id="stored-prefix"),
        pytest.param([("a", "stored", CHAIN[:6]), ("b", "stored", CHAIN[:3]),
                      ("c", "stored", CHAIN)], CHAIN, {"a": 6, "b": 3, "c": 10},
                     id="holders-at-different-depths"),
        pytest.param([("a", "stored", CHAIN[:6])], CHAIN[:4], {"a": 4},
                     id="request-shorter-than-held"),
        pytest.param([("a", "stored", CHAIN[1:6])], CHAIN, {}, id="first-block-missing"),
        pytest.param([("a", "stored", CHAIN[:6]), ("a", "removed", (CHAIN[2],))], CHAIN,
                     {"a": 2}, id="removed-block-ends-the-prefix"),
        pytest.param([("a", "stored", CHAIN[:6]), ("b", "stored", CHAIN[:6]),
                      ("a", "cleared", ())], CHAIN, {"b": 6}, id="cleared"),
        pytest.param([("a", "stored", CHAIN[:6]), ("a", "stored", CHAIN[:6])], CHAIN,
                     {"a": 6}, id="stored-twice-is-idempotent"),
        pytest.param([("a", "removed", CHAIN)], CHAIN, {}, id="removed-unknown-is-ignored"),
        pytest.param([("a", "stored", CHAIN)], (), {}, id="empty-request"),
        pytest.param([("a", "stored", (*CHAIN[:3], 99, 100)), ("b", "stored", CHAIN)],
                     (*CHAIN[:3], 99, 100), {"a": 5, "b": 3}, id="diverging-chains"),
    ],
)
def test_event_replay_then_match(events: list[tuple[str, str, tuple[int, ...]]],
                                 query: tuple[int, ...], expected: dict[str, int]) -> None:
    match = index_with(*events, block_size=16).match(query)
    assert dict(match.num_blocks) == expected
    assert match.block_tokens == 16
    assert match.is_exact


def test_unknown_event_kind_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown KV event kind 'evicted'"):
        ExactPrefixIndex().apply("a", "evicted", CHAIN)  # type: ignore[arg-type]


def test_load_snapshot_replaces_what_was_known() -> None:
    index = index_with(("a", "stored", CHAIN))
    index.load_snapshot("a", CHAIN[:2])
    assert dict(index.match(CHAIN).num_blocks) == {"a": 2}
    assert index.num_hashes("a") == 2
    assert len(index) == 2


def test_remove_backend_forgets_it_and_its_hashes() -> None:
    index = index_with(("a", "stored", CHAIN), ("b", "stored", CHAIN[:3]))
    index.remove_backend("a")
    index.remove_backend("never-seen")
    assert index.backends() == ["b"]
    assert len(index) == 3
    assert dict(index.match(CHAIN).num_blocks) == {"b": 3}


def test_memory_bound_per_backend() -> None:
    index = index_with(("a", "stored", CHAIN), ("b", "stored", CHAIN[:2]),
                       max_hashes_per_backend=4)
    assert index.num_hashes("a") == 4
    assert index.num_hashes("b") == 2
    assert len(index) <= 6
    matched = index.match(CHAIN).num_blocks
    assert matched["b"] == 2
    assert matched.get("a", 0) <= 4


@pytest.mark.parametrize("bad", [pytest.param({"block_size": 0}, id="block-size"),
                                 pytest.param({"max_hashes_per_backend": 0}, id="bound")])
def test_settings_are_checked(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        ExactPrefixIndex(**bad)


def reference_match(resident: dict[str, set[int]], query: tuple[int, ...]) -> dict[str, int]:
    result = {}
    for backend, hashes in resident.items():
        depth = 0
        while depth < len(query) and query[depth] in hashes:
            depth += 1
        if depth:
            result[backend] = depth
    return result


def test_random_event_replay_agrees_with_a_naive_model() -> None:
    rng = random.Random(5)
    chains = [(*chain(4, start=1), *chain(20, start=100 * k)) for k in range(1, 5)]
    index = ExactPrefixIndex()
    resident: dict[str, set[int]] = {}
    for _ in range(600):
        backend = rng.choice("abcde")
        hashes = rng.choice(chains)[:rng.randint(1, 24)]
        kind = rng.choices(["stored", "removed", "cleared", "snapshot"], [6, 3, 1, 1])[0]
        if kind == "stored":
            index.apply(backend, "stored", hashes)
            resident.setdefault(backend, set()).update(hashes)
        elif kind == "removed":
            part = hashes[rng.randrange(len(hashes)):]
            index.apply(backend, "removed", part)
            resident.get(backend, set()).difference_update(part)
        elif kind == "cleared":
            index.apply(backend, "cleared")
            resident.pop(backend, None)
        else:
            index.load_snapshot(backend, hashes)
            resident[backend] = set(hashes)
        for query in chains:
            assert dict(index.match(query).num_blocks) == reference_match(resident, query)
    assert len(index) == len(set().union(*resident.values()))


def test_forgetting_everything_leaves_nothing_behind() -> None:
    index = index_with(("a", "stored", CHAIN), ("b", "stored", CHAIN[:5]),
                       ("c", "stored", CHAIN[3:]))
    for backend in ("a", "b", "c"):
        index.remove_backend(backend)
    assert len(index) == 0
    assert index.backends() == []
    assert index._interned == {}  # interned holder sets are released with their last hash
    assert index._num_refs == {}
