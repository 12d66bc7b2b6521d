"""The gateway's per-request decision alone, in process: no sockets, no Redis, no aiohttp.

What one request costs the gateway between its parsed body and its upstream write, and after
its answer: ``Router.describe``, ``SloAdmission.admit`` (with routing's one decision,
``Router.route``), ``Router.rank``, ``started``, then ``first_token`` / ``finished`` and
``SloAdmission.finished`` as the proxy calls them. Requests are kept ``--in-flight`` at once
(the oldest finishes as a new one starts), over ``--backends`` backends counted from this
gateway's own books (third-party mode), with the shipped tiers and routing profile. The
overhead benchmark's live figures (`bench.overhead`) include this; this is the part a change
to routing or admission moves, measured without the noise of the loopback fleet::

    python -m bench.overhead.decision                      # 4 and 64 backends
    python -m bench.overhead.decision --backends 4 --profile   # cProfile, top functions
    valgrind --tool=callgrind python -m bench.overhead.decision --requests 2000 --repeats 1

Prints µs per request per stage (the median of ``--repeats`` runs), and the whole cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from admission.tiers import DEFAULT_TIERS
from admission.waiting_room import SloAdmission
from backends.fleet.registry import Backend, BackendRegistry
from gateway.app import make_router
from gateway.keystore import Limits, Tenant
from gateway.router import RoutePlan, Router
from gateway.settings import RoutingSettings
from routing.types import BackendProfile

MODEL = "bench-model"
STAGES = ("describe", "admit", "rank", "started", "finished")


@dataclass(slots=True)
class Decisions:
    """A router and SLO admission over ``num_backends`` backends of ``max_batch`` slots."""

    slo: SloAdmission
    router: Router
    tenant: Tenant

    @classmethod
    def build(cls, num_backends: int, *, max_batch: int = 64) -> Decisions:
        backends = [Backend(name=f"b{i}", url=f"http://127.0.0.1:{9000 + i}",
                            models=frozenset({MODEL}), profile=BackendProfile(max_batch=max_batch))
                    for i in range(num_backends)]
        for backend in backends:
            backend.load_source = "books"  # a listed engine without /metrics: the gateway's books
        router = make_router(RoutingSettings(), BackendRegistry(backends))
        tenant = Tenant(id="t", name="t", tier="standard", models=(MODEL,), limits=Limits(),
                        enabled=True, created_at=0.0)
        return cls(SloAdmission(DEFAULT_TIERS, router), router, tenant)


def _body(index: int) -> dict[str, object]:
    """The overhead bench's request shape: a short chat, 16 output tokens, a few prompts."""
    return {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": f"Say hello, number {index % 8}."}]}


async def _run(decisions: Decisions, num_requests: int, in_flight: int
               ) -> dict[str, float]:
    """µs per request of each stage over ``num_requests`` decisions."""
    slo = decisions.slo
    router = decisions.router
    tier = slo.tier_for(decisions.tenant.tier, None, None)
    spent = dict.fromkeys(STAGES, 0.0)
    clock = time.perf_counter
    running: deque[tuple[object, RoutePlan, Backend]] = deque()
    bodies = [_body(i) for i in range(8)]
    for index in range(num_requests):
        t0 = clock()
        plan = router.describe(MODEL, bodies[index % 8], decisions.tenant.id)
        plan.needs_free_slot = True
        t1 = clock()
        admitted = await slo.admit(tier, decisions.tenant, plan, f"r{index}")
        if admitted.snapshot is not None:
            plan.snapshot, plan.snapshot_taken_s = admitted.snapshot, admitted.snapshot_taken_s
        t2 = clock()
        ranked = router.rank(plan, max_ranked=2)
        t3 = clock()
        backend, choice = ranked[0]
        router.started(backend, plan, choice.expected_cached_tokens)
        t4 = clock()
        running.append((admitted, plan, backend))
        spent["describe"] += t1 - t0
        spent["admit"] += t2 - t1
        spent["rank"] += t3 - t2
        spent["started"] += t4 - t3
        if len(running) > in_flight:
            t5 = clock()
            done, done_plan, done_backend = running.popleft()
            router.finished(done_backend, done_plan, had_first_token=False)
            slo.finished(done, done_plan.request.num_prompt_tokens + 16)  # type: ignore[arg-type]
            spent["finished"] += clock() - t5
    return {stage: 1e6 * s / num_requests for stage, s in spent.items()}


def measure(num_backends: int, num_requests: int, in_flight: int, repeats: int
            ) -> dict[str, float]:
    """Medians over ``repeats`` fresh runs of µs per request by stage, with "total"."""
    runs = []
    for _ in range(repeats):
        decisions = Decisions.build(num_backends)
        asyncio.run(_run(decisions, num_requests // 10, in_flight))  # warm caches and code
        decisions = Decisions.build(num_backends)
        runs.append(asyncio.run(_run(decisions, num_requests, in_flight)))
    medians = {stage: statistics.median(r[stage] for r in runs) for stage in STAGES}
    medians["total"] = statistics.median(sum(r.values()) for r in runs)
    return medians


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", type=int, nargs="*", default=[4, 64])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile one run per backend count: the top functions by own time")
    args = parser.parse_args(argv)
    for num_backends in args.backends:
        if args.profile:
            decisions = Decisions.build(num_backends)
            profiler = cProfile.Profile()
            profiler.enable()
            asyncio.run(_run(decisions, args.requests, args.in_flight))
            profiler.disable()
            print(f"-- {num_backends} backends, {args.requests} requests --")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
            continue
        figures = measure(num_backends, args.requests, args.in_flight, args.repeats)
        cells = "  ".join(f"{stage} {figures[stage]:6.1f}" for stage in (*STAGES, "total"))
        print(f"{num_backends:4d} backends, µs per request: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
