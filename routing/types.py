"""The values routing decisions are made of: a request, a fleet snapshot, a ranked decision.

All frozen: a decision never mutates what it was given. The gateway (``backends/fleet/sync.py``)
builds snapshots from heartbeats, KV events, scraped ``/metrics`` and its own in-flight counts;
``bench``'s virtual-time simulator builds them from simulated engines. Same ``schedule()``.

Example::

    request = RouteRequest(model="m", num_prompt_tokens=1200, block_hashes=(...), char_hashes=(...))
    snapshot = FleetSnapshot(now_s=10.0, backends=(BackendState(name="w0", ...), ...))
    ranked = schedule(request, snapshot, profile, now_s=10.0, rng=random.Random(0))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing knows about one request."""

    model: str
    num_prompt_tokens: int  # exact when tokenized, else estimated from characters
    block_hashes: tuple[int, ...] = ()  # token-block chain (exact index), may be empty
    char_hashes: tuple[int, ...] = ()  # character-block chain (approximate index)
    session_key: str | None = None  # a session header or the `user` field
    tenant_id: str | None = None
    max_tokens: int | None = None
    is_exact_count: bool = False  # num_prompt_tokens came from the model's tokenizer


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """What a backend can hold and do: advertised (heartbeat ``profile``), discovered from what
    the engine exposes, or stated in the configuration (``backends.profile``)."""

    device: str = "unknown"
    num_kv_blocks: int | None = None
    block_size: int | None = None
    max_batch: int | None = None  # sequences it runs at once (vLLM's max_num_seqs)
    max_context_tokens: int | None = None
    prefill_tokens_per_s: float | None = None  # measured or advertised prefill speed
    relative_speed: float = 1.0  # against the fleet's typical backend, where nothing is measured

    @property
    def kv_capacity_tokens(self) -> int | None:
        """Tokens its KV cache holds, when both the block count and size are known."""
        if self.num_kv_blocks is None or not self.block_size:
            return None
        return self.num_kv_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class BackendState:
    """One backend as the snapshot sees it; ``age_s`` is how old its load figures are."""

    name: str
    models: frozenset[str]
    is_healthy: bool = True
    age_s: float = 0.0  # time since the load figures were observed
    weight: float = 1.0
    profile: BackendProfile = BackendProfile()
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # fraction in [0, 1]
    num_queued_prefill_tokens: int = 0
    num_in_flight: int = 0  # requests this gateway has sent and not finished
    num_in_flight_tokens: int = 0  # their prompt + reserved output tokens
    # prompt tokens of in-flight requests with no first token yet: this gateway's fresh view
    # of the prefill backlog (the engine's num_queued_prefill_tokens is age_s old)
    num_in_flight_prompt_tokens: int = 0
    # of those in flight, streams on their last step (one token left of their max_tokens):
    # the engine takes a request sent now into their slots as the step ends (``num_holding``)
    num_ending: int = 0
    # cached KV blocks a later request hit: the prefixes the engine keeps for reuse (heartbeat,
    # ``age_s`` old); None when the engine does not say (one switchyard did not start)
    num_prefix_kv_blocks: int | None = None
    source: str = "config"  # "heartbeat", "metrics", "config"

    @property
    def num_holding(self) -> int:
        """Batch slots held past the engine's current step: the larger of what it reported
        running and what this gateway has in flight, less this gateway's streams on their last
        step (a request sent now reaches the engine's queue before that step ends, and starts
        in the slot the stream frees at once, not one step later)."""
        return max(0, max(self.num_running, self.num_in_flight) - self.num_ending)


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """How many leading blocks of the request each backend holds, from one index."""

    num_blocks: Mapping[str, int] = field(default_factory=dict)
    block_tokens: int = 16  # tokens per block (exact) or estimated tokens per char block
    is_exact: bool = False


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    now_s: float
    backends: tuple[BackendState, ...]
    prefix: PrefixMatch = PrefixMatch()
    max_age_s: float = 5.0  # load older than this is stale: the backend is unknown, not idle
    # Each backend's index in ``backends`` by name, when the caller keeps one (the gateway does,
    # per fleet membership): lets a shortlist find the prefix holders without a pass over all.
    positions: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Ranked:
    """One candidate of a decision: its total score and each plugin's reason."""

    backend: str
    score: float
    reasons: tuple[tuple[str, float], ...] = ()  # (plugin name, weighted score) pairs
    expected_cached_tokens: int = 0
