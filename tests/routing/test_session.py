"""Rendezvous hashing: sticky per key, minimal movement when a backend leaves, least-load
without a key."""

from __future__ import annotations

from collections import Counter

import pytest

from routing.plugins.session import SessionScorer, rendezvous_scores
from tests.routing.builders import backend, cycle, request

NAMES = [f"w{i}" for i in range(8)]
KEYS = [f"user-{i}" for i in range(2000)]


def winner(key: str, names: list[str]) -> str:
    scores = rendezvous_scores(key, names, [1.0] * len(names))
    return names[scores.index(max(scores))]


def test_same_key_same_backend_whatever_the_order() -> None:
    for key in KEYS[:50]:
        assert winner(key, NAMES) == winner(key, list(reversed(NAMES)))


def test_keys_spread_over_backends() -> None:
    counts = Counter(winner(key, NAMES) for key in KEYS)
    assert set(counts) == set(NAMES)
    assert max(counts.values()) < 2 * len(KEYS) / len(NAMES)


def test_only_the_leaving_backends_sessions_move() -> None:
    before = {key: winner(key, NAMES) for key in KEYS}
    remaining = [n for n in NAMES if n != "w3"]
    after = {key: winner(key, remaining) for key in KEYS}
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "w3"}


def test_a_joining_backend_takes_sessions_only_for_itself() -> None:
    before = {key: winner(key, NAMES) for key in KEYS}
    after = {key: winner(key, [*NAMES, "w8"]) for key in KEYS}
    assert all(after[key] in (before[key], "w8") for key in KEYS)


@pytest.mark.parametrize(
    ("weights", "heavy_share"),
    [
        pytest.param([1.0, 1.0], (0.4, 0.6), id="equal-weights-even"),
        pytest.param([3.0, 1.0], (0.68, 0.82), id="weight-three-takes-three-quarters"),
    ],
)
def test_weights_set_the_share(weights: list[float], heavy_share: tuple[float, float]) -> None:
    names = ["heavy", "light"]
    wins = sum(1 for key in KEYS
               if max(range(2), key=lambda i: rendezvous_scores(key, names, weights)[i]) == 0)
    low, high = heavy_share
    assert low < wins / len(KEYS) < high


def test_scores_are_normalised_to_the_winner() -> None:
    scores = rendezvous_scores("k", NAMES, [1.0] * len(NAMES))
    assert max(scores) == 1.0
    assert all(0.0 < s <= 1.0 for s in scores)


def test_scorer_without_key_falls_back_to_least_load() -> None:
    busy, idle = backend("busy", num_in_flight=3), backend("idle")
    c = cycle(busy, idle, req=request(session_key=None))
    assert SessionScorer().score(c, [busy, idle]) == [0.25, 1.0]


def test_scorer_with_key_ignores_load() -> None:
    busy, idle = backend("busy", num_in_flight=30), backend("idle")
    key = next(k for k in KEYS if winner(k, ["busy", "idle"]) == "busy")
    c = cycle(busy, idle, req=request(session_key=key))
    scores = SessionScorer().score(c, [busy, idle])
    assert scores[0] == 1.0 > scores[1]
