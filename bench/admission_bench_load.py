"""The admission benchmark's workload and its send loop.

Ten tenants, ``t0`` sending ten times as much as each of ``t1`` .. ``t9``; a tier mix of 20%
interactive, 50% standard, 30% batch for every tenant. Each tenant has one API key per tier
(a key narrows its tenant's tier), so a request's tier is the key it is sent with. Tenants and
tiers are dealt from shuffled decks (19 tenant slots, 10 tier slots), so every stretch of 19
requests has the exact tenant mix and every 10 the exact tier mix, even in a short smoke run.
Prompts are random words (no shared prefixes), streamed, with a random ``max_tokens``.

The send loop is `bench.run.driver.Driver` (open loop at Poisson arrivals, or a closed loop),
through `bench.run.client.Client`. Example::

    workload = Workload(keys, Mix(), seed=1)
    records = drive(url, model, workload, rate_per_s=10, send_s=40, drain_s=5)
    workload.demanded_tokens[records[0].index]
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import uvloop

from bench.run.arrivals import sweep
from bench.run.client import Client, open_session
from bench.run.driver import DriveLimits, Driver, Scheduled
from bench.run.spec import Record, RequestSpec, TenantSpec
from bench.run.text import text

TIERS = ("interactive", "standard", "batch")
HEAVY = "t0"


@dataclass(frozen=True, slots=True)
class Mix:
    """Who sends what: tenant weights, tier weights and request sizes (tokens)."""

    num_tenants: int = 10
    heavy_weight: int = 10
    tier_weights: tuple[tuple[str, int], ...] = (("interactive", 2), ("standard", 5),
                                                 ("batch", 3))
    prompt_tokens: tuple[int, int] = (100, 400)
    max_tokens: tuple[int, int] = (16, 64)

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


async def _run(url: str, model: str, limits: DriveLimits, schedule: Iterator[Scheduled]
               ) -> list[Record]:
    concurrency = limits.concurrency if limits.mode == "closed" else None
    async with open_session(concurrency, timeout_s=limits.deadline_s + 30) as session:
        return await Driver(Client(session, url, model), limits).run(schedule)


def drive(url: str, model: str, workload: Workload, *, rate_per_s: float, send_s: float,
          drain_s: float) -> list[Record]:
    """Open loop: Poisson arrivals at ``rate_per_s`` for ``send_s``, then up to ``drain_s``
    for the answers; whatever is still in flight then is cut off (status -1)."""
    rng = random.Random(f"{workload.seed}:arrivals:{rate_per_s}")
    timeline = sweep([rate_per_s], send_s, "poisson", 1.0, rng)
    schedule = ((a.at_s, 0, spec) for a, spec in zip(timeline, workload.specs(), strict=False))
    limits = DriveLimits(mode="open", concurrency=None, max_requests=1_000_000,
                         send_window_s=send_s, deadline_s=send_s + drain_s)
    return uvloop.run(_run(url, model, limits, schedule))


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
