"""Gateway replicas in virtual time: each one's own view of the same fleet.

A round-robin front (a load balancer, ``switchyard serve --workers N``) deals arrivals over
``SimConfig.num_replicas`` replicas: request ``i`` goes to replica ``i % N``. As live, each
replica has

- its own ``Backend`` records: the in-flight books of the requests it sent itself, and the
  engines' load figures as its own ``FleetSync`` last read them: the heartbeats at its own
  polls (own fleet), or ``/metrics`` at its own scrapes (third-party); replica ``r``'s polls
  and scrapes run ``r / N`` of an interval after replica 0's; with ``SimConfig.share_scrapes``
  (third-party, as ``routing.share_scrapes``) a replica scrapes only the engines whose
  figures, its own or heard, are old, and the others hear what it read a Redis round trip
  later (``bench/vsim/sim.py``);
- its own router and approximate index (learned from its own decisions and cache feedback),
  which hears the other replicas' claims through ``sy:approx`` (``bench/vsim/approx_share.py``)
  unless sharing is off;
- its own ``PeerLoad`` (``backends/fleet/peer_load.py``, ``SimConfig.peer_load``): it publishes
  its per-backend in-flight counts on the same stream and sets its ``Backend`` records'
  ``peer_*`` counts to the others' (``build_share``);
- its own ``round_robin`` rotation, started at a turn drawn from the seed (as the gateway
  starts each process's at a random one), so replicas do not rotate in step;
- the same exact index: every replica reads the same KV-event stream with the same delay, so
  one ``ExactPrefixIndex`` stands for all of theirs.

One replica is the single gateway, decision for decision: replica 0 has its router seed, and
with one replica nothing is shared and the rotation starts at 0.

Example::

    replicas = build_replicas(config, cores)
    replicas[3 % len(replicas)].router.rank(plan, now_s)
    share = build_share(config, replicas, push=..., has_work=..., peer_changed=...)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from backends.fleet.peer_load import PeerLoad
from backends.fleet.profiles import heartbeat_facts
from backends.fleet.registry import Backend
from backends.fleet.scrape_share import FRESH_SHARE, ScrapeShare
from backends.sim.core import SimEngineCore
from bench.vsim.approx_share import ApproxShare, no_clock
from bench.vsim.config import SimConfig
from bench.vsim.profiles import PROFILES
from bench.vsim.router import VirtualRouter
from bench.vsim.scrape import EnginePages
from routing.index_approx import ApproxPrefixIndex
from routing.plugins.pickers import RoundRobinPicker

# A heartbeat's load figures: running, waiting, KV usage, queued prefill tokens, prefix blocks.
EngineFigures = tuple[int, int, float, int, int]


def heartbeat_figures(core: SimEngineCore) -> EngineFigures:
    return (core.num_running, core.num_waiting, core.kv_usage, core.num_queued_prefill_tokens,
            core.block_manager.num_prefix_blocks)


@dataclass(slots=True)
class Replica:
    """One gateway replica: its ``Backend`` records, router and (third-party) scrape."""

    backends: list[Backend]
    router: VirtualRouter
    pages: EnginePages | None
    # Own fleet: per worker, how many of its heartbeats this replica has read.
    num_heard: list[int] = field(default_factory=list)

    def hear(self, worker: int, observed_s: float, figures: EngineFigures) -> None:
        """Take in a heartbeat observed at ``observed_s``, as ``FleetSync``."""
        backend = self.backends[worker]
        backend.load_source = "heartbeat"
        (backend.num_running, backend.num_waiting, backend.kv_usage,
         backend.num_queued_prefill_tokens, backend.num_prefix_kv_blocks) = figures
        backend.load_observed(observed_s)
        self.router.mark_changed(worker)


def build_replicas(config: SimConfig, cores: Sequence[SimEngineCore]) -> list[Replica]:
    """``config.num_replicas`` replicas over ``cores``; replica 0 is the single gateway's
    (same router seed), so one replica runs as before replicas existed."""
    routing_profile, index_mode = PROFILES[config.profile]
    worker = config.worker
    models = frozenset({worker.model})
    replicas: list[Replica] = []
    turns = random.Random(f"{config.seed}:vsim-round-robin-start")
    for r in range(config.num_replicas):
        pages: EnginePages | None = None
        if config.mode == "own":  # joined by heartbeat, profile and all (FleetSync._upsert)
            backends = [Backend(f"w{i}", f"vsim://w{i}", models, source="heartbeat")
                        for i in range(config.num_workers)]
            for backend in backends:
                backend.learn_profile(heartbeat_facts(worker.to_json()))
        else:  # listed in backends: with no profile: stated; everything else is discovered
            backends = [Backend(f"w{i}", f"vsim://w{i}", models)
                        for i in range(config.num_workers)]
            scrapes = None
            if config.num_replicas > 1 and config.share_scrapes:
                scrapes = ScrapeShare(f"r{r}", fresh_s=FRESH_SHARE * config.scrape_interval_s)
            pages = EnginePages(backends, cores, scrapes=scrapes)
            if scrapes is not None:
                scrapes.clock = lambda pages=pages: pages.now_s  # type: ignore[misc]
        router = VirtualRouter(
            backends, routing_profile, index_mode, model=worker.model,
            block_size=worker.block_size, max_age_s=config.max_age_s,
            approx_ttl_s=config.approx_ttl_s, seed=config.seed if r == 0 else f"{config.seed}.{r}",
            exact_index=replicas[0].router.exact_index if replicas else None)
        picker = router.profile.picker
        if config.num_replicas > 1 and isinstance(picker, RoundRobinPicker):
            picker.start_at(turns.randrange(1 << 30))  # gateway/app.py's scheduling_profile
        replicas.append(Replica(backends, router, pages, [0] * config.num_workers))
    return replicas


def is_sharing_approx(config: SimConfig) -> bool:
    """The replicas share approximate-index claims: asked to, and the profile has an index."""
    return config.share_approx and PROFILES[config.profile][1] != "none"


def build_share(config: SimConfig, replicas: Sequence[Replica], *,
                push: Callable[[float, int], None], has_work: Callable[[], bool],
                peer_changed: Callable[[int, int], None]) -> ApproxShare | None:
    """The ``sy:approx`` stream between ``replicas``, with their claims (``is_sharing_approx``)
    and their in-flight counts (``config.peer_load``); None when it carries neither."""
    share_claims = is_sharing_approx(config)
    if len(replicas) == 1 or not (share_claims or config.peer_load):
        return None
    indexes = [ApproxPrefixIndex(config.approx_ttl_s) if r.router.approx_index is None
               else r.router.approx_index for r in replicas]  # none: never sent, never read
    peers = None
    if config.peer_load:
        peers = [PeerLoad(r.router.gateway.registry, f"r{i}", clock=no_clock)
                 for i, r in enumerate(replicas)]
    share = ApproxShare(indexes, ttl_s=config.approx_ttl_s, push=push, has_work=has_work,
                        flush_interval_s=config.share_flush_s, rtt_s=config.share_rtt_s,
                        peers=peers, peer_backends=[r.backends for r in replicas],
                        peer_changed=peer_changed, push_interval_s=config.share_push_s,
                        lazy_interval_s=config.share_lazy_s,
                        is_pipelined=config.share_pipelined)
    for replica in replicas:
        replica.router.gateway.urgent_prefill_tokens = config.share_urgent_prefill_tokens
    if share_claims:
        for r, replica in enumerate(replicas):
            replica.router.gateway.on_record = share.recorder(r)
            if config.share_lessons:
                replica.router.gateway.on_lesson = share.teacher(r)
    return share
