"""The admission benchmark's workload and its send loop.

Ten tenants, ``t0`` sending ten times as much as each of ``t1`` .. ``t9``; a tier mix of 20%
interactive, 50% standard, 30% batch for every tenant. Each tenant has one API key per tier
(a key narrows its tenant's tier), so a request's tier is the key it is sent with. Tenants and
tiers are dealt from shuffled decks (19 tenant slots, 10 tier slots), so every stretch of 19
requests has the exact tenant mix and every 10 the exact tier mix, even in a short smoke run.
Prompts are random words (no shared prefixes), streamed, with a random ``max_tokens``.

The send loop is `bench.run.driver.Driver` (open loop at Poisson arrivals, or a closed loop),
through `bench.run.client.Client`. With a `RetryPolicy`, the clients it names answer a refusal
(429 or 503 with ``Retry-After``) as a well-behaved client would: they wait exactly the
``Retry-After`` and send the same request once more (`RetryingClient`). Example::

    workload = Workload(keys, Mix(), seed=1)
    records = drive(url, model, workload, rate_per_s=10, send_s=40, drain_s=5)
    workload.demanded_tokens[records[0].index]
    records, retries = drive_with_retries(url, model, workload, RetryPolicy(), rate_per_s=20,
                                          send_s=40, drain_s=5)
    retries[records[0].index].status   # the retry of request 0, if it was refused
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import uvloop

from bench.run.arrivals import sweep
from bench.run.client import Client, open_session
from bench.run.driver import CUT_OFF, DriveLimits, Driver, Scheduled
from bench.run.spec import Message, Record, RequestSpec, TenantSpec
from bench.run.text import text

TIERS = ("interactive", "standard", "batch")
HEAVY = "t0"
REFUSED_STATUSES = (429, 503)


@dataclass(frozen=True, slots=True)
class Mix:
    """Who sends what: tenant weights, tier weights and request sizes (tokens)."""

    num_tenants: int = 10
    heavy_weight: int = 10
    tier_weights: tuple[tuple[str, int], ...] = (("interactive", 2), ("standard", 5),
                                                 ("batch", 3))
    prompt_tokens: tuple[int, int] = (100, 400)
    max_tokens: tuple[int, int] = (16, 64)
    # Fair-share weights set on the tenants (the rest weigh 1): the heavy one pays for two.
    tenant_weights: tuple[tuple[str, float], ...] = ((HEAVY, 2.0),)

    @property
    def weights(self) -> dict[str, float]:
        return dict(self.tenant_weights)

    @property
    def tenants(self) -> list[str]:
        return [f"t{i}" for i in range(self.num_tenants)]

    def tenant_deck(self) -> list[str]:
        return [HEAVY] * self.heavy_weight + [t for t in self.tenants if t != HEAVY]

    def tier_deck(self) -> list[str]:
        return [tier for tier, weight in self.tier_weights for _ in range(weight)]


def _dealt(deck: list[str], rng: random.Random) -> Iterator[str]:
    while True:
        hand = list(deck)
        rng.shuffle(hand)
        yield from hand


@dataclass(slots=True)
class Workload:
    """Request specs for one run; remembers what each request demanded (prompt + max_tokens)."""

    keys: Mapping[str, Mapping[str, str]]  # tenant -> tier -> API key
    mix: Mix
    seed: int
    demanded_tokens: dict[int, int] = field(default_factory=dict)

    def specs(self) -> Iterator[RequestSpec]:
        rng = random.Random(f"{self.seed}:requests")
        tenants = _dealt(self.mix.tenant_deck(), random.Random(f"{self.seed}:tenants"))
        tiers = _dealt(self.mix.tier_deck(), random.Random(f"{self.seed}:tiers"))
        index = 0
        while True:
            tenant, tier = next(tenants), next(tiers)
            num_prompt = rng.randint(*self.mix.prompt_tokens)
            max_tokens = rng.randint(*self.mix.max_tokens)
            self.demanded_tokens[index] = num_prompt + max_tokens
            spec_tenant = TenantSpec(tenant, tier, self.keys[tenant][tier])
            yield RequestSpec(index=index, tenant=spec_tenant, max_tokens=max_tokens,
                              messages=({"role": "user", "content": text(num_prompt, rng)},))
            index += 1


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Which clients retry a refusal, and the bounds: a client is one tenant's key of a tier;
    of the ``tiers`` named, a seeded ``fraction`` of the clients retries. Each retries a
    refused request once, after exactly its ``Retry-After`` if that is at most ``max_wait_s``
    (a longer one is given up); retries still unanswered ``drain_s`` after the longest wait
    past the run's own drain are cut off. Example::

        RetryPolicy(tiers=("interactive",), fraction=0.5).is_retrying("t3", "interactive")
    """

    tiers: tuple[str, ...] = ("interactive", "standard")
    fraction: float = 1.0
    max_wait_s: float = 10.0
    drain_s: float = 5.0
    seed: int = 1

    def is_retrying(self, tenant: str, tier: str) -> bool:
        if tier not in self.tiers:
            return False
        return random.Random(f"{self.seed}:retry:{tenant}:{tier}").random() < self.fraction


