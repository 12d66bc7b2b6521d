"""The TTFT cost model: backlog plus uncached prompt over prefill speed; stale is not idle."""

from __future__ import annotations

import pytest

from routing.plugins.ttft import TtftScorer
from routing.types import BackendState
from tests.routing.builders import NOW_S, backend, cycle, profile, request

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
        pytest.param(backend("x", age_s=0.2, num_queued_prefill_tokens=3000), 0, 0.3,
                     id="engine-backlog-drained-since-reported"),
        pytest.param(backend("x", age_s=0.5, num_queued_prefill_tokens=3000), 0, 0.2,
                     id="engine-backlog-gone-by-now"),
        pytest.param(backend("x", age_s=0.2, num_queued_prefill_tokens=3000,
                             num_in_flight_prompt_tokens=1500), 0, 0.35,
                     id="own-in-flight-over-the-drained-backlog"),
        pytest.param(backend("x", age_s=0.1, num_queued_prefill_tokens=3000,
                             profile=profile(prefill_tokens_per_s=20_000)), 0, 0.15,
                     id="drained-at-the-advertised-speed"),
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


def test_a_holder_whose_reported_backlog_has_drained_keeps_its_prefix() -> None:
    # A second-old heartbeat's 4,000 queued tokens are gone at 10k tokens/s: the holder of
    # 2,720 of the prompt's 2,900 tokens starts it first, not a backend recomputing all of it.
    holder = backend("holder", age_s=0.8, num_queued_prefill_tokens=4000)
    idle = backend("idle", age_s=0.8)
    c = cycle(holder, idle, req=request(2900), matched={"holder": 170})
    holder_s, idle_s = TtftScorer().estimates_s(c, [holder, idle])
    assert holder_s < idle_s
    # The same figure just reported still outweighs the cache.
    fresh = backend("holder", num_queued_prefill_tokens=4000)
    c = cycle(fresh, idle, req=request(2900), matched={"holder": 170})
    fresh_s, idle_s = TtftScorer().estimates_s(c, [fresh, idle])
    assert fresh_s > idle_s


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


def test_the_snapshots_own_age_drains_the_backlog_too() -> None:
    # Figures 0.1 s old in a snapshot taken 0.1 s before the decision: 0.2 s of draining.
    b = backend("x", age_s=0.1, num_queued_prefill_tokens=3000)
    c = cycle(b, req=request(1000), now_s=NOW_S + 0.1)
    assert TtftScorer().estimates_s(c, [b]) == pytest.approx([(1000 + 1000) / 10_000])
