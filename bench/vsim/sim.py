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

Nothing is forked: the engine is ``backends.sim.core``, the decision ``routing.schedule``, the
gateway's per-backend record ``backends.fleet.registry.Backend``.

**The live path's fixed latency.** Live, a request reaches the engine a few milliseconds
after the gateway decided (the gateway's work, the loopback hop, the worker parsing and
tokenizing the prompt) and its first token reaches the client a little after the engine's
step ended (the SSE relay, the worker loop's 1 ms timer). ``dispatch_s`` adds that whole
fixed cost before the engine sees the request; ``bench.vsim.agreement`` measures it on an
idle live fleet. It is 0 by default (an ideal gateway).

Example::

    result = simulate(SimConfig(num_workers=8, num_requests=2000, rate_per_s=40.0),
                      SharedPrefix(WorkloadOptions(), num_groups=48, seed=1))
    result.ttft_p50_s, result.cached_fraction
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from backends.engine_core.block_manager import KvEvent
from backends.engine_core.sequence import Sequence
from backends.fleet.profiles import heartbeat_facts
from backends.fleet.registry import Backend
from backends.sim.core import SimEngineCore
from backends.sim.profile import WorkerProfile
from bench.common.fleet_modes import MODES, Mode
from bench.run.arrivals import gap_s
from bench.vsim.metrics import Recorder, RunResult, summarize
from bench.vsim.profiles import MODEL as MODEL  # re-exported: bench.vsim.agreement
from bench.vsim.profiles import PROFILES as PROFILES
from bench.vsim.profiles import no_exact_index
from bench.vsim.router import VirtualRouter
from bench.vsim.scrape import EnginePages
from bench.vsim.workloads import VRequest, Workload
from gateway.router import RoutePlan

_STEP_END, _ARRIVAL, _HEARTBEAT, _STALE, _DISPATCH, _POLL, _SCRAPE = 0, 1, 2, 3, 4, 5, 6


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
    mode: Mode = "own"  # how the gateway knows the engines (module docstring)
    scrape_interval_s: float = 1.0  # FleetSync's /metrics scrape, third-party
    cache_feedback: bool = True  # reported cached tokens go to Router.learn, as live


@dataclass(slots=True)
class _InFlight:
    request: VRequest
    plan: RoutePlan
    worker: int
    seq: Sequence
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
        if config.num_workers < 1 or config.num_requests < 1 or config.rate_per_s <= 0:
            raise ValueError("need num_workers >= 1, num_requests >= 1 and rate_per_s > 0")
        if config.mode not in MODES:
            raise ValueError(f"unknown mode {config.mode!r}; use {', '.join(MODES)}")
        routing_profile, index_mode = PROFILES[config.profile]
        if config.mode == "third-party" and index_mode == "exact":
            raise ValueError(no_exact_index(config.profile))
        if config.mode == "third-party" and config.scrape_interval_s <= 0:
            raise ValueError("third-party mode needs scrape_interval_s > 0")
        self.config = config
        self.workload = workload
        worker = config.worker
        self.cores = [SimEngineCore(worker) for _ in range(config.num_workers)]
        models = frozenset({worker.model})
        self.pages: EnginePages | None = None
        if config.mode == "own":  # joined by heartbeat, profile and all (FleetSync._upsert)
            self.backends = [Backend(f"w{i}", f"vsim://w{i}", models, source="heartbeat")
                             for i in range(config.num_workers)]
            for backend in self.backends:
                backend.learn_profile(heartbeat_facts(worker.to_json()))
        else:  # listed in backends: with no profile: stated; everything else is discovered
            self.backends = [Backend(f"w{i}", f"vsim://w{i}", models)
                             for i in range(config.num_workers)]
            self.pages = EnginePages(self.backends, self.cores)
        self.router = VirtualRouter(
            self.backends, routing_profile, index_mode, model=worker.model,
            block_size=worker.block_size, max_age_s=config.max_age_s,
            approx_ttl_s=config.approx_ttl_s, seed=config.seed)
        self.recorder = Recorder(config.num_requests, worker.block_size)
        self.busy_s = [0.0] * config.num_workers
        self.is_stepping = [False] * config.num_workers
        self._heap: list[tuple[float, int, int, int]] = []
        self._num_events = 0
        self._kv_queue: list[tuple[float, int, int, list[KvEvent]]] = []  # a heap
        self._num_kv_batches = 0
        self._dispatching: deque[tuple[int, VRequest, RoutePlan, int]] = deque()
        self._published: list[tuple[float, EngineFigures] | None] = [None] * config.num_workers
        self._arrivals_s = arrivals_s
        self._in_flight: dict[str, _InFlight] = {}
        self._arrival_rng = random.Random(f"{config.seed}:vsim-arrivals")
        self._num_arrived = 0

    def _push(self, at_s: float, kind: int, worker: int) -> None:
        self._num_events += 1
        heapq.heappush(self._heap, (at_s, self._num_events, kind, worker))

    def run(self) -> RunResult:
        started_s = time.perf_counter()
        config = self.config
        if self.pages is None:
            for i in range(config.num_workers):  # every worker is observed idle at the start
                self._apply(i, 0.0, _figures(self.cores[i]))
                self._next_heartbeat(i, config.heartbeat_s * (i + 1) / config.num_workers, 0.0)
            if config.poll_interval_s > 0:
                self._push(config.poll_interval_s, _POLL, -1)
        else:
            self.pages.first_look_at(0.0)
            self._scraped(range(config.num_workers), 0.0)
        self._push(self._next_arrival_s(0.0), _ARRIVAL, -1)
        heap = self._heap
        pop = heapq.heappop
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
            elif kind == _POLL:
                self._poll(now_s)
            elif kind == _SCRAPE:
                self._scrape(now_s)
            else:
                self.router.mark_changed(worker)
        return summarize(
            self.recorder, profile=config.profile, mode=config.mode,
            workload=self.workload.name,
            rate_per_s=config.rate_per_s,
            kv_tokens_per_worker=config.worker.kv_capacity_tokens, busy_s=self.busy_s,
            num_preemptions=sum(core.num_preemptions for core in self.cores),
            wall_s=time.perf_counter() - started_s,
            num_warmup=(config.num_warmup if config.num_warmup is not None
                        else int(config.warmup_fraction * config.num_requests)))

    def _next_arrival_s(self, now_s: float) -> float:
        if self._arrivals_s is not None:
            return self._arrivals_s[self._num_arrived]
        return now_s + gap_s(self.config.rate_per_s, "poisson", 1.0, self._arrival_rng)

    def _arrive(self, now_s: float) -> None:
        index = self._num_arrived
        self._num_arrived += 1
        if self._num_arrived < self.config.num_requests:
            self._push(self._next_arrival_s(now_s), _ARRIVAL, -1)
        kv_queue, router = self._kv_queue, self.router
        while kv_queue and kv_queue[0][0] <= now_s:
            _, _, source, events = heapq.heappop(kv_queue)
            router.apply_kv_events(source, events)
        request = self.workload.next_request(index)
        plan = router.describe(request)
        ranked = router.rank(plan, now_s)
        self.recorder.group[index] = request.group
        if ranked is None:
            self._reject(index, request, now_s)
            return
        worker, expected_cached_tokens = ranked
        router.started(worker, plan, now_s, expected_cached_tokens)
        if self.config.dispatch_s > 0:
            self._dispatching.append((index, request, plan, worker))
            self._push(now_s + self.config.dispatch_s, _DISPATCH, worker)
        else:
            self._admit(index, request, plan, worker, now_s, now_s)

    def _dispatch(self, now_s: float) -> None:
        index, request, plan, worker = self._dispatching.popleft()  # a fixed delay: FIFO
        self._admit(index, request, plan, worker, now_s - self.config.dispatch_s, now_s)

    def _admit(self, index: int, request: VRequest, plan: RoutePlan, worker: int,
               arrived_s: float, now_s: float) -> None:
        """The request reaches the engine of ``worker`` at ``now_s`` (it arrived at
        ``arrived_s``, when the router sent it there)."""
        try:
            seq = self.cores[worker].add_request(
                str(index), request.prompt_ids, request.max_tokens, now_s)
        except ValueError:  # the engine can never serve it; the gateway relays a 400
            self.router.finished(worker, plan, had_first_token=False)
            self._reject(index, request, arrived_s)
            return
        recorder = self.recorder
        recorder.arrived(index, arrived_s, seq.block_hashes, seq.num_prompt_tokens)
        recorder.worker[index] = worker
        self._in_flight[seq.seq_id] = _InFlight(request, plan, worker, seq)
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
        recorder, router, in_flight = self.recorder, self.router, self._in_flight
        for token in outcome.tokens:
            if not token.is_first and token.finish_reason is None:
                continue
            item = in_flight[token.seq_id]
            index = item.request.index
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
        events = core.drain_kv_events()
        if events and router.exact_index is not None:
            self._num_kv_batches += 1
            heapq.heappush(self._kv_queue, (self._kv_delivery_s(worker, now_s),
                                            self._num_kv_batches, worker, events))
        if core.has_work:
            self._start_step(worker, now_s)
        else:
            self.is_stepping[worker] = False

    def _kv_delivery_s(self, worker: int, now_s: float) -> float:
        """When KV events a worker recorded at ``now_s`` reach the gateway's index: at its
        publisher's next flush (every ``kv_flush_s``, each worker at its own phase)."""
        config = self.config
        flush_s = config.kv_flush_s
        if flush_s <= 0:
            return now_s + config.kv_event_delay_s
        phase_s = flush_s * worker / config.num_workers
        num_ticks = math.floor((now_s - phase_s) / flush_s) + 1
        return phase_s + num_ticks * flush_s + config.kv_event_delay_s

    def _heartbeat(self, worker: int, now_s: float) -> None:
        figures = _figures(self.cores[worker])
        if self.config.poll_interval_s > 0:
            self._published[worker] = (now_s, figures)  # read by the gateway's next poll
        else:
            self._apply(worker, now_s, figures)
        self._next_heartbeat(worker, now_s + self.config.heartbeat_s, now_s)

    def _poll(self, now_s: float) -> None:
        for worker, published in enumerate(self._published):
            if published is not None:
                self._apply(worker, *published)
                self._published[worker] = None
            else:  # FleetSync re-reads the same heartbeat: the books since it stay
                self.router.mark_changed(worker)
        if self._num_arrived < self.config.num_requests or self._in_flight:
            self._push(now_s + self.config.poll_interval_s, _POLL, -1)

    def _scrape(self, now_s: float) -> None:
        """FleetSync's scrape loop: every engine's ``/metrics`` at once; silent ones do not
        answer (their figures age)."""
        assert self.pages is not None
        answering = range(self.config.num_silent_workers, self.config.num_workers)
        for worker in answering:
            self.pages.scrape(worker, now_s)
        self._scraped(answering, now_s)

    def _scraped(self, workers: range, now_s: float) -> None:
        config = self.config
        for worker in workers:
            self.router.mark_changed(worker)
            if worker < config.num_silent_workers or config.scrape_interval_s > config.max_age_s:
                self._push_stale(worker, now_s)
        if self._has_work():
            self._push(now_s + config.scrape_interval_s, _SCRAPE, -1)

    def _has_work(self) -> bool:
        return (self._num_arrived < self.config.num_requests or bool(self._in_flight)
                or bool(self._dispatching))

    def _apply(self, worker: int, observed_s: float, figures: EngineFigures) -> None:
        """The gateway takes in a heartbeat observed at ``observed_s``, as ``FleetSync``."""
        backend = self.backends[worker]
        backend.load_source = "heartbeat"
        (backend.num_running, backend.num_waiting, backend.kv_usage,
         backend.num_queued_prefill_tokens, backend.num_prefix_kv_blocks) = figures
        backend.load_observed(observed_s)
        self.router.mark_changed(worker)

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


# A heartbeat's load figures: running, waiting, KV usage, queued prefill tokens, prefix blocks.
EngineFigures = tuple[int, int, float, int, int]


def _figures(core: SimEngineCore) -> EngineFigures:
    return (core.num_running, core.num_waiting, core.kv_usage, core.num_queued_prefill_tokens,
            core.block_manager.num_prefix_blocks)


def simulate(config: SimConfig, workload: Workload,
             arrivals_s: Seq[float] | None = None) -> RunResult:
    """Run ``workload`` through the fleet ``config`` describes; see the module docstring."""
    return Simulation(config, workload, arrivals_s).run()
