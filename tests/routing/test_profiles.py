"""The named profiles: baselines behave as named; prefix_affinity follows the cache while it
pays and spreads a hot prefix once its holder's queue costs more than recomputing it."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from routing.profile import SchedulingProfile, build_profile
from routing.profiles import DEFAULT_PROFILE, PROFILES, profile_by_name
from routing.scheduler import schedule
from routing.types import BackendProfile, FleetSnapshot, Ranked, RouteRequest
from tests.routing.builders import NOW_S, backend, chain, request, snapshot

ALL = [pytest.param(name, id=name) for name in PROFILES]
STALE = 60.0


def decide(name_or_profile: str | SchedulingProfile, snap: FleetSnapshot,
           req: RouteRequest | None = None, seed: int = 0) -> list[Ranked]:
    profile = (profile_by_name(name_or_profile) if isinstance(name_or_profile, str)
               else name_or_profile)
    return schedule(req or request(), snap, profile, NOW_S, random.Random(seed))


def test_default_is_prefix_affinity() -> None:
    assert DEFAULT_PROFILE == "prefix_affinity"
    assert profile_by_name().name == "prefix_affinity"


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown routing profile 'fastest'; known: round_robin"):
        profile_by_name("fastest")


@pytest.mark.parametrize("name", ALL)
def test_unhealthy_and_wrong_model_are_never_ranked(name: str) -> None:
    snap = snapshot(backend("sick", is_healthy=False), backend("other", models=frozenset({"x"})),
                    backend("busy", num_waiting=30, num_in_flight=20), backend("ok"))
    for seed in range(20):
        ranked = decide(name, snap, request(session_key=f"s{seed}"), seed=seed)
        assert {r.backend for r in ranked} <= {"busy", "ok"}


@pytest.mark.parametrize("name", ALL)
def test_stale_never_chosen_while_a_fresh_one_exists(name: str) -> None:
    # The stale backend's old figures look idle and it holds the whole prefix.
    stale = backend("stale", age_s=STALE)
    busy = backend("busy", num_waiting=40, num_in_flight=30, num_queued_prefill_tokens=50_000)
    snap = snapshot(stale, busy, matched={"stale": 60})
    for seed in range(20):
        req = request(1000, block_hashes=chain(62), session_key=f"k{seed}")
        assert [r.backend for r in decide(name, snap, req, seed=seed)] == ["busy"]


@pytest.mark.parametrize("name", ["least_load", "power_of_two", "prefix_affinity"])
def test_when_all_are_stale_old_idle_figures_are_not_trusted(name: str) -> None:
    # Both stale: the one whose old figures look idle has 6 requests in flight from this
    # gateway right now; the other looked busy long ago but has nothing in flight.
    looked_idle = backend("looked_idle", age_s=STALE, num_in_flight=6,
                          num_in_flight_prompt_tokens=6000)
    looked_busy = backend("looked_busy", age_s=STALE, num_waiting=30,
                          num_queued_prefill_tokens=30_000)
    ranked = decide(name, snapshot(looked_idle, looked_busy))
    assert [r.backend for r in ranked] == ["looked_busy", "looked_idle"]


def test_round_robin_rotates() -> None:
    profile = profile_by_name("round_robin")
    snap = snapshot(backend("a"), backend("b"), backend("c"))
    assert [decide(profile, snap)[0].backend for _ in range(6)] == ["a", "b", "c"] * 2


def test_random_spreads_and_repeats_with_the_seed() -> None:
    snap = snapshot(*(backend(f"w{i}") for i in range(4)))
    firsts = [decide("random", snap, seed=s)[0].backend for s in range(200)]
    assert all(n > 25 for n in Counter(firsts).values())
    assert firsts == [decide("random", snap, seed=s)[0].backend for s in range(200)]


def test_least_load_takes_the_shortest_queue() -> None:
    snap = snapshot(backend("a", num_waiting=3), backend("b", num_in_flight=1),
                    backend("c", num_waiting=2, num_in_flight=2))
    assert [r.backend for r in decide("least_load", snap)] == ["b", "a", "c"]


def test_power_of_two_never_takes_the_most_loaded() -> None:
    snap = snapshot(*(backend(f"w{i}", num_in_flight=i) for i in range(4)))
    firsts = Counter(decide("power_of_two", snap, seed=s)[0].backend for s in range(300))
    assert "w3" not in firsts
    assert firsts["w0"] == max(firsts.values())


def test_session_sticks_whatever_the_load_and_falls_back_to_least_load() -> None:
    names = [f"w{i}" for i in range(5)]
    calm = snapshot(*(backend(n) for n in names))
    stormy = snapshot(*(backend(n, num_in_flight=7 * i) for i, n in enumerate(names)))
    for key in ("alice", "bob", "carol"):
        req = request(session_key=key)
        assert decide("session", calm, req)[0].backend == decide("session", stormy, req)[0].backend
    assert decide("session", stormy, request(session_key=None))[0].backend == "w0"


def test_session_moves_only_the_leaving_backends_sessions() -> None:
    names = [f"w{i}" for i in range(5)]
    keys = [f"user-{i}" for i in range(300)]
    full = snapshot(*(backend(n) for n in names))
    less = snapshot(*(backend(n) for n in names if n != "w2"))
    before = {k: decide("session", full, request(session_key=k))[0].backend for k in keys}
    after = {k: decide("session", less, request(session_key=k))[0].backend for k in keys}
    assert {k for k in keys if before[k] != after[k]} == {k for k in keys if before[k] == "w2"}


# --- prefix_affinity ------------------------------------------------------------------------

PROMPT_TOKENS = 3000
SHARED_BLOCKS = 175  # a 2,800-token system prompt, 200 tokens of question


def hot_request() -> RouteRequest:
    return request(PROMPT_TOKENS, block_hashes=chain(PROMPT_TOKENS // 16))


@pytest.mark.parametrize(
    ("holder_backlog_tokens", "expected"),
    [
        pytest.param(0, "holder", id="idle-holder"),
        pytest.param(1500, "holder", id="lightly-loaded-holder-still-quicker"),
        pytest.param(20_000, "idle", id="overloaded-holder-loses-to-recompute"),
    ],
)
def test_prefix_affinity_weighs_the_cache_against_the_queue(holder_backlog_tokens: int,
                                                           expected: str) -> None:
    snap = snapshot(backend("holder", num_queued_prefill_tokens=holder_backlog_tokens,
                            num_in_flight=holder_backlog_tokens // PROMPT_TOKENS),
                    backend("idle"), matched={"holder": SHARED_BLOCKS})
    ranked = decide("prefix_affinity", snap, hot_request())
    assert ranked[0].backend == expected
    assert {r.backend: r.expected_cached_tokens for r in ranked} == {"holder": 2800, "idle": 0}
    assert [name for name, _ in ranked[0].reasons] == ["ttft", "prefix", "queue", "cache_room"]


@pytest.mark.parametrize(
    ("holder_in_flight", "expected"),
    [
        pytest.param(30, "holder", id="busy-holder-keeps-its-prefix"),
        pytest.param(40, "other", id="holder-twice-and-32-over-the-least-is-left-out"),
    ],
)
def test_a_holder_far_busier_than_the_rest_is_left_out(holder_in_flight: int,
                                                       expected: str) -> None:
    """Cache hits add almost no prefill backlog, so only the balance guard stops a hot
    prefix's holder from taking every request however many it already runs."""
    snap = snapshot(backend("holder", num_in_flight=holder_in_flight),
                    backend("other", num_in_flight=5), matched={"holder": SHARED_BLOCKS})
    assert decide("prefix_affinity", snap, hot_request())[0].backend == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("prefix_affinity", {"roomy"}, id="default-places-by-room"),
        pytest.param("prefix_affinity_no_room", {"full", "roomy"}, id="no-room-tie-at-random"),
    ],
)
def test_a_prompt_nobody_holds_goes_where_it_evicts_least(name: str, expected: set[str]) -> None:
    kv = BackendProfile(num_kv_blocks=1000, block_size=16)
    full = backend("full", profile=kv, num_prefix_kv_blocks=900)
    roomy = backend("roomy", profile=kv, num_prefix_kv_blocks=300)
    picks = {decide(name, snapshot(full, roomy), hot_request(), seed=seed)[0].backend
             for seed in range(20)}
    assert picks == expected


