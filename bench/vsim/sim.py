"""The virtual-time fleet: ``SimEngineCore`` workers and a ``VirtualRouter`` on one event heap.

Events, in time order (ties in the order they were scheduled):

- **arrival** (Poisson, ``bench.run.arrivals.gap_s``): KV events due by now reach the exact
  index, the router describes and ranks the request and it is added to the first-ranked
  worker's core; an idle worker starts a step at once;
- **step end**, per worker: the loop of ``backends/sim/worker.py`` without the sleeping --
  ``step(now)`` priced a step, now ``finish_step(end)``; first tokens and finishes update the
  records and the router's in-flight books; the step's KV events are queued for delivery
  ``kv_event_delay_s`` later; the next step starts if the core has work;
- **heartbeat**, per worker at time 0 and then every ``heartbeat_s`` (phases spread over the
  interval): the router's ``Backend`` gets the core's running / waiting / KV usage / queued
  prefill figures, observed now; their age is what ``schedule()``'s fresh filter judges. The
  first ``num_silent_workers`` send the one at time 0 and then fall silent (lost heartbeats);
- **stale**: the moment a worker's figures exceed ``max_age_s`` with no newer heartbeat due
  before (silent workers, or ``heartbeat_s > max_age_s``).

Nothing is forked: the engine is ``backends.sim.core``, the decision ``routing.schedule``, the
gateway's per-backend record ``backends.registry.Backend``.

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
from dataclasses import dataclass, field

from backends.fleet import profile_from_heartbeat
from backends.registry import Backend
from backends.sim.block_manager import KvEvent
from backends.sim.core import SimEngineCore
from backends.sim.profile import WorkerProfile
from backends.sim.sequence import Sequence
from bench.run.arrivals import gap_s
from bench.vsim.metrics import Recorder, RunResult, summarize
from bench.vsim.router import VirtualRouter
from bench.vsim.workloads import VRequest, Workload
from gateway.router import RoutePlan

MODEL = "vsim-llama-3-8b"
# vsim profile -> (routing profile, prefix index mode)
PROFILES: dict[str, tuple[str, str]] = {
    "round_robin": ("round_robin", "none"),
    "random": ("random", "none"),
    "least_load": ("least_load", "none"),
    "power_of_two": ("power_of_two", "none"),
    "prefix_affinity": ("prefix_affinity", "exact"),
    "prefix_affinity_approx": ("prefix_affinity", "approx"),
    "prefix_affinity_no_room": ("prefix_affinity_no_room", "exact"),
    "prefix_affinity_no_room_approx": ("prefix_affinity_no_room", "approx"),
}
_STEP_END, _ARRIVAL, _HEARTBEAT, _STALE = 0, 1, 2, 3


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
    kv_event_delay_s: float = 0.05
    max_age_s: float = 5.0
    approx_ttl_s: float = 600.0
    num_silent_workers: int = 0
    warmup_fraction: float = 0.1  # of requests, simulated but left out of the figures


@dataclass(slots=True)
class _InFlight:
    request: VRequest
    plan: RoutePlan
    worker: int
    seq: Sequence
    has_first_token: bool = False


class Simulation:
    """One run's state; ``run()`` once. ``simulate()`` is the usual entry point."""

    def __init__(self, config: SimConfig, workload: Workload) -> None:
        if config.profile not in PROFILES:
            raise ValueError(f"unknown profile {config.profile!r}; use {', '.join(PROFILES)}")
        if config.num_workers < 1 or config.num_requests < 1 or config.rate_per_s <= 0:
            raise ValueError("need num_workers >= 1, num_requests >= 1 and rate_per_s > 0")
        self.config = config
        self.workload = workload
        routing_profile, index_mode = PROFILES[config.profile]
        worker = config.worker
        backend_profile = profile_from_heartbeat({"profile": worker.to_json()})
        self.cores = [SimEngineCore(worker) for _ in range(config.num_workers)]
        self.backends = [Backend(f"w{i}", f"vsim://w{i}", frozenset({worker.model}),
                                 source="heartbeat", profile=backend_profile)
                         for i in range(config.num_workers)]
        self.router = VirtualRouter(
            self.backends, routing_profile, index_mode, model=worker.model,
            block_size=worker.block_size, max_age_s=config.max_age_s,
            approx_ttl_s=config.approx_ttl_s, seed=config.seed)
        self.recorder = Recorder(config.num_requests, worker.block_size)
        self.busy_s = [0.0] * config.num_workers
        self.is_stepping = [False] * config.num_workers
        self._heap: list[tuple[float, int, int, int]] = []
        self._num_events = 0
        self._kv_queue: deque[tuple[float, int, list[KvEvent]]] = deque()
        self._in_flight: dict[str, _InFlight] = {}
        self._arrival_rng = random.Random(f"{config.seed}:vsim-arrivals")
        self._num_arrived = 0

    def _push(self, at_s: float, kind: int, worker: int) -> None:
        self._num_events += 1
        heapq.heappush(self._heap, (at_s, self._num_events, kind, worker))

    def run(self) -> RunResult:
        started_s = time.perf_counter()
        config = self.config
        for i in range(config.num_workers):  # every worker is observed idle at the start
            self._observe(i, 0.0)
            self._next_heartbeat(i, config.heartbeat_s * (i + 1) / config.num_workers, 0.0)
        self._push(gap_s(config.rate_per_s, "poisson", 1.0, self._arrival_rng), _ARRIVAL, -1)
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
            else:
                self.router.mark_changed(worker)
        return summarize(
            self.recorder, profile=config.profile, workload=self.workload.name,
            rate_per_s=config.rate_per_s,
            kv_tokens_per_worker=config.worker.kv_capacity_tokens, busy_s=self.busy_s,
            num_preemptions=sum(core.num_preemptions for core in self.cores),
            wall_s=time.perf_counter() - started_s,
            num_warmup=int(config.warmup_fraction * config.num_requests))

    def _arrive(self, now_s: float) -> None:
        index = self._num_arrived
        self._num_arrived += 1
        if self._num_arrived < self.config.num_requests:
            self._push(now_s + gap_s(self.config.rate_per_s, "poisson", 1.0, self._arrival_rng),
                       _ARRIVAL, -1)
        kv_queue, router = self._kv_queue, self.router
        while kv_queue and kv_queue[0][0] <= now_s:
            _, source, events = kv_queue.popleft()
            router.apply_kv_events(source, events)
        request = self.workload.next_request(index)
        plan = router.describe(request)
        worker = router.rank(plan, now_s)
        seq = None
        if worker is not None:
            try:
                seq = self.cores[worker].add_request(
                    str(index), request.prompt_ids, request.max_tokens, now_s)
            except ValueError:  # the engine can never serve it; the gateway would relay a 400
                seq = None
        recorder = self.recorder
        recorder.group[index] = request.group
        if seq is None or worker is None:
            recorder.arrived(index, now_s, (), len(request.prompt_ids))
            self.workload.finished(request)
            return
        recorder.arrived(index, now_s, seq.block_hashes, seq.num_prompt_tokens)
        recorder.worker[index] = worker
        self._in_flight[seq.seq_id] = _InFlight(request, plan, worker, seq)
        router.started(worker, plan, now_s)
        if not self.is_stepping[worker]:
            self._start_step(worker, now_s)

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
                router.finished(worker, item.plan, had_first_token=True)
                self.workload.finished(item.request)
        events = core.drain_kv_events()
        if events and router.exact_index is not None:
            self._kv_queue.append((now_s + self.config.kv_event_delay_s, worker, events))
        if core.has_work:
            self._start_step(worker, now_s)
        else:
            self.is_stepping[worker] = False

    def _heartbeat(self, worker: int, now_s: float) -> None:
        self._observe(worker, now_s)
        self._next_heartbeat(worker, now_s + self.config.heartbeat_s, now_s)

    def _observe(self, worker: int, now_s: float) -> None:
        core, backend = self.cores[worker], self.backends[worker]
        backend.load_observed_s = now_s
        backend.num_running = core.num_running
        backend.num_waiting = core.num_waiting
        backend.kv_usage = core.kv_usage
        backend.num_queued_prefill_tokens = core.num_queued_prefill_tokens
        backend.num_prefix_kv_blocks = core.block_manager.num_prefix_blocks
        self.router.mark_changed(worker)

    def _next_heartbeat(self, worker: int, at_s: float, now_s: float) -> None:
        config = self.config
        is_silent = worker < config.num_silent_workers
        if not is_silent and (self._num_arrived < config.num_requests or self._in_flight):
            self._push(at_s, _HEARTBEAT, worker)
        if is_silent or at_s - now_s > config.max_age_s:
            # rebuild the router's state just as these figures turn stale (see router.py)
            self._push(now_s + config.max_age_s * (1 + 1e-9) + 1e-9, _STALE, worker)


def simulate(config: SimConfig, workload: Workload) -> RunResult:
    """Run ``workload`` through the fleet ``config`` describes; see the module docstring."""
    return Simulation(config, workload).run()
