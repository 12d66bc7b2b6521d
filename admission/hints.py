"""Priority and SLO hints other ecosystems send, mapped onto tiers; never above the ceiling.

Clients and gateways in front of switchyard already say how urgent a request is in their own
words. Each is read as a tier *at or below* the request's ceiling (the tenant's tier, narrowed
by the key's): a hint can lower a request, never raise it, and an unknown value is ignored, not
an error. The first hint present decides:

1. an llm-d / Gateway API Inference Extension objective (``x-llm-d-inference-objective``, or
   the older ``x-gateway-inference-objective``) that names a configured tier: that tier;
2. an llm-d TTFT SLO in milliseconds (``x-llm-d-slo-ttft-ms``, or ``x-slo-ttft-ms``): the
   lowest allowed tier whose TTFT SLO still meets it (the ceiling when none does);
3. SGLang Model Gateway's class (``x-smg-priority``: ``system`` > ``interactive`` >
   ``default`` > ``bulk``): ``bulk`` is the lowest allowed tier, the others the ceiling;
4. OpenAI's ``service_tier`` body field: ``flex`` is the lowest allowed tier, ``priority``,
   ``default``, ``auto`` and ``scale`` the ceiling.

``x-switchyard-tier`` (``admission.tiers.resolve_tier``) is not a hint: it is checked, and a
tier above the ceiling is refused. When it is present the hints are not read.

Example::

    hints = TierHints(smg_priority="bulk")
    hinted_tier(tiers, tiers["standard"], hints).name   # "batch"
    hinted_tier(tiers, tiers["standard"], TierHints(objective="interactive")).name  # "standard"
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from admission.tiers import Tier, allowed_tiers

OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
TTFT_SLO_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
SMG_PRIORITY_HEADER = "x-smg-priority"
_LOWEST_SMG = "bulk"
_LOWEST_SERVICE_TIER = "flex"


@dataclass(slots=True, init=False)
class TierHints:
    """What a request said of its urgency, as sent (header text, the body's field)."""

    objective: str | None
    ttft_slo_ms: str | None
    smg_priority: str | None
    service_tier: Any  # the body's value, any JSON: judged by hinted_tier

    def __init__(self, objective: str | None = None, ttft_slo_ms: str | None = None,
                 smg_priority: str | None = None, service_tier: Any = None) -> None:
        self.objective = objective
        self.ttft_slo_ms = ttft_slo_ms
        self.smg_priority = smg_priority
        self.service_tier = service_tier


def hints_from(headers: Mapping[str, str], body: Mapping[str, object]) -> TierHints | None:
    """The hints in a request's headers and body, or None when it sent none."""
    objective = _first(headers, OBJECTIVE_HEADERS)
    ttft_slo_ms = _first(headers, TTFT_SLO_HEADERS)
    smg_priority = headers.get(SMG_PRIORITY_HEADER)
    service_tier = body.get("service_tier")
    if objective is None and ttft_slo_ms is None and smg_priority is None \
            and service_tier is None:
        return None
    return TierHints(objective, ttft_slo_ms, smg_priority, service_tier)


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


def hinted_tier(tiers: Mapping[str, Tier], ceiling: Tier, hints: TierHints) -> Tier:
    """The tier ``hints`` ask for, at or below ``ceiling``; ``ceiling`` when they ask for
    nothing this gateway knows."""
    if hints.objective is not None:
        tier = tiers.get(hints.objective.strip())
        if tier is not None:
            return tier if tier.priority >= ceiling.priority else ceiling
    if hints.ttft_slo_ms is not None:
        slo_ms = _positive_number(hints.ttft_slo_ms)
        if slo_ms is not None:
            meeting = [t for t in allowed_tiers(tiers, ceiling) if t.ttft_slo_s * 1000 <= slo_ms]
            return meeting[-1] if meeting else ceiling
    if hints.smg_priority is not None:
        if hints.smg_priority.strip().lower() == _LOWEST_SMG:
            return allowed_tiers(tiers, ceiling)[-1]
        return ceiling
    if isinstance(hints.service_tier, str) \
            and hints.service_tier.strip().lower() == _LOWEST_SERVICE_TIER:
        return allowed_tiers(tiers, ceiling)[-1]
    return ceiling


def _positive_number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None
