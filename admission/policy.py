"""The admission decision: admit now, queue in the gateway, or reject with a 503.

``decide`` reads one fleet snapshot and the TTFT predictor and returns a ``Decision``:

- **admit** when the fleet has capacity (``fleet_has_capacity``) and the quickest backend's
  predicted TTFT, plus any time already waited, meets the tier's target;
- otherwise, by the tier's ``on_overload``: ``reject`` answers at once (503, ``Retry-After``
  and the reason) — unless the fleet is saturated and the request could still meet its SLO
  from the front of the queue (it goes ahead of every lower tier): then it waits there, at
  most until that stops being true; ``queue_until_deadline`` and ``queue``
  wait in ``FairQueue`` until ``tier.queue_deadline_s(arrival_s)`` (the TTFT SLO or
  ``max_queue_wait_s``: see ``Tier.max_wait_s``), and are answered with a 503 if still
  waiting then.

The target is the TTFT SLO, except for a request the fleet could not serve within its SLO
even idle (its own prefill is too long): rejecting that would not help, so its target is its
idle TTFT times ``1 + oversize_slack``. A queueing tier with requests of its own or a higher
tier already waiting is queued too, so that arrivals do not overtake the queue.

Capacity: a backend has room when its figures are fresh and it has at most ``max_waiting``
waiting requests, (when it advertises ``max_batch``) a free batch slot, and KV for the
request: by the fit rule (``routing.fit``: the request's uncached prompt tokens and expected
output against the free KV) when its KV capacity is known, by ``max_kv_usage`` only when it
states neither capacity nor ``max_batch``. A stale backend's load is unknown, never idle:
it counts as having room only while this gateway has fewer than ``stale_max_in_flight``
requests on it (its own, always current, count). The dispatcher pops the queue only while
``fleet_has_capacity`` holds, so overload waits in the gateway, where tiers and tenants are
ordered, rather than in the workers' FIFO queues.

Admission only decides when a request starts: a stream that has started is never cancelled
to make room for another, whatever its tier.

Example::

    request = AdmissionRequest(tier=tiers["standard"], tenant="acme", prompt_tokens=1800,
                               model="m")
    decision = decide(request, snapshot, predictor, now_s, num_queued_ahead=queue.num_ahead(
        request.tier))
    decision.action, decision.reason        # ("queue", "fleet saturated: ...")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from admission.headroom import free_slots
from admission.predictor import TtftFeatures
from admission.tiers import Tier
from routing.fit import free_kv_tokens, needed_kv_tokens
from routing.types import BackendState, FleetSnapshot, PrefixMatch

Action = Literal["admit", "queue", "reject"]
# Why a decision went the way it did: a bounded set, for metric labels and clients' logs.
Reason = Literal[
    "admitted",         # the quickest backend's predicted TTFT meets the tier's target
    "queued_ahead",     # requests of this or a higher tier are queued ahead
    "held_for_higher",  # the last free slots are kept for higher tiers' expected arrivals
    "saturated",        # no backend has a free slot and KV for the request
    "slo_miss",         # the predicted TTFT exceeds the tier's target
    "deadline",         # the tier's queue deadline passed (before queueing or in the queue)
    "queue_full",       # the admission queue has no room
    "no_backend",       # no healthy backend serves the model
]


class TtftEstimator(Protocol):
    """What the policy needs of a predictor (``TtftPredictor`` is one)."""

    def predict_s(self, backend: BackendState, features: TtftFeatures) -> float: ...

    def margin_s(self, backend: BackendState) -> float: ...

    def quickest(self, backends: Sequence[BackendState], uncached_tokens: Sequence[int], *,
                 max_age_s: float, worst_queued_tokens: int = 0) -> tuple[int, float]: ...


@dataclass(slots=True, init=False)
class AdmissionRequest:
    """What admission knows about one request.

    ``uncached_tokens``: an int applies to every backend (a best case); a mapping gives it per
    backend (missing backends: the whole prompt); None derives it from ``snapshot.prefix``.
    ``arrival_s`` None means it arrives now.
    """

    tier: Tier
    tenant: str
    prompt_tokens: int
    uncached_tokens: int | Mapping[str, int] | None
    model: str | None
    arrival_s: float | None
    max_tokens: int | None  # the output cap, for the KV it needs (routing.fit)

    def __init__(self, tier: Tier, tenant: str, prompt_tokens: int,
                 uncached_tokens: int | Mapping[str, int] | None = None, model: str | None = None,
                 arrival_s: float | None = None, max_tokens: int | None = None) -> None:
        self.tier = tier
        self.tenant = tenant
        self.prompt_tokens = prompt_tokens
        self.uncached_tokens = uncached_tokens
        self.model = model
        self.arrival_s = arrival_s
        self.max_tokens = max_tokens

    def uncached_for_each(self, backends: Sequence[BackendState], prefix: PrefixMatch
                          ) -> list[int]:
        """``uncached_for`` of each of ``backends``, the branch taken once."""
        uncached = self.uncached_tokens
        if isinstance(uncached, int):
            return [uncached] * len(backends)
        if uncached is not None:
            return [uncached.get(b.name, self.prompt_tokens) for b in backends]
        prompt, block_tokens, held = self.prompt_tokens, prefix.block_tokens, prefix.num_blocks
        if not held:
            return [max(0, prompt)] * len(backends)
        return [max(0, prompt - held.get(b.name, 0) * block_tokens) for b in backends]

    def uncached_for(self, backend: str, prefix: PrefixMatch) -> int:
        if isinstance(self.uncached_tokens, int):
            return self.uncached_tokens
        if self.uncached_tokens is not None:
            return self.uncached_tokens.get(backend, self.prompt_tokens)
        cached = prefix.num_blocks.get(backend, 0) * prefix.block_tokens
        return max(0, self.prompt_tokens - cached)


@dataclass(slots=True, init=False)
class Decision:
    """The verdict. ``retry_after_s`` is set on reject, ``deadline_s`` on queue."""

    action: Action
    reason: str  # for people: what happened and the figures behind it
    code: Reason
    predicted_ttft_s: float | None  # on the quickest backend
    retry_after_s: float | None
    deadline_s: float | None
    backend: str | None  # the quickest backend by prediction (routing still decides)

    def __init__(self, action: Action, reason: str, code: Reason = "admitted",
                 predicted_ttft_s: float | None = None, retry_after_s: float | None = None,
                 deadline_s: float | None = None, backend: str | None = None) -> None:
        self.action = action
        self.reason = reason
        self.code = code
        self.predicted_ttft_s = predicted_ttft_s
        self.retry_after_s = retry_after_s
        self.deadline_s = deadline_s
        self.backend = backend


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Saturation thresholds and reply tuning."""

    max_waiting: int = 0
    max_kv_usage: float = 0.95
    stale_max_in_flight: int = 4
    # This gateway's own, always-current view: prompt tokens it sent that have no first token
    # yet. The engine's figures are a heartbeat old; this stops a burst between two of them.
    max_pending_prefill_tokens: int = 8192
    oversize_slack: float = 0.5
    min_retry_after_s: float = 1.0
    max_retry_after_s: float = 60.0


