"""Prefix and load scorers: one score in [0, 1] per candidate; stale is loaded, never idle."""

from __future__ import annotations

import pytest

from routing.plugin import Scorer
from routing.plugins.scorers import (
    InFlightTokensScorer,
    KvUsageScorer,
    PrefixScorer,
    QueueScorer,
    worst_if_stale,
)
from routing.types import BackendState, RouteRequest
from tests.routing.builders import backend, chain, cycle, request

STALE = 60.0  # age_s well past the 5 s bound


def scores(scorer: Scorer, *backends: BackendState, req: RouteRequest | None = None,
           **snapshot_fields: object) -> list[float]:
    c = cycle(*backends, req=req, **snapshot_fields)  # type: ignore[arg-type]
    return [round(s, 3) for s in scorer.score(c, list(backends))]


@pytest.mark.parametrize(
    ("req", "matched", "is_exact", "expected"),
    [
        pytest.param(request(block_hashes=chain(8)), {"a": 8, "b": 2}, True, [1.0, 0.25, 0.0],
                     id="exact-fraction-of-token-blocks"),
        pytest.param(request(char_hashes=chain(4)), {"b": 1}, False, [0.0, 0.25, 0.0],
                     id="approx-fraction-of-char-blocks"),
        pytest.param(request(), {"a": 3}, True, [0.0, 0.0, 0.0], id="request-without-blocks"),
        pytest.param(request(block_hashes=chain(8)), {}, True, [0.0, 0.0, 0.0],
                     id="nobody-holds-it"),
    ],
)
def test_prefix_scorer(req: RouteRequest, matched: dict[str, int], is_exact: bool,
                       expected: list[float]) -> None:
    got = scores(PrefixScorer(), backend("a"), backend("b"), backend("c"), req=req,
                 matched=matched, is_exact=is_exact)
    assert got == expected


@pytest.mark.parametrize(
    ("backends", "expected"),
    [
        pytest.param([backend("a"), backend("b")], [1.0, 1.0], id="all-idle"),
        pytest.param([backend("a", num_waiting=1), backend("b", num_in_flight=3)], [1.0, 0.5],
                     id="waiting-plus-in-flight"),
        pytest.param([backend("a", num_waiting=1), backend("b", num_waiting=3)], [1.0, 0.5],
                     id="least-loaded-scores-one"),
        pytest.param([backend("a", num_waiting=7), backend("b", age_s=STALE)], [1.0, 1.0],
                     id="stale-as-loaded-as-the-worst"),
        pytest.param([backend("a", num_waiting=7), backend("b", age_s=STALE, num_in_flight=1)],
                     [1.0, 0.889], id="stale-worst-plus-own-in-flight"),
        pytest.param([backend("a", age_s=STALE, num_in_flight=1),
                      backend("b", age_s=STALE, num_waiting=3)], [0.8, 1.0],
                     id="all-stale-told-apart-by-in-flight"),
    ],
)
def test_queue_scorer(backends: list[BackendState], expected: list[float]) -> None:
    assert scores(QueueScorer(), *backends) == expected


@pytest.mark.parametrize(
    ("backends", "expected"),
    [
        pytest.param([backend("a", kv_usage=0.2), backend("b", kv_usage=0.9)], [0.8, 0.1],
                     id="free-kv"),
        pytest.param([backend("a", kv_usage=0.7), backend("b", kv_usage=0.0, age_s=STALE)],
                     [0.3, 0.3], id="stale-never-looks-empty"),
    ],
)
def test_kv_usage_scorer(backends: list[BackendState], expected: list[float]) -> None:
    assert scores(KvUsageScorer(), *backends) == expected


@pytest.mark.parametrize(
    ("backends", "expected"),
    [
        pytest.param([backend("a"), backend("b")], [1.0, 1.0], id="none-in-flight"),
        pytest.param([backend("a", num_in_flight_tokens=500),
                      backend("b", num_in_flight_tokens=2000), backend("c")],
                     [0.75, 0.0, 1.0], id="normalised-by-the-most"),
    ],
)
def test_in_flight_tokens_scorer(backends: list[BackendState], expected: list[float]) -> None:
    assert scores(InFlightTokensScorer(), *backends) == expected


def test_worst_if_stale_leaves_fresh_figures_alone() -> None:
    fresh = [backend("a"), backend("b")]
    observed = [1.0, 2.0]
    assert worst_if_stale(cycle(*fresh), fresh, observed) is observed
    mixed = [backend("a"), backend("b", age_s=STALE), backend("c")]
    assert worst_if_stale(cycle(*mixed), mixed, [1.0, 0.0, 5.0]) == [1.0, 5.0, 5.0]
