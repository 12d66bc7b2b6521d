"""The values routing decisions are made of: a request, a fleet snapshot, a ranked decision.

Values: a decision never mutates what it was given. The hot ones (built per request) are plain
slotted dataclasses with their own ``__init__``, not frozen ones: the compiled build
(``routing.native``) turns a written ``__init__`` into a native constructor, while a frozen
dataclass's generated one stays interpreted and sets each field through ``object.__setattr__``
(0.5 µs against 0.1 for four fields). Treat them as frozen all the same.

The gateway (``backends/fleet/sync.py``) builds snapshots from heartbeats, KV events, scraped
``/metrics`` and its own in-flight counts; ``bench``'s virtual-time simulator builds them from
simulated engines. Same ``schedule()``.

Example::

    request = RouteRequest(model="m", num_prompt_tokens=1200, block_hashes=(...), char_hashes=(...))
    snapshot = FleetSnapshot(now_s=10.0, backends=(BackendState(name="w0", ...), ...))
    ranked = schedule(request, snapshot, profile, now_s=10.0, rng=random.Random(0))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# A backend's prefill speed where its profile states none (BackendProfile.prefill_rate's usual
# default: the ttft scorer's and the SLO predictor's)
DEFAULT_PREFILL_TOKENS_PER_S = 10_000.0


@dataclass(slots=True, init=False)
class RouteRequest:
    """What routing knows about one request."""

    model: str
    num_prompt_tokens: int  # exact when tokenized, else estimated from characters
    block_hashes: tuple[int, ...]  # token-block chain (exact index), may be empty
    char_hashes: tuple[int, ...]  # character-block chain (approximate index)
    session_key: str | None  # a session header or the `user` field
    tenant_id: str | None
    max_tokens: int | None
    is_exact_count: bool  # num_prompt_tokens came from the model's tokenizer

    def __init__(self, model: str, num_prompt_tokens: int, block_hashes: tuple[int, ...] = (),
                 char_hashes: tuple[int, ...] = (), session_key: str | None = None,
                 tenant_id: str | None = None, max_tokens: int | None = None,
                 is_exact_count: bool = False) -> None:
        self.model = model
        self.num_prompt_tokens = num_prompt_tokens
        self.block_hashes = block_hashes
        self.char_hashes = char_hashes
        self.session_key = session_key
        self.tenant_id = tenant_id
        self.max_tokens = max_tokens
        self.is_exact_count = is_exact_count


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

    def prefill_rate(self, default_tokens_per_s: float) -> float:
        """Its prefill speed in tokens/s: the measured or advertised one, else
        ``default_tokens_per_s`` times ``relative_speed``."""
        rate = self.prefill_tokens_per_s
        if rate is None or rate <= 0:
            return default_tokens_per_s * self.relative_speed
        return rate


_UNKNOWN_PROFILE = BackendProfile()


@dataclass(slots=True, init=False)
class BackendState:
    """One backend as the snapshot sees it; ``age_s`` is how old its load figures are."""

    name: str
    models: frozenset[str]
    is_healthy: bool
    age_s: float  # time since the load figures were observed
    weight: float
    profile: BackendProfile
    num_running: int
    num_waiting: int
    kv_usage: float  # fraction in [0, 1]
    num_queued_prefill_tokens: int
    num_in_flight: int  # requests this gateway has sent and not finished
    num_in_flight_tokens: int  # their prompt + reserved output tokens
    # prompt tokens of in-flight requests with no first token yet: this gateway's fresh view
    # of the prefill backlog (the engine's num_queued_prefill_tokens is age_s old)
    num_in_flight_prompt_tokens: int
    # of those in flight, streams on their last step (one token left of their max_tokens):
    # the engine takes a request sent now into their slots as the step ends (``num_holding``)
    num_ending: int
    # cached KV blocks a later request hit: the prefixes the engine keeps for reuse (heartbeat,
    # ``age_s`` old); None when the engine does not say (one switchyard did not start)
    num_prefix_kv_blocks: int | None
    source: str  # "heartbeat", "metrics", "config"

    def __init__(self, name: str, models: frozenset[str], is_healthy: bool = True,
                 age_s: float = 0.0, weight: float = 1.0,
                 profile: BackendProfile = _UNKNOWN_PROFILE, num_running: int = 0,
                 num_waiting: int = 0, kv_usage: float = 0.0,
                 num_queued_prefill_tokens: int = 0, num_in_flight: int = 0,
                 num_in_flight_tokens: int = 0, num_in_flight_prompt_tokens: int = 0,
                 num_ending: int = 0, num_prefix_kv_blocks: int | None = None,
                 source: str = "config") -> None:
        self.name = name
        self.models = models
        self.is_healthy = is_healthy
        self.age_s = age_s
        self.weight = weight
        self.profile = profile
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.kv_usage = kv_usage
        self.num_queued_prefill_tokens = num_queued_prefill_tokens
        self.num_in_flight = num_in_flight
        self.num_in_flight_tokens = num_in_flight_tokens
        self.num_in_flight_prompt_tokens = num_in_flight_prompt_tokens
        self.num_ending = num_ending
        self.num_prefix_kv_blocks = num_prefix_kv_blocks
        self.source = source

    def queued_prefill_now(self, tokens_per_s: float, snapshot_age_s: float = 0.0) -> int:
        """The engine's prefill backlog now, estimated: the ``num_queued_prefill_tokens`` it
        reported ``age_s`` (plus ``snapshot_age_s``, the snapshot's own age) ago less what it
        prefilled since at ``tokens_per_s`` (its ``profile.prefill_rate``). A heartbeat a
        second old still counts a backlog the engine cleared in a fraction of it; taken at face
        value, it sends a prompt away from the backend holding its prefix."""
        queued = self.num_queued_prefill_tokens
        age_s = self.age_s + snapshot_age_s
        if queued <= 0 or age_s <= 0:
            return queued
        left = queued - tokens_per_s * age_s
        return int(left) if left > 0 else 0

    @property
    def num_holding(self) -> int:
        """Batch slots held past the engine's current step: the larger of what it reported
        running and what this gateway has in flight, less this gateway's streams on their last
        step (a request sent now reaches the engine's queue before that step ends, and starts
        in the slot the stream frees at once, not one step later)."""
        return max(0, max(self.num_running, self.num_in_flight) - self.num_ending)


@dataclass(slots=True, init=False)
class PrefixMatch:
    """How many leading blocks of the request each backend holds, from one index."""

    num_blocks: Mapping[str, int]
    block_tokens: int  # tokens per block (exact) or estimated tokens per char block
    is_exact: bool

    def __init__(self, num_blocks: Mapping[str, int] | None = None, block_tokens: int = 16,
                 is_exact: bool = False) -> None:
        self.num_blocks = {} if num_blocks is None else num_blocks
        self.block_tokens = block_tokens
        self.is_exact = is_exact


@dataclass(slots=True, init=False)
class FleetSnapshot:
    now_s: float
    backends: tuple[BackendState, ...]
    prefix: PrefixMatch
    max_age_s: float  # load older than this is stale: the backend is unknown, not idle
    # Each backend's index in ``backends`` by name, when the caller keeps one (the gateway does,
    # per fleet membership): lets a shortlist find the prefix holders without a pass over all.
    positions: Mapping[str, int] | None

    def __init__(self, now_s: float, backends: tuple[BackendState, ...],
                 prefix: PrefixMatch | None = None, max_age_s: float = 5.0,
                 positions: Mapping[str, int] | None = None) -> None:
        self.now_s = now_s
        self.backends = backends
        self.prefix = PrefixMatch() if prefix is None else prefix
        self.max_age_s = max_age_s
        self.positions = positions


@dataclass(slots=True, init=False)
class Ranked:
    """One candidate of a decision: its total score and each plugin's reason."""

    backend: str
    score: float
    reasons: tuple[tuple[str, float], ...]  # (plugin name, weighted score) pairs
    expected_cached_tokens: int

    def __init__(self, backend: str, score: float, reasons: tuple[tuple[str, float], ...] = (),
                 expected_cached_tokens: int = 0) -> None:
        self.backend = backend
        self.score = score
        self.reasons = reasons
        self.expected_cached_tokens = expected_cached_tokens
