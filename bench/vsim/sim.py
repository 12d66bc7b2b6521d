"""The virtual-time fleet: ``SimEngineCore`` workers and a ``VirtualRouter`` on one event heap.

Events, in time order (ties in the order they were scheduled):

- **arrival** (Poisson, ``bench.run.arrivals.gap_s``, or the times given to ``Simulation``):
  KV events due by now reach the exact index, the router describes and ranks the request and
  it is added to the first-ranked worker's core ``dispatch_s`` later (at once by default); an
  idle worker starts a step when it gets the request;
- **step end**, per worker: the loop of ``backends/sim/worker.py`` without the sleeping --
  ``step(now)`` priced a step, now ``finish_step(end)``; first tokens and finishes update the
  records and the router's in-flight books; the step's KV events are delivered as the live
  worker's publisher sends them (``backends/publisher.py``): at its next flush, every
  ``kv_flush_s`` (a phase per worker), plus ``kv_event_delay_s`` for Redis and the gateway's
  blocking read; the next step starts if the core has work;
- **heartbeat**, per worker at time 0 and then every ``heartbeat_s`` (phases spread over the
  interval): the core's running / waiting / KV usage / queued prefill figures, observed now,
  are published; their age is what ``schedule()``'s fresh filter judges. The first
  ``num_silent_workers`` send the one at time 0 and then fall silent (lost heartbeats);
- **poll**, every ``poll_interval_s``: the gateway reads the latest heartbeats into its
  ``Backend`` records, as ``backends/fleet/sync.py`` ``FleetSync.poll_members`` does: a new
  heartbeat starts the backend's books since its figures afresh (``Backend.load_observed``),
  one read again keeps them (0 turns polling off: a heartbeat reaches the ``Backend`` at
  once);
- **stale**: the moment a worker's figures exceed ``max_age_s`` with no newer heartbeat due
  before (silent workers, or ``heartbeat_s > max_age_s``).

**Modes** (``SimConfig.mode``, as ``bench/common/fleet_modes.py``'s live fleets). ``own``:
the events above. ``third-party``: the engines as vLLM servers, listed statically: no
heartbeats, polls or KV events, so only the approximate index (an ``exact`` profile is
refused); instead the gateway's **scrape** (``bench/vsim/scrape.py``: ``FleetSync``'s own
code) looks first at time 0 (load, discovered profile), then reads every engine's
``/metrics`` every ``scrape_interval_s``. The first ``num_silent_workers`` answer the first
look only.

In both modes, each finished request's cached prompt tokens (what the engine core found at
the admission that produced its first token, what the live worker reports in ``usage``) go to
``gateway/router.py``'s ``Router.learn`` (``cache_feedback``): a reported miss on the
approximate index's claim drops that backend's claims as old as the missed one.

**Replicas** (``SimConfig.num_replicas``, ``bench/vsim/replicas.py``): arrivals dealt
round-robin over that many gateway replicas, each with its own view (polls or scrapes at its own
phase); with ``share_approx`` they exchange claims, with ``peer_load`` their in-flight counts,
through ``sy:approx`` (``bench/vsim/approx_share.py``: **share** events, one replica's ``XREAD``
reply each). One replica is the single gateway above, decision for decision.

Nothing is forked: the engine is ``backends.sim.core``, the decision ``routing.schedule``, the
gateway's per-backend record ``backends.fleet.registry.Backend``.

Example::

    result = simulate(SimConfig(num_workers=8, num_requests=2000, rate_per_s=40.0),
                      SharedPrefix(WorkloadOptions(), num_groups=48, seed=1))
    result.ttft_p50_s, result.cached_fraction
"""

from __future__ import annotations

import heapq
import random
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, replace

import orjson

from backends.engine_core.block_manager import KvEvent
from backends.engine_core.sequence import Sequence
from backends.sim.core import SimEngineCore
from bench.common.fleet_modes import MODES
from bench.run.arrivals import gap_s
from bench.vsim.approx_share import ApproxShare
from bench.vsim.config import SimConfig as SimConfig  # re-exported: simulate() takes one
from bench.vsim.metrics import Recorder, RunResult, summarize
from bench.vsim.profiles import MODEL as MODEL  # re-exported: bench.vsim.agreement
from bench.vsim.profiles import PROFILES as PROFILES
from bench.vsim.profiles import no_exact_index
from bench.vsim.replicas import (
    EngineFigures,
    build_replicas,
    build_share,
    heartbeat_figures,
    is_sharing_approx,
)
from bench.vsim.workloads import VRequest, Workload
from gateway.router import RoutePlan

