"""What a response teaches the router about a backend's claims goes to ``on_lesson`` (which
shares it with the other replicas) only when it changed that backend's claim lifetime."""

from __future__ import annotations

from backends.fleet.registry import Backend, BackendRegistry
from gateway.router import RoutePlan, Router
from routing import ApproxPrefixIndex, ExactPrefixIndex, profile_by_name
from routing.types import RouteRequest

MODEL = "m"


def test_only_a_changed_lifetime_is_a_lesson() -> None:
    backend = Backend("w0", "http://127.0.0.1:19000", frozenset({MODEL}))
    router = Router(BackendRegistry([backend]), profile_by_name("prefix_affinity"),
                    ExactPrefixIndex(), ApproxPrefixIndex(ttl_s=600), {})
    lessons: list[tuple[str, float, bool]] = []
    router.on_lesson = lambda *lesson: lessons.append(lesson)

    def respond(claim_age_s: float, num_cached_tokens: int) -> None:
        plan = RoutePlan(RouteRequest(model=MODEL, num_prompt_tokens=400), reserved_tokens=500,
                         expected_cached_tokens=320, claim_age_s=claim_age_s)
        router.learn(backend, plan, num_prompt_tokens=400, num_cached_tokens=num_cached_tokens)

    respond(30.0, num_cached_tokens=0)  # a miss on a 30 s old claim: the lifetime is 30 s
    assert lessons == [("w0", 30.0, False)]
    assert router.approx_index.ttl_for("w0") == 30.0
    respond(40.0, num_cached_tokens=0)  # older than the lifetime already: nothing new
    respond(5.0, num_cached_tokens=320)  # a hit well inside it: nothing new
    respond(0.5, num_cached_tokens=0)  # a miss too young to say anything
    assert len(lessons) == 1
    respond(28.0, num_cached_tokens=320)  # a hit near the lifetime: it grows
    assert lessons[-1] == ("w0", 28.0, True)
    assert router.approx_index.ttl_for("w0") == 37.5