DEFAULT_POLICY = PolicyConfig()
# An admitted request's reason is never shown to anyone; formatting one per request cost more
# than the rest of the decision. (``predicted_ttft_s`` and ``backend`` carry the figures.)
_ADMIT_REASON = "the quickest backend's predicted TTFT meets the tier's target"


def backend_has_capacity(backend: BackendState, *, max_age_s: float,
                         config: PolicyConfig = DEFAULT_POLICY,
                         needed_kv_tokens: int = 0) -> bool:
    """Whether one more request would start on ``backend`` without waiting in its queue.

    ``needed_kv_tokens``: the new KV the request needs there (``routing.fit``; 0 when the
    request is not known, as for the dispatcher's gate). KV is judged by the fit rule when
    the backend's capacity is known; otherwise a free batch slot (``max_batch``) and an
    empty engine queue say it all, and only a backend that states neither falls back on
    the ``max_kv_usage`` gauge threshold."""
    if not backend.is_healthy:
        return False
    if backend.age_s > max_age_s:
        return backend.num_in_flight < config.stale_max_in_flight
    max_batch = backend.profile.max_batch
    num_running = backend.num_holding
    if (backend.num_waiting > config.max_waiting
            or backend.num_in_flight_prompt_tokens > config.max_pending_prefill_tokens
            or (max_batch is not None and num_running >= max_batch)):
        return False
    free_tokens = free_kv_tokens(backend, max_age_s=max_age_s)
    if free_tokens is not None:
        return 0 < free_tokens >= needed_kv_tokens
    return max_batch is not None or backend.kv_usage < config.max_kv_usage