@dataclass
class SimBackend:
    backlog_tokens: float = 0.0
    holds_prefix: bool = False


def hot_prefix_run(profile: SchedulingProfile, arrivals_per_step: int, num_steps: int = 150,
                   step_s: float = 0.05, prefill_tokens_per_s: float = 10_000
                   ) -> tuple[int, float, float]:
    """A virtual-time fleet of 4 engines and one hot prefix. Returns how many engines ended up
    holding it, the worst prefill backlog (s) and the cached-token fraction."""
    engines = {f"w{i}": SimBackend(holds_prefix=i == 0) for i in range(4)}
    rng = random.Random(0)
    worst_backlog_s = num_cached = num_tokens = 0.0
    for _ in range(num_steps):
        for _ in range(arrivals_per_step):
            snap = snapshot(
                *(backend(name, num_queued_prefill_tokens=int(e.backlog_tokens),
                          num_in_flight=int(e.backlog_tokens // PROMPT_TOKENS))
                  for name, e in engines.items()),
                matched={name: SHARED_BLOCKS for name, e in engines.items() if e.holds_prefix})
            chosen = engines[schedule(hot_request(), snap, profile, NOW_S, rng)[0].backend]
            cached = SHARED_BLOCKS * 16 if chosen.holds_prefix else 0
            chosen.backlog_tokens += PROMPT_TOKENS - cached
            chosen.holds_prefix = True
            num_cached += cached
            num_tokens += PROMPT_TOKENS
        for e in engines.values():
            worst_backlog_s = max(worst_backlog_s, e.backlog_tokens / prefill_tokens_per_s)
            e.backlog_tokens = max(0.0, e.backlog_tokens - prefill_tokens_per_s * step_s)
    num_holders = sum(e.holds_prefix for e in engines.values())
    return num_holders, worst_backlog_s, num_cached / num_tokens


def test_hot_prefix_spreads_instead_of_pinning_one_engine() -> None:
    # 4 requests per 50 ms need 800 uncached tokens; one engine prefills 500: it cannot keep up.
    holders, worst_backlog_s, cached = hot_prefix_run(profile_by_name("prefix_affinity"), 4)
    assert holders >= 2
    assert worst_backlog_s < 0.6
    assert cached > 0.85
    pinned = build_profile({"scorers": [{"type": "prefix"}]})  # affinity without load
    holders, worst_backlog_s, _ = hot_prefix_run(pinned, 4)
    assert holders == 1
    assert worst_backlog_s > 3.0


def test_hot_prefix_stays_on_one_engine_while_it_keeps_up() -> None:
    holders, worst_backlog_s, cached = hot_prefix_run(profile_by_name("prefix_affinity"), 2)
    assert holders == 1
    assert cached > 0.9
    assert worst_backlog_s < 0.1


@pytest.mark.parametrize("name", ALL)
def test_same_seed_same_ranking(name: str) -> None:
    snap = snapshot(*(backend(f"w{i}", num_in_flight=i % 2) for i in range(6)),
                    matched={"w1": 3, "w4": 3})
    req = request(2000, block_hashes=chain(125), session_key="k")
    first = [decide(profile_by_name(name), snap, req, seed=s) for s in range(10)]
    again = [decide(profile_by_name(name), snap, req, seed=s) for s in range(10)]
    assert first == again


def test_every_profile_builds_fresh_instances() -> None:
    for name in PROFILES:
        assert profile_by_name(name) is not profile_by_name(name)
    assert isinstance(profile_by_name("least_load").scorers[0].scorer,
                      type(profile_by_name("power_of_two").scorers[0].scorer))
