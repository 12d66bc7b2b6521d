"""One simulated run's settings: the fleet, the routing profile, the arrival rate and the
gateway's view (``bench/vsim/sim.py`` describes each event these times drive).

**The live path's fixed latency.** Live, a request reaches the engine a few milliseconds
after the gateway decided (the gateway's work, the loopback hop, the worker parsing and
tokenizing the prompt) and its first token reaches the client a little after the engine's
step ended (the SSE relay, the worker loop's 1 ms timer). ``dispatch_s`` adds that whole
fixed cost before the engine sees the request; ``bench.vsim.agreement`` measures it on an
idle live fleet. It is 0 by default (an ideal gateway).

Example::

    config = SimConfig(num_workers=64, num_requests=20_000, rate_per_s=863.3,
                       num_replicas=8, peer_load=False)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from backends.fleet.approx_sync import (
    FLUSH_INTERVAL_S,
    LAZY_INTERVAL_S,
    PUSH_INTERVAL_S,
    URGENT_PREFILL_TOKENS,
)
from backends.sim.profile import WorkerProfile
from bench.common.fleet_modes import Mode
from bench.vsim.profiles import MODEL


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One run: the fleet, the routing profile, the arrival rate and the gateway's view."""

    num_workers: int = 8
    num_requests: int = 2000
    profile: str = "prefix_affinity"
    rate_per_s: float = 10.0
    seed: int = 1
    worker: WorkerProfile = field(default_factory=lambda: WorkerProfile(model=MODEL))
    heartbeat_s: float = 1.0
    # backends/fleet/sync.py FleetSync's membership poll (reads the heartbeats); 0: no polling
    poll_interval_s: float = 0.25
    kv_flush_s: float = 0.05  # backends/publisher.py KvPublisher's flush interval
    kv_event_delay_s: float = 0.001  # after the flush: Redis and the gateway's XREAD
    max_age_s: float = 5.0
    approx_ttl_s: float = 600.0
    num_silent_workers: int = 0
    warmup_fraction: float = 0.1  # of requests, simulated but left out of the figures
    num_warmup: int | None = None  # the first requests left out; overrides warmup_fraction
    dispatch_s: float = 0.0  # the live path's fixed latency per request (module docstring)
    mode: Mode = "own"  # how the gateway knows the engines (sim.py's docstring)
    scrape_interval_s: float = 1.0  # FleetSync's /metrics scrape, third-party
    cache_feedback: bool = True  # reported cached tokens go to Router.learn, as live
    # Gateway replicas behind a round-robin front (bench/vsim/replicas.py); whether they share
    # their approximate indexes and their in-flight counts (backends/fleet/peer_load.py)
    # through sy:approx (bench/vsim/approx_share.py).
    num_replicas: int = 1
    share_approx: bool = True
    share_lessons: bool = True  # and what responses taught each about claim lifetimes
    peer_load: bool = True
    # Third-party: the replicas share their /metrics scrapes (backends/fleet/scrape_share.py):
    # an engine is scraped by the first replica whose tick finds nobody's figures fresh.
    share_scrapes: bool = False
    share_flush_s: float = FLUSH_INTERVAL_S  # ApproxIndexSync's batching / XREAD block
    share_rtt_s: float = 0.001  # a Redis round trip
    # Not None: a writer task of its own flushes as the books change, at most once per
    # share_push_s (and a round trip unless share_pipelined; the read loop only reads); None:
    # the read loop flushes.
    share_push_s: float | None = PUSH_INTERVAL_S
    # With the writer: a change that only lowers the counts waits this long for a dispatch.
    share_lazy_s: float = LAZY_INTERVAL_S
    # ...unless it is a first token (or an end before one) that takes at least this many
    # prompt tokens of prefill off a backend's books: a cache miss's goes at once.
    share_urgent_prefill_tokens: int = URGENT_PREFILL_TOKENS
    # With the writer: its next flush may go share_push_s after the last was sent, while that
    # one's reply is on its way (pipelined, as on the gateway's own connection), not after
    # the reply (as through redis-py).
    share_pipelined: bool = True

    def kv_delivery_s(self, worker: int, now_s: float) -> float:
        """When KV events a worker recorded at ``now_s`` reach the gateway's index: at its
        publisher's next flush (every ``kv_flush_s``, each worker at its own phase)."""
        flush_s = self.kv_flush_s
        if flush_s <= 0:
            return now_s + self.kv_event_delay_s
        phase_s = flush_s * worker / self.num_workers
        num_ticks = math.floor((now_s - phase_s) / flush_s) + 1
        return phase_s + num_ticks * flush_s + self.kv_event_delay_s
