"""Hand-built requests, backends and snapshots for the routing tests (no network, no clock)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from routing.plugin import Cycle
from routing.types import BackendProfile, BackendState, FleetSnapshot, PrefixMatch, RouteRequest

MODEL = "m"
NOW_S = 100.0


def backend(name: str, **fields: Any) -> BackendState:
    """A healthy, fresh, idle backend serving ``MODEL`` unless ``fields`` say otherwise."""
    fields.setdefault("models", frozenset({MODEL}))
    return BackendState(name=name, **fields)


def profile(**fields: Any) -> BackendProfile:
    return BackendProfile(**fields)


def request(num_prompt_tokens: int = 1000, **fields: Any) -> RouteRequest:
    fields.setdefault("model", MODEL)
    return RouteRequest(num_prompt_tokens=num_prompt_tokens, **fields)


def snapshot(*backends: BackendState, matched: Mapping[str, int] | None = None,
             block_tokens: int = 16, is_exact: bool = True, max_age_s: float = 5.0,
             now_s: float = NOW_S) -> FleetSnapshot:
    prefix = PrefixMatch(dict(matched or {}), block_tokens, is_exact)
    return FleetSnapshot(now_s=now_s, backends=tuple(backends), prefix=prefix,
                         max_age_s=max_age_s)


def cycle(*backends: BackendState, req: RouteRequest | None = None, now_s: float = NOW_S,
          **snapshot_fields: Any) -> Cycle:
    return Cycle(req or request(), snapshot(*backends, **snapshot_fields), now_s)


def chain(num_blocks: int, start: int = 1) -> tuple[int, ...]:
    """A stand-in block-hash chain: distinct ints; chains sharing ``start`` share a prefix."""
    return tuple(range(start, start + num_blocks))