def fleet_has_capacity(snapshot: FleetSnapshot, config: PolicyConfig = DEFAULT_POLICY,
                       model: str | None = None) -> bool:
    """Whether any backend (serving ``model``, if given) has room: the dispatcher's gate."""
    return any(backend_has_capacity(b, max_age_s=snapshot.max_age_s, config=config)
               for b in snapshot.backends if model is None or model in b.models)


def fleet_free_slots(snapshot: FleetSnapshot, config: PolicyConfig = DEFAULT_POLICY,
                     model: str | None = None) -> tuple[int, int] | None:
    """``admission.headroom.free_slots`` counting only backends with room
    (``backend_has_capacity``): the slots the dispatcher can actually fill now."""
    max_age_s = snapshot.max_age_s
    return free_slots(snapshot, model=model, has_room=lambda b: backend_has_capacity(
        b, max_age_s=max_age_s, config=config))


def decide(request: AdmissionRequest, snapshot: FleetSnapshot, predictor: TtftEstimator,
           now_s: float, *, config: PolicyConfig = DEFAULT_POLICY,
           num_queued_ahead: int = 0, reserved_slots: int = 0,
           slot_free_rate_per_s: float = 0.0,
           shortlist: Sequence[BackendState] | None = None) -> Decision:
    """Admit, queue or reject ``request``; see the module docstring. O(backends).

    ``reserved_slots``: free batch slots this request must leave to higher tiers
    (``admission.headroom``); the fleet has room for it only beyond them. Predictions include
    the predictor's recent lateness (``margin_s``), so a fit that runs low does not admit
    requests that then miss. ``slot_free_rate_per_s``: how often requests end in the fleet
    lately; a refusal's ``Retry-After`` is the time until the requests ahead of this one
    (queued and reserved) and this one could have started at that rate, or until the backlog
    has drained below the target, whichever is later.

    ``shortlist``: the backends routing scored for this request (``Router.route``: the ones
    it can go to, a large fleet's shortlist); TTFTs are predicted over those alone, so a
    decision costs O(shortlist) predictions, not O(fleet), and judges where the request can
    actually start. Capacity is still the whole fleet's. None or empty: every candidate."""
    tier = request.tier
    arrival_s = now_s if request.arrival_s is None else request.arrival_s
    waited_s = max(0.0, now_s - arrival_s)
    candidates = [b for b in snapshot.backends
                  if b.is_healthy and (request.model is None or request.model in b.models)]
    if not candidates:
        what = f"model {request.model!r}" if request.model else "this request"
        return _overload(request, arrival_s, now_s, config, f"no healthy backend serves {what}",
                         "no_backend")
    predicted = candidates
    if shortlist:
        predicted = [b for b in shortlist
                     if b.is_healthy and (request.model is None or request.model in b.models)
                     ] or candidates
    worst_queued = max(b.num_queued_prefill_tokens for b in predicted)
    prefix = snapshot.prefix
    uncached_list = request.uncached_for_each(predicted, prefix)
    uncached_by_backend = list(zip(predicted, uncached_list, strict=True))
    best_index, best_s = predictor.quickest(predicted, uncached_list,
                                            max_age_s=snapshot.max_age_s,
                                            worst_queued_tokens=worst_queued)
    best = predicted[best_index]
    expected_s = waited_s + best_s
    # Room anywhere in the fleet counts, not only in the shortlist: the dispatcher would
    # start the request there.
    max_age_s, max_tokens = snapshot.max_age_s, request.max_tokens
    has_capacity = any(
        backend_has_capacity(b, max_age_s=max_age_s, config=config, needed_kv_tokens=(
            needed_kv_tokens(request.uncached_for(b.name, prefix), 0, max_tokens)))
        for b in candidates)
    held_for_higher = False
    if has_capacity and reserved_slots > 0:
        room = fleet_free_slots(snapshot, config, request.model)
        if room is not None and room[0] <= reserved_slots:
            has_capacity, held_for_higher = False, True
    if expected_s <= tier.ttft_slo_s and has_capacity and not num_queued_ahead:
        # The common case, decided without the idle predictions: the target is at least the
        # SLO, so meeting the SLO meets it.
        return Decision("admit", _ADMIT_REASON, "admitted", best_s, backend=best.name)
    idle_s = min(predictor.predict_s(b, TtftFeatures(0, uncached))
                 for b, uncached in uncached_by_backend)
    target_s = max(tier.ttft_slo_s, idle_s * (1 + config.oversize_slack))
    if expected_s <= target_s and has_capacity:
        if num_queued_ahead > 0 and tier.on_overload != "reject":
            reason = (f"{num_queued_ahead} request(s) of this or a higher tier are queued "
                      "ahead")
            return _overload(request, arrival_s, now_s, config, reason, "queued_ahead", best_s,
                             best.name, idle_s=idle_s)
        return Decision("admit", _ADMIT_REASON, "admitted", best_s, backend=best.name)
    if not has_capacity:
        reason = (f"the fleet's last free batch slots (up to {reserved_slots}) are held for "
                  "higher tiers' expected arrivals" if held_for_higher else
                  f"fleet saturated: no backend has <= {config.max_waiting} waiting requests, "
                  "a free batch slot and KV for the request")
        code: Reason = "held_for_higher" if held_for_higher else "saturated"
        head_deadline_s = arrival_s + tier.ttft_slo_s - idle_s
        if tier.on_overload == "reject" and head_deadline_s > now_s:
            # Saturated: this request goes ahead of every lower tier in the gateway's queue
            # and takes one of the next free slots, so it can still meet its SLO. Wait only
            # as long as that stays true; past that it is rejected (503) before any upstream
            # work. (Its own tier's queue ahead of it is bounded by the same deadline.)
            return Decision("queue", f"{reason}; at the head of the queue for up to "
                            f"{head_deadline_s - now_s:.3g} s", code, best_s,
                            deadline_s=head_deadline_s, backend=best.name)
    else:
        reason = (f"predicted TTFT {expected_s:.3g} s (quickest: {best.name}) exceeds the "
                  f"{tier.name} tier's {target_s:.3g} s target")
        code = "slo_miss"
    excess_s = best_s - target_s
    if not has_capacity:
        excess_s = max(excess_s, time_to_start_s(num_queued_ahead + reserved_slots,
                                                 slot_free_rate_per_s))
    return _overload(request, arrival_s, now_s, config, reason, code, best_s, best.name,
                     excess_s=excess_s, idle_s=idle_s)


