"""Tiers (SLO classes) and which one a request runs in.

A tenant has a default tier; an API key may narrow it (never widen it); a request may ask for
a *lower* tier with the ``x-switchyard-tier`` header (a batch job sent with an interactive key),
never a higher one. Priority 0 is the highest; tiers with equal priority are interchangeable.

Errors are ``ValueError`` subclasses whose message names the tiers the caller may use:
``UnknownTierError`` (the request named no configured tier: HTTP 400),
``TierNotAllowedError`` (the request asked above its ceiling: HTTP 403) and
``TierConfigError`` (a tenant or key refers to a tier that is no longer configured: a server
configuration problem).

Example::

    tiers = tier_table(settings.tiers)          # TierSettings (ms) or Tier values
    tier = resolve_tier(tiers, tenant_tier="standard", key_tier=None, requested="batch")
    tier.name, tier.max_wait_s                  # ("batch", 600.0)
    resolve_tier(tiers, "standard", None, "interactive")   # raises TierNotAllowedError
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

OnOverload = Literal["reject", "queue_until_deadline", "queue"]
TIER_HEADER = "x-switchyard-tier"


class TierError(ValueError):
    """A tier could not be resolved; the message says which tiers are allowed."""


class UnknownTierError(TierError):
    """The request named a tier that is not configured (HTTP 400)."""


class TierNotAllowedError(TierError):
    """The request asked for a tier above its tenant's or key's ceiling (HTTP 403)."""


class TierConfigError(TierError):
    """A tenant or key refers to a tier that is not configured (a server-side problem)."""


@dataclass(frozen=True, slots=True)
class Tier:
    """One SLO class, in seconds.

    ``max_wait_s`` is how long a request of this tier may wait in the gateway's queue:
    0 for ``reject`` (it never queues), at most the TTFT SLO for ``queue_until_deadline``
    (waiting longer would miss the SLO anyway), ``max_queue_wait_s`` for ``queue``. A zero
    ``max_queue_wait_s`` means "the TTFT SLO".

    Example::

        Tier("standard", priority=1, ttft_slo_s=2.0, max_queue_wait_s=2.0).max_wait_s  # 2.0
    """

    name: str
    priority: int
    ttft_slo_s: float
    tpot_slo_s: float = 0.2
    max_queue_wait_s: float = 0.0
    on_overload: OnOverload = "queue_until_deadline"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a tier needs a name")
        if self.priority < 0:
            raise ValueError(f"tier {self.name!r}: priority must be >= 0, got {self.priority}")
        for field_name in ("ttft_slo_s", "tpot_slo_s"):
            value = getattr(self, field_name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"tier {self.name!r}: {field_name} must be > 0, got {value}")
        if not (math.isfinite(self.max_queue_wait_s) and self.max_queue_wait_s >= 0):
            raise ValueError(f"tier {self.name!r}: max_queue_wait_s must be >= 0")
        if self.on_overload not in get_args(OnOverload):
            raise ValueError(f"tier {self.name!r}: on_overload must be one of "
                             f"{', '.join(get_args(OnOverload))}, got {self.on_overload!r}")

    @property
    def max_wait_s(self) -> float:
        """The longest this tier's requests wait in the gateway queue before a 503."""
        if self.on_overload == "reject":
            return 0.0
        configured_s = self.max_queue_wait_s or self.ttft_slo_s
        if self.on_overload == "queue_until_deadline":
            return min(configured_s, self.ttft_slo_s)
        return configured_s

    def queue_deadline_s(self, arrival_s: float) -> float:
        """When a request that arrived at ``arrival_s`` must leave the queue or be rejected."""
        return arrival_s + self.max_wait_s

    @classmethod
    def from_config(cls, config: TierConfig) -> Tier:
        """A tier from configuration in milliseconds (``gateway.settings.TierSettings``)."""
        return cls(name=config.name, priority=config.priority,
                   ttft_slo_s=config.ttft_slo_ms / 1000, tpot_slo_s=config.tpot_slo_ms / 1000,
                   max_queue_wait_s=config.max_queue_wait_ms / 1000,
                   on_overload=config.on_overload)


class TierConfig(Protocol):
    """What ``Tier.from_config`` reads: the shape of ``gateway.settings.TierSettings``."""

    @property
    def name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def ttft_slo_ms(self) -> float: ...
    @property
    def tpot_slo_ms(self) -> float: ...
    @property
    def max_queue_wait_ms(self) -> float: ...
    @property
    def on_overload(self) -> OnOverload: ...


DEFAULT_TIERS: tuple[Tier, ...] = (
    Tier("interactive", priority=0, ttft_slo_s=0.5, on_overload="reject"),
    Tier("standard", priority=1, ttft_slo_s=2.0, max_queue_wait_s=2.0),
    Tier("batch", priority=2, ttft_slo_s=60.0, max_queue_wait_s=600.0, on_overload="queue"),
)


def tier_table(configs: Iterable[Tier | TierConfig]) -> dict[str, Tier]:
    """Tiers by name, from ``Tier`` values or millisecond configs; names must be unique."""
    table: dict[str, Tier] = {}
    for config in configs:
        tier = config if isinstance(config, Tier) else Tier.from_config(config)
        if tier.name in table:
            raise ValueError(f"tier names must be unique; {tier.name!r} is repeated")
        table[tier.name] = tier
    return table


def allowed_tiers(tiers: Mapping[str, Tier], ceiling: Tier) -> list[Tier]:
    """The tiers at or below ``ceiling`` (priority number >= its), highest first."""
    allowed = [t for t in tiers.values() if t.priority >= ceiling.priority]
    return sorted(allowed, key=lambda t: (t.priority, t.name))


def resolve_tier(tiers: Mapping[str, Tier], tenant_tier: str, key_tier: str | None,
                 requested: str | None) -> Tier:
    """The tier a request runs in: the ceiling (tenant's tier, narrowed by the key's) or lower.

    A key tier above the tenant's does not widen it: the tenant's tier stays the ceiling.
    An empty ``requested`` (absent header) means the ceiling.
    """
    ceiling = _configured(tiers, tenant_tier, "the tenant's tier")
    if key_tier:
        key = _configured(tiers, key_tier, "the API key's tier")
        if key.priority > ceiling.priority:
            ceiling = key
    if not requested:
        return ceiling
    allowed = ", ".join(t.name for t in allowed_tiers(tiers, ceiling))
    tier = tiers.get(requested.strip())
    if tier is None:
        raise UnknownTierError(f"unknown tier {requested!r} in {TIER_HEADER}; "
                               f"this key may use: {allowed}")
    if tier.priority < ceiling.priority:
        raise TierNotAllowedError(f"tier {tier.name!r} is above this key's tier "
                                  f"{ceiling.name!r}; this key may use: {allowed}")
    return tier


def _configured(tiers: Mapping[str, Tier], name: str, what: str) -> Tier:
    tier = tiers.get(name)
    if tier is None:
        raise TierConfigError(f"{what} {name!r} is not configured; configured tiers: "
                              f"{', '.join(tiers) or 'none'}")
    return tier
