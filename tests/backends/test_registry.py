"""Weighted round-robin selection and health bookkeeping of the backend registry."""

from __future__ import annotations

from collections import Counter

import pytest

from backends.registry import Backend, BackendRegistry


def _backend(name: str, models: tuple[str, ...] = ("m",), weight: float = 1.0) -> Backend:
    return Backend(name=name, url=f"http://{name}:8000", models=frozenset(models), weight=weight)


@pytest.mark.parametrize(
    ("weights", "num_picks", "expected"),
    [
        pytest.param({"a": 1, "b": 1}, 10, {"a": 5, "b": 5}, id="equal-weights-alternate"),
        pytest.param({"a": 3, "b": 1}, 8, {"a": 6, "b": 2}, id="weighted-3-to-1"),
        pytest.param({"a": 1, "b": 1, "c": 2}, 8, {"a": 2, "b": 2, "c": 4}, id="three-backends"),
    ],
)
def test_weighted_round_robin_shares(
    weights: dict[str, float], num_picks: int, expected: dict[str, int]
) -> None:
    registry = BackendRegistry([_backend(n, weight=w) for n, w in weights.items()])
    picks = Counter(registry.candidates("m")[0].name for _ in range(num_picks))
    assert dict(picks) == expected


def test_candidates_put_the_pick_first_and_every_other_healthy_backend_after() -> None:
    registry = BackendRegistry([_backend("a"), _backend("b"), _backend("c")])
    for _ in range(6):
        names = [b.name for b in registry.candidates("m")]
        assert sorted(names) == ["a", "b", "c"]
    first_picks = [registry.candidates("m")[0].name for _ in range(3)]
    assert sorted(first_picks) == ["a", "b", "c"]


def test_unhealthy_backends_are_skipped_until_marked_healthy() -> None:
    a, b = _backend("a"), _backend("b")
    registry = BackendRegistry([a, b])
    a.mark_failure("connection refused")
    assert [x.name for x in registry.candidates("m")] == ["b"]
    assert registry.num_healthy() == 1
    assert a.num_consecutive_failures == 1
    a.mark_success()
    assert {x.name for x in registry.candidates("m")} == {"a", "b"}
    assert a.num_consecutive_failures == 0


def test_models_are_routed_only_to_backends_serving_them() -> None:
    registry = BackendRegistry([_backend("a", ("x",)), _backend("b", ("x", "y"))])
    assert registry.models() == ["x", "y"]
    assert [b.name for b in registry.candidates("y")] == ["b"]
    assert registry.candidates("z") == []
    assert not registry.serves("z")