def time_to_start_s(num_ahead: int, slot_free_rate_per_s: float) -> float:
    """When a request with ``num_ahead`` others before it could start, at the fleet's recent
    rate of ending requests (0 when that rate is unknown)."""
    if slot_free_rate_per_s <= 0:
        return 0.0
    return (num_ahead + 1) / slot_free_rate_per_s


def reject_expired(tier: Tier, arrival_s: float, now_s: float,
                   config: PolicyConfig = DEFAULT_POLICY, *, num_queued_ahead: int = 0,
                   slot_free_rate_per_s: float = 0.0) -> Decision:
    """The 503 for a request that ``FairQueue.expire`` handed back; ``Retry-After`` is the
    time its tier's queue ahead of it needs to start (``time_to_start_s``)."""
    return Decision("reject", f"waited {now_s - arrival_s:.3g} s in the {tier.name} tier's "
                    f"queue, its limit is {tier.max_wait_s:.3g} s; the fleet is overloaded",
                    "deadline", retry_after_s=_retry_after_s(
                        time_to_start_s(num_queued_ahead, slot_free_rate_per_s), config))


def _overload(request: AdmissionRequest, arrival_s: float, now_s: float,
              config: PolicyConfig, reason: str, code: Reason,
              predicted_s: float | None = None,
              backend: str | None = None, excess_s: float = 0.0,
              idle_s: float = 0.0) -> Decision:
    tier = request.tier
    if tier.on_overload == "reject":
        return Decision("reject", f"{reason}; the {tier.name} tier does not queue", code,
                        predicted_s, retry_after_s=_retry_after_s(excess_s, config),
                        backend=backend)
    deadline_s = tier.queue_deadline_s(arrival_s)
    if tier.on_overload == "queue_until_deadline":
        # Leave its own prefill time inside the SLO: dispatched later, it would miss anyway.
        deadline_s = min(deadline_s, arrival_s + tier.ttft_slo_s - idle_s)
    if deadline_s <= now_s:
        return Decision("reject", f"{reason}; the {tier.name} tier's queue deadline has passed",
                        "deadline", predicted_s, retry_after_s=_retry_after_s(excess_s, config),
                        backend=backend)
    return Decision("queue", f"{reason}; queued for up to {deadline_s - now_s:.3g} s", code,
                    predicted_s, deadline_s=deadline_s, backend=backend)


def _retry_after_s(excess_s: float, config: PolicyConfig) -> float:
    """Roughly when the backlog will have drained enough, within the configured bounds."""
    return min(config.max_retry_after_s, max(config.min_retry_after_s, excess_s))
