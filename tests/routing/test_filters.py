"""Filters keep the backends that pass; which ones are soft (schedule() keeps everyone when a
soft one passes nobody: tests/routing/test_scheduler.py)."""

from __future__ import annotations

import pytest

from routing.plugin import Filter
from routing.plugins.filters import (
    BalancedFilter,
    FreshFilter,
    HealthyFilter,
    ModelFilter,
    NotSaturatedFilter,
    ResourcesFilter,
)
from routing.types import BackendState, RouteRequest
from tests.routing.builders import backend, cycle, profile, request


def names(backends: list[BackendState]) -> list[str]:
    return [b.name for b in backends]


CASES = [
    pytest.param(ModelFilter(), [backend("a"), backend("b", models=frozenset({"other"}))],
                 request(), ["a"], id="model-served"),
    pytest.param(ModelFilter(), [backend("b", models=frozenset({"other"}))], request(), [],
                 id="model-nobody-serves-it"),
    pytest.param(HealthyFilter(), [backend("a", is_healthy=False), backend("b")], request(),
                 ["b"], id="healthy"),
    pytest.param(HealthyFilter(), [backend("a", is_healthy=False)], request(), [],
                 id="healthy-none-left"),
    pytest.param(FreshFilter(), [backend("a", age_s=9.0), backend("b", age_s=1.0)], request(),
                 ["b"], id="fresh-drops-stale"),
    pytest.param(FreshFilter(), [backend("a", age_s=9.0), backend("b", age_s=7.0)], request(),
                 [], id="fresh-none-fresh"),
    pytest.param(NotSaturatedFilter(max_waiting=4),
                 [backend("a", num_waiting=5), backend("b", num_waiting=4)], request(), ["b"],
                 id="saturated-by-queue"),
    pytest.param(NotSaturatedFilter(max_kv_usage=0.9),
                 [backend("a", kv_usage=0.95), backend("b", kv_usage=0.5)], request(), ["b"],
                 id="saturated-by-kv"),
    pytest.param(NotSaturatedFilter(max_waiting=4),
                 [backend("a", num_waiting=9), backend("b", num_waiting=8)], request(),
                 [], id="all-saturated"),
    pytest.param(NotSaturatedFilter(),
                 [backend("a", age_s=9.0), backend("b", num_waiting=10)], request(), ["b"],
                 id="stale-counts-as-saturated"),
    pytest.param(ResourcesFilter(),
                 [backend("a", profile=profile(max_context_tokens=1000)),
                  backend("b", profile=profile(max_context_tokens=1100)), backend("c")],
                 request(1000, max_tokens=100), ["b", "c"], id="context-fits-prompt-and-output"),
    pytest.param(ResourcesFilter(),
                 [backend("a", profile=profile(num_kv_blocks=62, block_size=16)),
                  backend("b", profile=profile(num_kv_blocks=63, block_size=16))],
                 request(1000), ["b"], id="kv-capacity-in-blocks"),
    pytest.param(ResourcesFilter(),
                 [backend("a", profile=profile(max_context_tokens=10))],
                 request(1000, is_exact_count=True), [], id="nobody-fits"),
    # An estimate from characters: nobody fits by it, so the engines, which count, decide.
    pytest.param(ResourcesFilter(),
                 [backend("a", profile=profile(max_context_tokens=10)),
                  backend("b", profile=profile(num_kv_blocks=1, block_size=16))],
                 request(1000), ["a", "b"], id="nobody-fits-an-estimate"),
    pytest.param(ResourcesFilter(),
                 [backend("a", profile=profile(max_context_tokens=10)),
                  backend("b", profile=profile(max_context_tokens=2000))],
                 request(1000), ["b"], id="an-estimate-still-prefers-who-fits"),
    pytest.param(BalancedFilter(max_ratio=2, max_excess=16),
                 [backend("a", num_in_flight=4), backend("b", num_in_flight=20),
                  backend("c", num_in_flight=21), backend("d", num_in_flight=10, num_waiting=11)],
                 request(), ["a", "b"], id="balanced-drops-twice-and-16-over-least"),
    pytest.param(BalancedFilter(max_ratio=2, max_excess=16),
                 [backend("a", num_in_flight=30), backend("b", num_in_flight=60)], request(),
                 ["a", "b"], id="balanced-ratio-alone-keeps"),
    pytest.param(BalancedFilter(max_ratio=2, max_excess=16),
                 [backend("a", num_in_flight=1), backend("b", num_in_flight=9, num_waiting=30,
                                                         age_s=9.0)],
                 request(), ["a", "b"], id="balanced-stale-waiting-unknown"),
]


@pytest.mark.parametrize(("plugin", "backends", "req", "kept"), CASES)
def test_filter_keeps(plugin: Filter, backends: list[BackendState], req: RouteRequest,
                      kept: list[str]) -> None:
    c = cycle(*backends, req=req)
    candidates = list(backends)
    assert names(plugin.filter(c, candidates)) == kept
    assert candidates == list(backends), "the input list is not changed"


def test_only_the_load_filters_are_soft() -> None:
    soft = {type(f).__name__ for f in (ModelFilter(), HealthyFilter(), FreshFilter(),
                                       NotSaturatedFilter(), ResourcesFilter(),
                                       BalancedFilter()) if f.soft}
    assert soft == {"FreshFilter", "NotSaturatedFilter", "BalancedFilter"}


def test_fresh_filter_counts_the_snapshot_age() -> None:
    b = backend("a", age_s=4.0)
    c = cycle(b, backend("b", age_s=0.0), now_s=102.0)  # snapshot taken 2 s ago
    assert names(FreshFilter().filter(c, list(c.snapshot.backends))) == ["b"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        pytest.param({"max_waiting": -1}, "max_waiting must be >= 0", id="negative-queue"),
        pytest.param({"max_kv_usage": 1.5}, "max_kv_usage must be <= 1", id="kv-over-one"),
    ],
)
def test_not_saturated_settings_are_checked(settings: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NotSaturatedFilter(**settings)  # type: ignore[arg-type]
