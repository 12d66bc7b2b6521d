"""The fleet the gateway knows: backends, the models each serves, and their health.

Which backend serves a request is decided by ``routing.schedule`` over ``Backend.state()``
snapshots (``gateway/router.py``); the registry only keeps the fleet current.

Example::

    registry = BackendRegistry([Backend("a", "http://127.0.0.1:19001", frozenset({"m"}))])
    registry.for_model("m")[0].state(now_s=0.0).is_healthy
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from math import inf
from typing import Any

from backends.fleet.breaker import Breaker, BreakerConfig
from backends.fleet.cache_feedback import CacheFeedback
from backends.fleet.profiles import ProfileFacts, merge
from routing.types import BackendProfile, BackendState

log = logging.getLogger(__name__)

# Where a backend's load figures come from: its heartbeat, its scraped /metrics, or (an engine
# that exposes neither) this gateway's own books: what it sent and has not seen finish, which
# is the engine's whole load when this gateway is its only client, and is always current.
LOAD_SOURCES = ("heartbeat", "metrics", "books")


@dataclass(eq=False, slots=True)
class Backend:
    name: str
    url: str
    models: frozenset[str]
    weight: float = 1.0
    health_path: str = "/health"
    api_key: str | None = None
    is_healthy: bool = True
    num_consecutive_failures: int = 0
    last_error: str = ""
    source: str = "config"  # "config" (listed, health-probed) or "heartbeat" (joined via Redis)
    profile: BackendProfile = field(default_factory=BackendProfile)
    # What the configuration states of the profile, what each source told (heartbeat, the
    # engine's pages), and which source each field of ``profile`` came from.
    stated_profile: ProfileFacts = field(default_factory=lambda: ProfileFacts("config"))
    discover_profile: bool = True
    learned_profiles: dict[str, ProfileFacts] = field(default_factory=dict)
    profile_sources: dict[str, str] = field(default_factory=dict)
    load_source: str | None = None  # one of LOAD_SOURCES; None until first observed
    # What its responses said of its prefix cache, against what routing expected.
    cache_feedback: CacheFeedback = field(default_factory=CacheFeedback)
    # Load, from the worker's heartbeat or its scraped /metrics, observed at load_observed_s
    # (monotonic clock); None until first observed.
    load_observed_s: float | None = None
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_queued_prefill_tokens: int = 0
    num_prefix_kv_blocks: int | None = None  # heartbeat only; None for scraped engines
    # What this gateway has sent and not yet finished.
    num_in_flight: int = 0
    num_in_flight_tokens: int = 0
    num_in_flight_prompt_tokens: int = 0  # sent, no first token yet: the fresh prefill backlog
    # Requests this gateway saw finish since the engine's figures were observed: the engine
    # has fewer running (or waiting) than it last said, by at least this many.
    num_finished_since_load: int = 0
    # Requests this gateway sent before the engine's figures were observed that have had their
    # first token since: any of them the engine counted waiting then runs now.
    num_started_since_load: int = 0
    # Streams this gateway has in flight on their last step (``Router.nearly_done``).
    num_ending: int = 0
    # Every request this gateway saw finish here, and every one counted into
    # ``num_started_since_load``, ever: what ``backends.fleet.peer_load`` tells the other
    # replicas (as the change since its last entry).
    num_finished_total: int = 0
    num_started_total: int = 0
    # What the other gateway replicas have in flight here, as they last said (at most about
    # 0.1 s ago; ``backends.fleet.peer_load``): ``state`` adds it to this gateway's own. And
    # their corrections to the engine's last figures: their streams on the last step, and the
    # finishes and first tokens they told of since this gateway's last observation.
    peer_in_flight: int = 0
    peer_in_flight_tokens: int = 0
    peer_in_flight_prompt_tokens: int = 0
    peer_ending: int = 0
    peer_finished_since_load: int = 0
    peer_started_since_load: int = 0
    # Outlier ejection from what its requests met (``BackendRegistry.request_failed``).
    breaker: Breaker = field(default_factory=Breaker)
    # Responses sent here that wait for their first byte: failed at once (``BackendDown``)
    # when the backend is marked down, so their requests go elsewhere instead of waiting.
    awaiting_head: set[Any] = field(default_factory=set)
    # The last state() and the time it was taken for. Every method here that changes a field
    # state() reads drops it; code elsewhere that sets such a field calls ``invalidate()``.
    _state: BackendState | None = field(default=None, init=False, repr=False)
    _state_now_s: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.stated_profile.values:
            self._merge_profile()

    def invalidate(self) -> None:
        """Drop the cached ``state()``: after setting, from outside this class, any field it
        reads (load figures, health, weight, the peers' counts)."""
        self._state = None

    def learn_profile(self, facts: ProfileFacts) -> None:
        """Take what one source says of the profile; the stated fields still win."""
        if self.learned_profiles.get(facts.source) == facts:
            return
        self.learned_profiles[facts.source] = facts
        self._merge_profile()

    def _merge_profile(self) -> None:
        learned = self.learned_profiles
        heartbeat = [learned["heartbeat"]] if "heartbeat" in learned else []
        others = [f for name, f in learned.items() if name != "heartbeat"]
        self.profile, self.profile_sources = merge([self.stated_profile, *heartbeat, *others])
        self._state = None

    def configure(self, *, weight: float, health_path: str, api_key: str | None,
                  stated_profile: ProfileFacts, discover_profile: bool) -> None:
        """What the configuration says of a listed engine, changed (a reload): the stated
        profile fields win over what was learned, as at start."""
        self.weight = weight
        self.health_path = health_path
        self.api_key = api_key
        self.discover_profile = discover_profile
        self.stated_profile = stated_profile
        self._merge_profile()

    # -- this gateway's books: what it sent here, and what became of it --------------------
    # Called by the gateway's router and the virtual-time simulator's alike.
    def book_started(self, reserved_tokens: int, pending_prefill_tokens: int) -> None:
        """A request went upstream here: ``pending_prefill_tokens`` of its prompt to compute
        (a cache hit costs the engine almost nothing), ``reserved_tokens`` of KV at most."""
        self.num_in_flight += 1
        self.num_in_flight_tokens += reserved_tokens
        self.num_in_flight_prompt_tokens += pending_prefill_tokens
        self.breaker.sent()
        self._state = None

    def book_first_token(self, pending_prefill_tokens: int, sent_s: float) -> None:
        """A request sent at ``sent_s`` has its first token: its prefill is done, and if the
        engine's figures were observed after it was sent, it counted waiting there and runs
        now."""
        self.num_in_flight_prompt_tokens -= pending_prefill_tokens
        if self.load_observed_s is not None and sent_s <= self.load_observed_s:
            self.num_started_since_load += 1
            self.num_started_total += 1
        self._state = None

    def book_ending(self) -> None:
        """A stream is on its last step: its slot counts as free (``BackendState.num_holding``).
        Once per request; ``book_finished(was_ending=True)`` undoes it."""
        self.num_ending += 1
        self._state = None

    def book_finished(self, reserved_tokens: int, pending_prefill_tokens: int, *,
                      had_first_token: bool, was_ending: bool) -> None:
        """A request ended (answered, failed or abandoned): the engine runs one fewer than its
        last figures said until the next observation."""
        if was_ending:
            self.num_ending -= 1
        self.breaker.settled()
        self.num_in_flight -= 1
        self.num_in_flight_tokens -= reserved_tokens
        self.num_finished_since_load += 1
        self.num_finished_total += 1
        if not had_first_token:
            self.num_in_flight_prompt_tokens -= pending_prefill_tokens
        self._state = None

    def load_observed(self, observed_s: float, *, is_new: bool = True) -> None:
        """The engine's figures were read, as of ``observed_s`` (monotonic): a new observation
        starts the books kept since it afresh; the same one read again keeps them (they still
        count those requests)."""
        self.load_observed_s = observed_s
        if is_new:
            self.num_finished_since_load = self.num_started_since_load = 0
            self.peer_finished_since_load = self.peer_started_since_load = 0
        self._state = None

    def state(self, now_s: float) -> BackendState:
        """This backend as routing sees it at ``now_s`` (monotonic).

        The same object again while no field changed and ``now_s`` is the same, so a fleet
        snapshot taken for one reference time (``gateway/router.py``) rebuilds only the
        backends that changed. ``age_s`` is ``now_s`` less the time the load was observed: when
        ``now_s`` is such a reference time and the load was observed after it, it is negative,
        and ``routing`` (which adds the snapshot's own age, ``Cycle.stale_after_s``) still gets
        the exact age."""
        cached = self._state
        if cached is not None and self._state_now_s == now_s:
            return cached
        kv_usage = self.kv_usage
        # Sent here by this replica, and by the others as they last said.
        in_flight = self.num_in_flight + self.peer_in_flight
        in_flight_tokens = self.num_in_flight_tokens + self.peer_in_flight_tokens
        num_ending = self.num_ending + self.peer_ending
        if self.load_source == "books":
            # The gateways' own counts: current, and all the engine runs if they are its only
            # clients. Beyond max_batch the engine queues; KV is what those requests reserved.
            age_s = 0.0
            max_batch = self.profile.max_batch
            num_running = in_flight if max_batch is None else min(in_flight, max_batch)
            # Beyond the slots the streams on their last step free as it ends.
            num_waiting = max(0, in_flight - num_ending - num_running)
            capacity = self.profile.kv_capacity_tokens
            kv_usage = min(1.0, in_flight_tokens / capacity) if capacity else 0.0
        else:
            # Never observed: stale, so routing treats it as unknown, never as idle.
            age_s = inf if self.load_observed_s is None else now_s - self.load_observed_s
            # Those that finished since left the running ones (or, past them, the waiting ones).
            running = self.num_running_reported
            waiting = self.num_waiting - (running - self.num_running)
            finished = self.num_finished_since_load + self.peer_finished_since_load
            num_running = max(0, running - finished)
            num_waiting = max(0, waiting - max(0, finished - running))
        state = BackendState(
            name=self.name, models=self.models, is_healthy=self.admits(now_s), age_s=age_s,
            weight=self.weight, profile=self.profile, num_running=num_running,
            num_waiting=num_waiting, kv_usage=kv_usage,
            num_queued_prefill_tokens=self.num_queued_prefill_tokens,
            num_in_flight=in_flight, num_in_flight_tokens=in_flight_tokens,
            num_in_flight_prompt_tokens=(self.num_in_flight_prompt_tokens
                                         + self.peer_in_flight_prompt_tokens),
            num_ending=num_ending, num_prefix_kv_blocks=self.num_prefix_kv_blocks,
            source=self.source,
        )
        self._state = state
        self._state_now_s = now_s
        return state

    @property
    def num_running_reported(self) -> int:
        """What the engine last said it runs, with the requests it counted waiting that have
        had a first token since (they run now, and are waiting no more): the figure ``state``
        and ``admission.finishes`` subtract the ends seen after its report from."""
        started = self.num_started_since_load + self.peer_started_since_load
        return self.num_running + min(started, self.num_waiting)

    def mark_success(self) -> None:
        self.is_healthy = True
        self.num_consecutive_failures = 0
        self.last_error = ""
        self._state = None

    def mark_failure(self, reason: str) -> None:
        """A failed request or probe takes the backend out until a probe succeeds (or, for a
        worker, a new heartbeat); requests that wait for its first byte are failed now."""
        was_healthy = self.is_healthy
        self.is_healthy = False
        self.num_consecutive_failures += 1
        self.last_error = reason
        self._state = None
        if was_healthy:
            self.fail_waiting(reason)

    def fail_waiting(self, reason: str) -> None:
        """Fail every request sent here that has had no byte back (``BackendDown``): the
        gateway retries them on another backend before the client has seen anything."""
        waiting, self.awaiting_head = self.awaiting_head, set()
        for response in waiting:
            response.interrupt(BackendDown(f"backend {self.name!r} was marked down ({reason})"))

    def admits(self, now_s: float) -> bool:
        """Healthy, and its breaker lets a request through now."""
        return self.is_healthy and self.breaker.admits(now_s)


class BackendDown(Exception):
    """The backend was marked down while a request waited for its first byte."""


class BackendRegistry:
    """Backends by name and by model; workers join and leave at run time (``add``/``remove``).
    It also ejects outliers (``request_failed`` / ``request_succeeded``, see ``breaker``)."""

    def __init__(self, backends: list[Backend], breaker: BreakerConfig | None = None) -> None:
        self.breaker_config = breaker or BreakerConfig()
        for backend in backends:
            backend.breaker = Breaker(self.breaker_config)
        self.backends = list(backends)
        self._by_model: dict[str, list[Backend]] = {}
        self._by_name: dict[str, Backend] = {}
        self.version = 0  # bumped on every membership change
        self._reindex()

    def _reindex(self) -> None:
        self._by_model = {}
        for backend in self.backends:
            for model in backend.models:
                self._by_model.setdefault(model, []).append(backend)
        self._by_name = {b.name: b for b in self.backends}
        self.version += 1

    def get(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    def add(self, backend: Backend) -> None:
        if backend.name in self._by_name:
            raise ValueError(f"backend {backend.name!r} is already registered")
        backend.breaker = Breaker(self.breaker_config)
        self.backends.append(backend)
        self._reindex()

    def remove(self, name: str) -> Backend | None:
        backend = self._by_name.get(name)
        if backend is not None:
            self.backends.remove(backend)
            self._reindex()
            backend.fail_waiting("it left the fleet")
        return backend

    def for_model(self, model: str) -> list[Backend]:
        return self._by_model.get(model, [])

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def serves(self, model: str) -> bool:
        return model in self._by_model

    def num_healthy(self) -> int:
        return sum(1 for b in self.backends if b.is_healthy)

    # -- outlier ejection ------------------------------------------------------------------
    def request_failed(self, backend: Backend, reason: str, now_s: float) -> bool:
        """A request failed on ``backend`` (connection, timeout, 5xx, broken body); True when
        that ejected it."""
        if not self.breaker_config.enabled or not backend.breaker.failed(now_s, reason):
            return False
        return self._eject(backend, now_s)

    def request_succeeded(self, backend: Backend, now_s: float,
                          first_byte_s: float | None = None) -> None:
        """A request got a response head below 500 (a stream's after ``first_byte_s``)."""
        if not self.breaker_config.enabled:
            return
        backend.breaker.succeeded(now_s, first_byte_s)
        config = self.breaker_config
        if first_byte_s is None or not config.latency_factor:
            return
        median_s = backend.breaker.median_latency_s()
        if median_s is None or median_s < config.latency_min_s:
            return
        others = [m for b in self._peers(backend) if b is not backend
                  and b.breaker.state == "closed"
                  and (m := b.breaker.median_latency_s()) is not None]
        if not others:
            return
        typical_s = statistics.median(others)
        if median_s > config.latency_factor * typical_s:
            self._eject(backend, now_s, f"latency outlier: median time to first byte "
                        f"{median_s:.2f} s against {typical_s:.2f} s on the others")

    def _peers(self, backend: Backend) -> list[Backend]:
        """The backends that share a model with ``backend`` (itself included)."""
        return list({id(b): b for model in backend.models for b in self.for_model(model)}
                    .values())

    def _eject(self, backend: Backend, now_s: float, reason: str | None = None) -> bool:
        peers = self._peers(backend)
        num_ejected = sum(1 for b in peers if b is not backend and b.breaker.state == "open"
                          and b.breaker.opened_until_s > now_s)
        if num_ejected + 1 > self.breaker_config.max_ejected_share * len(peers):
            log.warning("backend %s would be ejected (%s) but %d of its %d peers already are "
                        "(max_ejected_share %.2f): kept in", backend.name,
                        reason or backend.breaker.reason, num_ejected, len(peers),
                        self.breaker_config.max_ejected_share)
            return False
        duration_s = backend.breaker.eject(now_s, reason)
        backend.invalidate()  # routing sees it out from now
        log.warning("backend %s ejected for %.0f s: %s", backend.name, duration_s,
                    backend.breaker.reason)
        return True