(_STEP_END, _ARRIVAL, _HEARTBEAT, _STALE, _DISPATCH, _POLL, _SCRAPE, _SHARE,
 _SCRAPES_HEARD) = 0, 1, 2, 3, 4, 5, 6, 7, 8


@dataclass(slots=True)
class _InFlight:
    request: VRequest
    plan: RoutePlan
    worker: int
    seq: Sequence
    replica: int
    has_first_token: bool = False


class Simulation:
    """One run's state; ``run()`` once. ``simulate()`` is the usual entry point."""

    def __init__(self, config: SimConfig, workload: Workload,
                 arrivals_s: Seq[float] | None = None) -> None:
        """``arrivals_s``: each request's arrival time (ascending, one per request) in place
        of Poisson arrivals at ``config.rate_per_s``; a replay of a live run's sends."""
        if arrivals_s is not None and len(arrivals_s) != config.num_requests:
            raise ValueError(f"{len(arrivals_s)} arrival times for {config.num_requests} "
                             "requests")
        if config.profile not in PROFILES:
            raise ValueError(f"unknown profile {config.profile!r}; use {', '.join(PROFILES)}")
        if (config.num_workers < 1 or config.num_requests < 1 or config.rate_per_s <= 0
                or config.num_replicas < 1):
            raise ValueError("need num_workers >= 1, num_requests >= 1, rate_per_s > 0 and "
                             "num_replicas >= 1")
        if config.mode not in MODES:
            raise ValueError(f"unknown mode {config.mode!r}; use {', '.join(MODES)}")
        _, index_mode = PROFILES[config.profile]
        if config.mode == "third-party" and index_mode == "exact":
            raise ValueError(no_exact_index(config.profile))
        if config.mode == "third-party" and config.scrape_interval_s <= 0:
            raise ValueError("third-party mode needs scrape_interval_s > 0")
        self.config = config
        self.workload = workload
        worker = config.worker
        self.cores = [SimEngineCore(worker) for _ in range(config.num_workers)]
        self.replicas = build_replicas(config, self.cores)
        # Replica 0's view (the only one with one replica); the exact index is all replicas'.
        first = self.replicas[0]
        self.backends, self.router, self.pages = first.backends, first.router, first.pages
        self.share: ApproxShare | None = build_share(
            config, self.replicas, push=self._push_share, has_work=self._has_work,
            peer_changed=self._peer_changed)
        # With counts shared at once, each change of a replica's books goes out as it is made.
        self._share_load_at_once = (self.share is not None and self.share.is_at_once
                                    and config.peer_load)
        self.recorder = Recorder(config.num_requests, worker.block_size)
        self.busy_s = [0.0] * config.num_workers
        self.is_stepping = [False] * config.num_workers
        self._heap: list[tuple[float, int, int, int]] = []
        self._num_events = 0
        self._kv_queue: list[tuple[float, int, int, list[KvEvent]]] = []  # a heap
        self._num_kv_batches = 0
        self._dispatching: deque[tuple[int, VRequest, RoutePlan, int, int]] = deque()
        # Each worker's latest heartbeat and how many it has sent (replicas read them at polls).
        self._published: list[tuple[float, EngineFigures] | None] = [None] * config.num_workers
        self._num_heartbeats = [0] * config.num_workers
        self._arrivals_s = arrivals_s
        self._in_flight: dict[str, _InFlight] = {}
        self._arrival_rng = random.Random(f"{config.seed}:vsim-arrivals")
        self._num_arrived = 0
        # Shared scrapes on their way to the other replicas: (sender, payload); an event
        # names one by its place here.
        self._scrape_entries: list[tuple[int, bytes]] = []
        self._num_round_scrapes = 0  # /metrics pages read in scrape rounds (not first looks)
        self.index_of = {b.name: i for i, b in enumerate(self.backends)}

    def _push(self, at_s: float, kind: int, worker: int) -> None:
        self._num_events += 1
        heapq.heappush(self._heap, (at_s, self._num_events, kind, worker))

    def _push_share(self, at_s: float, replica: int) -> None:
        self._push(at_s, _SHARE, replica)

    def _peer_changed(self, replica: int, worker: int) -> None:
        self.replicas[replica].router.mark_changed(worker)

    def _booked(self, replica: int, now_s: float, *, urgent: bool = False) -> None:
        """Replica ``replica``'s books changed at ``now_s``: raised (``urgent``, a dispatch)
        or lowered."""
        if self.share is not None:
            self.share.books_changed(replica, now_s, urgent)  # Router.on_booked: the writer
        if self._share_load_at_once:
            assert self.share is not None
            self.share.load_changed(replica, now_s)

    def _phase_s(self, replica: int, interval_s: float) -> float:
        """Replica ``replica``'s polls and scrapes run this long after replica 0's."""
        return interval_s * replica / self.config.num_replicas

    def run(self) -> RunResult:
        started_s = time.perf_counter()
        config = self.config
        if self.pages is None:
            for i in range(config.num_workers):  # every worker is observed idle at the start
                for replica in self.replicas:
                    replica.hear(i, 0.0, heartbeat_figures(self.cores[i]))
                self._next_heartbeat(i, config.heartbeat_s * (i + 1) / config.num_workers, 0.0)
            if config.poll_interval_s > 0:
                for r in range(config.num_replicas):
                    interval_s = config.poll_interval_s
                    self._push(interval_s + self._phase_s(r, interval_s), _POLL, r)
        else:
            for r, replica in enumerate(self.replicas):
                assert replica.pages is not None
                replica.pages.first_look_at(0.0)
                self._scraped(r, range(config.num_workers), 0.0)
                self._send_scrapes(r, 0.0)
                interval_s = config.scrape_interval_s
                self._push(interval_s + self._phase_s(r, interval_s), _SCRAPE, r)
        if self.share is not None:
            self.share.start(0.0)
        self._push(self._next_arrival_s(0.0), _ARRIVAL, -1)
        heap = self._heap
        pop = heapq.heappop
        now_s = 0.0
        while heap:
            now_s, _, kind, worker = pop(heap)
            if kind == _STEP_END:
                self._step_end(worker, now_s)
            elif kind == _ARRIVAL:
                self._arrive(now_s)
            elif kind == _HEARTBEAT:
                self._heartbeat(worker, now_s)
            elif kind == _DISPATCH:
                self._dispatch(now_s)
            elif kind == _SHARE:
                assert self.share is not None
                self.share.wake(worker, now_s)
            elif kind == _POLL:
                self._poll(worker, now_s)
            elif kind == _SCRAPE:
                self._scrape(worker, now_s)
            elif kind == _SCRAPES_HEARD:
                self._scrapes_heard(worker, now_s)
            else:
                for replica in self.replicas:
                    replica.router.mark_changed(worker)
        result = summarize(
            self.recorder, profile=config.profile, mode=config.mode,
            workload=self.workload.name,
            rate_per_s=config.rate_per_s,
            kv_tokens_per_worker=config.worker.kv_capacity_tokens, busy_s=self.busy_s,
            num_preemptions=sum(core.num_preemptions for core in self.cores),
            wall_s=time.perf_counter() - started_s, num_replicas=config.num_replicas,
            is_sharing=config.num_replicas == 1 or is_sharing_approx(config),
            is_peer_load=config.num_replicas == 1 or config.peer_load,
            num_warmup=(config.num_warmup if config.num_warmup is not None
                        else int(config.warmup_fraction * config.num_requests)))
        if self.share is not None and config.num_requests:
            result = replace(result, flushes_per_request=self.share.num_flushes
                             / config.num_requests)
        if self.pages is not None and now_s > 0:  # over the whole run, warm-up included
            result = replace(result, scrapes_per_engine_s=self._num_round_scrapes
                             / config.num_workers / now_s)
        return result

    def _next_arrival_s(self, now_s: float) -> float:
        if self._arrivals_s is not None:
            return self._arrivals_s[self._num_arrived]
        return now_s + gap_s(self.config.rate_per_s, "poisson", 1.0, self._arrival_rng)

    def _arrive(self, now_s: float) -> None:
        index = self._num_arrived
        self._num_arrived += 1
        if self._num_arrived < self.config.num_requests:
            self._push(self._next_arrival_s(now_s), _ARRIVAL, -1)
        kv_queue = self._kv_queue
        while kv_queue and kv_queue[0][0] <= now_s:
            _, _, source, events = heapq.heappop(kv_queue)
            self.router.apply_kv_events(source, events)  # the index every replica reads
        replica = index % self.config.num_replicas  # the round-robin front
        router = self.replicas[replica].router
        request = self.workload.next_request(index)
        plan = router.describe(request)
        ranked = router.rank(plan, now_s)
        self.recorder.group[index] = request.group
        if ranked is None:
            self._reject(index, request, now_s)
            return
        worker, expected_cached_tokens = ranked
        router.started(worker, plan, now_s, expected_cached_tokens)
        self._booked(replica, now_s, urgent=True)
        if self.config.dispatch_s > 0:
            self._dispatching.append((index, request, plan, worker, replica))
            self._push(now_s + self.config.dispatch_s, _DISPATCH, worker)
        else:
            self._admit(index, request, plan, worker, replica, now_s, now_s)

    def _dispatch(self, now_s: float) -> None:
        index, request, plan, worker, replica = self._dispatching.popleft()  # fixed delay: FIFO
        self._admit(index, request, plan, worker, replica, now_s - self.config.dispatch_s, now_s)

    def _admit(self, index: int, request: VRequest, plan: RoutePlan, worker: int, replica: int,
               arrived_s: float, now_s: float) -> None:
        """The request reaches the engine of ``worker`` at ``now_s`` (it arrived at
        ``arrived_s``, when the router sent it there)."""
        try:
            seq = self.cores[worker].add_request(
                str(index), request.prompt_ids, request.max_tokens, now_s)
        except ValueError:  # the engine can never serve it; the gateway relays a 400
            router = self.replicas[replica].router
            router.finished(worker, plan, had_first_token=False)
            self._booked(replica, now_s, urgent=router.gateway.falls_urgently(plan))
            self._reject(index, request, arrived_s)
            return
        recorder = self.recorder
        recorder.arrived(index, arrived_s, seq.block_hashes, seq.num_prompt_tokens)
        recorder.worker[index] = worker
        self._in_flight[seq.seq_id] = _InFlight(request, plan, worker, seq, replica)
        if not self.is_stepping[worker]:
            self._start_step(worker, now_s)

    def _reject(self, index: int, request: VRequest, arrived_s: float) -> None:
        self.recorder.arrived(index, arrived_s, (), len(request.prompt_ids))
        self.workload.finished(request)

    def _start_step(self, worker: int, now_s: float) -> None:
        _, step_s = self.cores[worker].step(now_s)
        self.busy_s[worker] += step_s
        self.is_stepping[worker] = True
        self._push(now_s + step_s, _STEP_END, worker)

    def _step_end(self, worker: int, now_s: float) -> None:
        core = self.cores[worker]
        outcome = core.finish_step(now_s)
        recorder, replicas, in_flight = self.recorder, self.replicas, self._in_flight
        for token in outcome.tokens:
            if not token.is_first and token.finish_reason is None:
                continue
            item = in_flight[token.seq_id]
            index = item.request.index
            router = replicas[item.replica].router
            if token.is_first:
                item.has_first_token = True
                recorder.first_token_s[index] = now_s
                recorder.num_cached_tokens[index] = item.seq.num_cached_tokens
                router.first_token(worker, item.plan)
            if token.finish_reason is not None:
                del in_flight[token.seq_id]
                recorder.finish_s[index] = now_s
                recorder.num_output_tokens[index] = token.num_output_tokens
                if self.config.cache_feedback:  # the usage at the response's end
                    router.learn(worker, item.plan, item.seq.num_prompt_tokens,
                                 recorder.num_cached_tokens[index])
                router.finished(worker, item.plan, had_first_token=True)
                self.workload.finished(item.request)
            if self.share is not None:  # a cache miss's first token goes at once
                self._booked(item.replica, now_s, urgent=token.is_first
                             and router.gateway.falls_urgently(item.plan))
        events = core.drain_kv_events()
        if events and self.router.exact_index is not None:
            self._num_kv_batches += 1
            heapq.heappush(self._kv_queue, (self.config.kv_delivery_s(worker, now_s),
                                            self._num_kv_batches, worker, events))
        if core.has_work:
            self._start_step(worker, now_s)
        else:
            self.is_stepping[worker] = False

    def _heartbeat(self, worker: int, now_s: float) -> None:
        figures = heartbeat_figures(self.cores[worker])
        if self.config.poll_interval_s > 0:
            self._published[worker] = (now_s, figures)  # read by each replica's next poll
            self._num_heartbeats[worker] += 1
        else:
            for replica in self.replicas:
                replica.hear(worker, now_s, figures)
        self._next_heartbeat(worker, now_s + self.config.heartbeat_s, now_s)

    def _poll(self, r: int, now_s: float) -> None:
        """Replica ``r``'s FleetSync reads the latest heartbeats."""
        replica = self.replicas[r]
        num_heard, num_sent = replica.num_heard, self._num_heartbeats
        for worker, published in enumerate(self._published):
            if num_heard[worker] < num_sent[worker]:
                assert published is not None
                replica.hear(worker, *published)
                num_heard[worker] = num_sent[worker]
            else:  # FleetSync re-reads the same heartbeat: the books since it stay
                replica.router.mark_changed(worker)
        if self._num_arrived < self.config.num_requests or self._in_flight:
            self._push(now_s + self.config.poll_interval_s, _POLL, r)

    def _scrape(self, r: int, now_s: float) -> None:
        """Replica ``r``'s FleetSync scrape loop: every engine's ``/metrics`` at once; silent
        ones do not answer (their figures age)."""
        pages = self.replicas[r].pages
        assert pages is not None
        answering: Seq[int] = range(self.config.num_silent_workers, self.config.num_workers)
        scrapes = pages.scrapes
        if scrapes is not None:  # shared: only the engines whose figures are old here
            pages.now_s = now_s
            due = {b.name for b in pages.scrape_round()}
            answering = [w for w in answering if pages.backends[w].name in due]
        for worker in answering:
            pages.scrape(worker, now_s)
        self._num_round_scrapes += len(answering)
        self._scraped(r, answering, now_s)
        self._send_scrapes(r, now_s)
        if self._has_work():
            self._push(now_s + self.config.scrape_interval_s, _SCRAPE, r)

    def _send_scrapes(self, r: int, now_s: float) -> None:
        """What replica ``r`` read in its scrape round goes on ``sy:approx``, and reaches
        every other replica a round trip on."""
        pages = self.replicas[r].pages
        entry = None if pages is None or pages.scrapes is None else pages.scrapes.entry()
        if entry is not None:
            self._scrape_entries.append((r, entry["m"]))
            self._push(now_s + self.config.share_rtt_s, _SCRAPES_HEARD,
                       len(self._scrape_entries) - 1)

    def _scrapes_heard(self, index: int, now_s: float) -> None:
        """Replica ``r``'s shared scrape reaches the others (``ScrapeShare.merge``, which
        hands each engine's figures to their ``FleetSync.hear_figures``)."""
        r, payload = self._scrape_entries[index]
        self._scrape_entries[index] = (r, b"")
        workers = [self.index_of[name] for name in orjson.loads(payload)]
        for other, replica in enumerate(self.replicas):
            if other == r or replica.pages is None or replica.pages.scrapes is None:
                continue
            replica.pages.scrapes.merge(f"r{r}", payload, now_s)
            for worker in workers:
                replica.router.mark_changed(worker)

    def _scraped(self, r: int, workers: Seq[int], now_s: float) -> None:
        config = self.config
        router = self.replicas[r].router
        for worker in workers:
            router.mark_changed(worker)
            if worker < config.num_silent_workers or config.scrape_interval_s > config.max_age_s:
                self._push_stale(worker, now_s)

    def _has_work(self) -> bool:
        return (self._num_arrived < self.config.num_requests or bool(self._in_flight)
                or bool(self._dispatching))

    def _next_heartbeat(self, worker: int, at_s: float, now_s: float) -> None:
        config = self.config
        is_silent = worker < config.num_silent_workers
        if not is_silent and (self._num_arrived < config.num_requests or self._in_flight):
            self._push(at_s, _HEARTBEAT, worker)
        if is_silent or at_s - now_s > config.max_age_s:
            self._push_stale(worker, now_s)

    def _push_stale(self, worker: int, observed_s: float) -> None:
        """Rebuild the router's state just as figures observed at ``observed_s`` turn stale
        (see router.py)."""
        max_age_s = self.config.max_age_s
        self._push(observed_s + max_age_s * (1 + 1e-9) + 1e-9, _STALE, worker)


def simulate(config: SimConfig, workload: Workload,
             arrivals_s: Seq[float] | None = None) -> RunResult:
    """Run ``workload`` through the fleet ``config`` describes; see the module docstring."""
    return Simulation(config, workload, arrivals_s).run()