class RetryingClient(Client):
    """A `Client` whose retrying clients (`RetryPolicy`) send a refused request once more,
    ``Retry-After`` seconds after the refusal; each retry's record is kept in ``retries`` by
    request index, with ``phase`` 1 and ``lag_s`` how late it left against that moment."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, model: str,
                 policy: RetryPolicy) -> None:
        super().__init__(session, base_url, model)
        self._policy = policy
        self.retries: dict[int, Record] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, spec: RequestSpec, record: Record, messages: Sequence[Message],
                   started_at: float) -> None:
        await super().send(spec, record, messages, started_at)
        wait_s = record.retry_after_s
        if (record.status in REFUSED_STATUSES and wait_s is not None
                and wait_s <= self._policy.max_wait_s
                and self._policy.is_retrying(spec.tenant.name, spec.tenant.tier)):
            task = asyncio.create_task(self._retry(spec, messages, wait_s, started_at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _retry(self, spec: RequestSpec, messages: Sequence[Message], wait_s: float,
                     started_at: float) -> None:
        due_s = time.perf_counter() - started_at + wait_s
        retry = Record(index=spec.index, tenant=spec.tenant.name, tier=spec.tenant.tier,
                       phase=1, is_stream=spec.is_stream, sent_at_s=due_s)
        self.retries[spec.index] = retry
        try:
            await asyncio.sleep(wait_s)
            await super().send(spec, retry, messages, started_at)
            retry.lag_s = retry.sent_at_s - due_s
        except asyncio.CancelledError:
            retry.status, retry.error = -1, CUT_OFF
            raise

    async def finish(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the retries in flight; cut off the rest."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=max(0.0, timeout_s))
        pending = list(self._tasks)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _run(url: str, model: str, limits: DriveLimits, schedule: Iterator[Scheduled]
               ) -> list[Record]:
    concurrency = limits.concurrency if limits.mode == "closed" else None
    async with open_session(concurrency, timeout_s=limits.deadline_s + 30) as session:
        return await Driver(Client(session, url, model), limits).run(schedule)


def _open_loop(workload: Workload, rate_per_s: float, send_s: float, drain_s: float
               ) -> tuple[Iterator[Scheduled], DriveLimits]:
    rng = random.Random(f"{workload.seed}:arrivals:{rate_per_s}")
    timeline = sweep([rate_per_s], send_s, "poisson", 1.0, rng)
    schedule = ((a.at_s, 0, spec) for a, spec in zip(timeline, workload.specs(), strict=False))
    limits = DriveLimits(mode="open", concurrency=None, max_requests=1_000_000,
                         send_window_s=send_s, deadline_s=send_s + drain_s)
    return schedule, limits


def drive(url: str, model: str, workload: Workload, *, rate_per_s: float, send_s: float,
          drain_s: float) -> list[Record]:
    """Open loop: Poisson arrivals at ``rate_per_s`` for ``send_s``, then up to ``drain_s``
    for the answers; whatever is still in flight then is cut off (status -1)."""
    schedule, limits = _open_loop(workload, rate_per_s, send_s, drain_s)
    return uvloop.run(_run(url, model, limits, schedule))


async def _run_retrying(url: str, model: str, limits: DriveLimits, policy: RetryPolicy,
                        schedule: Iterator[Scheduled]) -> tuple[list[Record], dict[int, Record]]:
    retries_s = policy.max_wait_s + policy.drain_s
    async with open_session(None, timeout_s=limits.deadline_s + retries_s + 30) as session:
        client = RetryingClient(session, url, model, policy)
        driver = Driver(client, limits)
        records = await driver.run(schedule)
        await client.finish(limits.deadline_s + retries_s - driver.elapsed_s())
        return records, client.retries


def drive_with_retries(url: str, model: str, workload: Workload, policy: RetryPolicy, *,
                       rate_per_s: float, send_s: float, drain_s: float
                       ) -> tuple[list[Record], dict[int, Record]]:
    """`drive`, with the retries of `RetryPolicy`: the first attempts' records, and each
    retry's record by request index. Retries run past the drain by at most the policy's
    ``max_wait_s + drain_s``."""
    schedule, limits = _open_loop(workload, rate_per_s, send_s, drain_s)
    return uvloop.run(_run_retrying(url, model, limits, policy, schedule))


def drive_closed(url: str, model: str, workload: Workload, *, concurrency: int,
                 send_s: float) -> list[Record]:
    """Closed loop: ``concurrency`` requests in flight for ``send_s``; the last ones are cut
    off at the end (the caller counts completions inside the window)."""
    limits = DriveLimits(mode="closed", concurrency=concurrency, max_requests=1_000_000,
                         send_window_s=send_s, deadline_s=send_s)
    schedule = ((0.0, 0, spec) for spec in workload.specs())
    return uvloop.run(_run(url, model, limits, schedule))


def completions_per_s(records: list[Record], start_s: float, end_s: float) -> float:
    """Requests answered in full within ``[start_s, end_s]`` of the run, per second."""
    ends = [r.sent_at_s + r.e2e_s for r in records if r.is_ok and r.e2e_s is not None]
    return sum(start_s <= t <= end_s for t in ends) / (end_s - start_s)
