"""The gateway's fleet snapshots: taken for a reference time up to SNAPSHOT_REUSE_S old, each
backend's state rebuilt only when it changed, and nothing routing sees is older or staler than
with a snapshot taken at the request's own time."""

from __future__ import annotations

import random

from backends.fleet.registry import Backend, BackendRegistry
from gateway.router import SNAPSHOT_FRESH_S, SNAPSHOT_REUSE_S, RoutePlan, Router
from routing import ApproxPrefixIndex, ExactPrefixIndex, profile_by_name, schedule
from routing.plugin import Cycle
from routing.profile import build_profile
from routing.types import RouteRequest

MODEL = "m"


def fleet(num_backends: int, observed_s: float) -> tuple[Router, list[Backend]]:
    backends = [Backend(f"w{i}", f"http://127.0.0.1:{19000 + i}", frozenset({MODEL}),
                        source="heartbeat") for i in range(num_backends)]
    for b in backends:
        b.load_observed(observed_s)
    router = Router(BackendRegistry(backends), profile_by_name("least_load"),
                    ExactPrefixIndex(), ApproxPrefixIndex(), {})
    return router, backends


def request() -> RouteRequest:
    return RouteRequest(model=MODEL, num_prompt_tokens=100)


def test_unchanged_backends_keep_their_state_changed_ones_are_rebuilt() -> None:
    router, backends = fleet(4, observed_s=99.0)
    first = router.snapshot(request(), 100.0)
    router.started(backends[2], RoutePlan(request(), reserved_tokens=200))
    second = router.snapshot(request(), 100.0 + SNAPSHOT_REUSE_S / 2)
    assert second.now_s == first.now_s == 100.0, "the same reference time"
    assert [a is b for a, b in zip(first.backends, second.backends, strict=True)] == [
        True, True, False, True]
    assert second.backends[2].num_in_flight == 1, "the dispatch is seen at once"
    # least_load now avoids w2 at once
    ranked = schedule(request(), second, router.profile, 100.0 + SNAPSHOT_REUSE_S / 2,
                      random.Random(0))
    assert ranked[-1].backend == "w2"


def test_a_new_reference_time_once_the_old_one_is_too_old() -> None:
    router, _ = fleet(2, observed_s=99.0)
    first = router.snapshot(request(), 100.0)
    later = router.snapshot(request(), 100.0 + SNAPSHOT_REUSE_S * 1.5)
    assert later.now_s == 100.0 + SNAPSHOT_REUSE_S * 1.5
    assert later.backends[0] is not first.backends[0]
    assert abs(later.backends[0].age_s - (first.backends[0].age_s + SNAPSHOT_REUSE_S * 1.5)) < 1e-9


def test_staleness_is_judged_at_the_request_time_not_the_reference_time() -> None:
    """A backend whose load turns 5 s old between the reference time and now is stale now;
    one whose heartbeat came after the reference time is fresh, with its exact age."""
    router, backends = fleet(2, observed_s=95.02)  # 4.98 s old at the reference time
    router.snapshot(request(), 100.0)
    now_s = 100.0 + SNAPSHOT_REUSE_S * 0.8  # 5.02 s old now
    backends[1].load_observed(100.01)  # a heartbeat after the reference time
    snapshot = router.snapshot(request(), now_s)
    assert snapshot.now_s == 100.0
    cycle = Cycle(request(), snapshot, now_s)
    assert cycle.is_stale(snapshot.backends[0])
    assert not cycle.is_stale(snapshot.backends[1])
    assert abs(snapshot.backends[1].age_s + (now_s - snapshot.now_s) - (now_s - 100.01)) < 1e-9


def test_the_router_keeps_time_by_the_clocks_it_is_given() -> None:
    """The virtual-time simulator runs this router on its own clock: a dispatch is stamped
    with it, the approximate index's claim with the wall clock given, and the books follow."""
    backend = Backend("w0", "http://127.0.0.1:19000", frozenset({MODEL}), source="heartbeat")
    now = {"s": 7.0}
    approx = ApproxPrefixIndex()
    router = Router(BackendRegistry([backend]), profile_by_name("least_load"),
                    ExactPrefixIndex(), approx, {}, clock=lambda: now["s"],
                    wall_clock=lambda: 1000 + now["s"])
    plan = router.describe(MODEL, {"prompt": "x" * 200}, "t")
    backend.load_observed(8.0)  # figures taken after the dispatch below
    router.started(backend, plan)
    assert plan.sent_s == 7.0
    assert approx.match(plan.request.char_hashes, 1007.0).num_blocks == {"w0": 3}
    now["s"] = 9.0
    router.first_token(backend, plan)
    assert backend.num_started_since_load == 1  # sent at 7 s, before the 8 s figures
    router.finished(backend, plan, had_first_token=True)
    assert (backend.num_in_flight, backend.num_finished_since_load) == (0, 1)


def test_admission_and_routing_take_one_decision() -> None:
    """``route`` (SLO admission's call) decides on admission's snapshot and keeps the ranking;
    ``rank`` hands that same ranking out once while the snapshot is fresh, and decides again
    for a later call, a snapshot taken since (a queued request's dispatch) or an old one."""
    now = {"s": 100.0}
    router, backends = fleet(4, observed_s=99.9)
    router._clock = lambda: now["s"]
    plan = RoutePlan(request(), reserved_tokens=200)
    snapshot = router.snapshot(plan.request, now["s"])
    scored = router.route(plan, snapshot, now["s"])
    assert [b.name for b in scored] == ["w0", "w1", "w2", "w3"], "a small fleet: all of it"
    kept = plan.ranked
    assert kept is not None and len(kept) == 2 and kept[0][0] in backends
    first = router.rank(plan)
    assert [id(r) for _, r in first] == [id(r) for _, r in kept], "the same decision"
    again = router.rank(plan)
    assert [r.backend for _, r in again] and not any(
        a is b for (_, a), (_, b) in zip(again, kept, strict=False)), "decided again"
    for change in ("snapshot", "age"):
        router.route(plan, snapshot, now["s"])
        if change == "snapshot":
            plan.snapshot = router.snapshot(plan.request, now["s"])
        else:
            now["s"] += SNAPSHOT_FRESH_S * 2
        ranked = router.rank(plan)
        assert not any(a is b for (_, a), (_, b) in zip(ranked, kept, strict=False)), change


def test_in_a_large_fleet_admission_predicts_over_the_shortlist() -> None:
    router, _ = fleet(64, observed_s=99.9)
    router.profile = build_profile(
        {"scorers": [{"type": "queue"}], "shortlist": {"above": 16, "sampled": 8}}, "big")
    plan = RoutePlan(request(), reserved_tokens=200)
    snapshot = router.snapshot(plan.request, 100.0)
    scored = router.route(plan, snapshot, 100.0)
    assert 1 <= len(scored) <= 8 and {b.name for b in scored} <= {b.name for b in
                                                                   snapshot.backends}
    assert plan.ranked is not None and plan.ranked[0][1].backend in {b.name for b in scored}
