"""The TTFT cost model: backlog plus uncached prompt over prefill speed; stale is not idle."""

from __future__ import annotations

import pytest

from routing.plugins.ttft import TtftScorer
from routing.types import BackendState
from tests.routing.builders import backend, cycle, profile, request

STALE = 60.0


@pytest.mark.parametrize(
    ("b", "matched_blocks", "expected_s"),
    [
        pytest.param(backend("x"), 0, 0.2, id="idle-recomputes-all"),
        pytest.param(backend("x"), 100, 0.04, id="idle-holder-prefills-the-rest"),
        pytest.param(backend("x"), 1000, 0.0, id="fully-cached"),
        pytest.param(backend("x", num_queued_prefill_tokens=3000), 0, 0.5,
                     id="engine-backlog"),
        pytest.param(backend("x", num_in_flight_prompt_tokens=3000), 0, 0.5,
                     id="gateway-backlog"),
        pytest.param(backend("x", num_queued_prefill_tokens=3000,
                             num_in_flight_prompt_tokens=1000), 0, 0.5,
                     id="fresh-takes-the-larger-backlog"),
        pytest.param(backend("x", profile=profile(prefill_tokens_per_s=20_000)), 0, 0.1,
                     id="advertised-speed"),
        pytest.param(backend("x", age_s=STALE, num_in_flight_prompt_tokens=1000), 0, 0.4,
                     id="stale-worst-backlog-plus-own"),
    ],
)
def test_estimates(b: BackendState, matched_blocks: int, expected_s: float) -> None:
    other = backend("o", num_queued_prefill_tokens=1000)
    c = cycle(b, other, req=request(2000), matched={"x": matched_blocks}, block_tokens=16)
    estimates = TtftScorer(default_prefill_tokens_per_s=10_000).estimates_s(c, [b, other])
    assert estimates[0] == pytest.approx(expected_s)


def test_quickest_scores_one_and_others_by_ratio() -> None:
    fast, slow = backend("fast"), backend("slow", num_queued_prefill_tokens=9900)
    c = cycle(fast, slow, req=request(100))
    scores = TtftScorer(floor_s=0.01).score(c, [fast, slow])
    assert scores == pytest.approx([1.0, (0.01 + 0.01) / (1.0 + 0.01)])


def test_overloaded_holder_is_slower_than_idle_recompute() -> None:
    holder = backend("holder", num_queued_prefill_tokens=20_000)
    idle = backend("idle")
    c = cycle(holder, idle, req=request(3000), matched={"holder": 180})
    holder_s, idle_s = TtftScorer().estimates_s(c, [holder, idle])
    assert holder_s > idle_s


@pytest.mark.parametrize(
    "settings",
    [
        pytest.param({"default_prefill_tokens_per_s": 0}, id="zero-speed"),
        pytest.param({"floor_s": -1}, id="negative-floor"),
    ],
)
def test_settings_are_checked(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        TtftScorer(**settings)
