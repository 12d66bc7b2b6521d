"""Routing in the gateway: describe the request, snapshot the fleet, call ``schedule()``.

The decision itself is ``routing.schedule`` (pure). This module supplies its inputs:

- the request's prefix chains: character blocks of the prompt text for the approximate index
  (always), and token blocks for the exact index when the model has a tokenizer configured
  (chat prompts are rendered with the model's template and tokenized per message, each
  message's tokens cached, so a shared system prompt is tokenized once);
- a snapshot of the backends serving the model, with this gateway's own in-flight counts;
- bookkeeping after the decision: in-flight counts, and the approximate index learns where the
  prompt went.

Example::

    router = Router(registry, profile_by_name("prefix_affinity"), ExactPrefixIndex(),
                    ApproxPrefixIndex(), tokenizers={})
    plan = router.describe("m", body, tenant_id="t1")
    for backend in router.rank(plan): ...
"""

from __future__ import annotations

import logging
import random
import re
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from hashlib import blake2b
from math import inf
from typing import Any

from admission.headroom import backend_free_slots
from backends.fleet.approx_sync import URGENT_PREFILL_TOKENS
from backends.fleet.registry import Backend, BackendRegistry
from backends.tokenizer import Tokenizer
from routing.fit import holds
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.prefix import char_block_hashes, token_block_hashes
from routing.profile import SchedulingProfile
from routing.scheduler import schedule_scored
from routing.types import BackendState, FleetSnapshot, PrefixMatch, Ranked, RouteRequest

_IM_START = "<|im_start|>"
SNAPSHOT_REUSE_S = 0.05  # the oldest reference time a snapshot is taken for
SNAPSHOT_FRESH_S = 0.002  # routing reuses admission's snapshot (and ranking) this long
MAX_RANKED = 2  # the pick and one retry: what the proxy tries
BROKEN_WARN_EVERY_S = 300.0  # "prefix affinity is not working" at most this often per backend
log = logging.getLogger(__name__)


@dataclass(slots=True, init=False)
class RoutePlan:
    request: RouteRequest
    reserved_tokens: int
    snapshot: FleetSnapshot | None  # what the routing decision saw
    snapshot_taken_s: float  # monotonic time it was taken (its now_s may be earlier)
    pending_prefill_tokens: int  # what the chosen backend must prefill (set by started)
    # Set by SLO admission: the request was admitted to start now, so it goes to a backend
    # with a free batch slot when one exists, not into a full one's queue (overload waits in
    # the gateway, where it is ordered, not in a worker's FIFO).
    needs_free_slot: bool
    # Set by started: what routing expected the backend to hold, and (approximate index) how
    # old its claim was then, to learn from what the backend reports (``Router.learn``).
    expected_cached_tokens: int
    claim_age_s: float | None
    claim_ttl_s: float | None  # and how long that backend's claims counted then
    sent_s: float  # set by started: when it went upstream (monotonic)
    is_ending: bool  # set by nearly_done: its stream is on its last step
    # Set by ``Router.route`` (SLO admission decides on the same ranking): ``rank`` hands it
    # out while the snapshot is fresh instead of deciding again.
    ranked: list[tuple[Backend, Ranked]] | None
    ranked_on: FleetSnapshot | None  # the snapshot it was decided on

    def __init__(self, request: RouteRequest, reserved_tokens: int,
                 snapshot: FleetSnapshot | None = None, snapshot_taken_s: float = 0.0,
                 pending_prefill_tokens: int = 0, needs_free_slot: bool = False,
                 expected_cached_tokens: int = 0, claim_age_s: float | None = None,
                 claim_ttl_s: float | None = None, sent_s: float = 0.0, is_ending: bool = False,
                 ranked: list[tuple[Backend, Ranked]] | None = None,
                 ranked_on: FleetSnapshot | None = None) -> None:
        self.request = request
        self.reserved_tokens = reserved_tokens
        self.snapshot = snapshot
        self.snapshot_taken_s = snapshot_taken_s
        self.pending_prefill_tokens = pending_prefill_tokens
        self.needs_free_slot = needs_free_slot
        self.expected_cached_tokens = expected_cached_tokens
        self.claim_age_s = claim_age_s
        self.claim_ttl_s = claim_ttl_s
        self.sent_s = sent_s
        self.is_ending = is_ending
        self.ranked = ranked
        self.ranked_on = ranked_on


# What routing reads of a prompt: its first MAX_PREFIX_BLOCKS blocks (a match deeper than
# that changes no decision), and its tokens only up to MAX_TOKENIZED_CHARS of text (beyond,
# the size is estimated and the engine judges it): a prompt of megabytes costs the event
# loop no more than one of a few hundred kilobytes, and per-prompt state stays bounded.
MAX_PREFIX_BLOCKS = 2048
# How long an approximate claim on a backend that publishes KV events counts while the exact
# index knows no holder of the prompt: a request's queue wait and prefill, and its ``stored``
# events' way to the gateway, take less (``Router._match``).
FOLLOWED_CLAIM_S = 2.0
MAX_TOKENIZED_CHARS = 512 * 1024


class _SegmentCache:
    """Token ids of rendered chat segments, LRU-bounded by the bytes they hold.

    Keyed by a 128-bit BLAKE2b digest of the segment, not by its text: the cache keeps 4 bytes
    per token and ~200 per entry, not the text too (~4 more per token), and a request's text
    is freed with the request instead of living on in the cache's LRU order, which fragments
    the heap under unique prompts (bench/soak). A digest collision would need ~2^64 entries.
    """

    ENTRY_BYTES = 200  # the OrderedDict node, the digest and the array header

    def __init__(self, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._num_bytes = 0
        self._max_bytes = max_bytes

    def encode(self, tokenizer: Tokenizer, segment: str) -> array[int]:
        key = blake2b(segment.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        ids = self._entries.get(key)
        if ids is not None:
            self._entries.move_to_end(key)
            return ids
        ids = array("I", tokenizer.encode(segment))
        self._entries[key] = ids
        self._num_bytes += self.ENTRY_BYTES + ids.itemsize * len(ids)
        while self._num_bytes > self._max_bytes and self._entries:
            _, dropped = self._entries.popitem(last=False)
            self._num_bytes -= self.ENTRY_BYTES + dropped.itemsize * len(dropped)
        return ids

    @property
    def num_bytes(self) -> int:
        return self._num_bytes

    def __len__(self) -> int:
        return len(self._entries)


class Router:
    @property
    def segment_cache_bytes(self) -> int:
        return self._segments.num_bytes

    def __init__(
        self,
        registry: BackendRegistry,
        profile: SchedulingProfile,
        exact_index: ExactPrefixIndex,
        approx_index: ApproxPrefixIndex,
        tokenizers: dict[str, Tokenizer],
        *,
        block_chars: int = 64,
        block_size: int = 16,
        max_age_s: float = 5.0,
        seed: int | None = None,
        default_output_tokens: int = 256,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        segment_cache_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        """``clock``: the monotonic time of load figures and in-flight books; ``wall_clock``:
        the time of the approximate index's claims, shared with other replicas through Redis
        (the virtual-time simulator passes its own clock as both)."""
        self.registry = registry
        self._clock = clock
        self._wall_clock = wall_clock
        self.profile = profile
        self.exact_index = exact_index
        self.approx_index = approx_index
        self.tokenizers = tokenizers
        self.block_chars = block_chars
        self.block_size = block_size
        self.max_age_s = max_age_s
        self.default_output_tokens = default_output_tokens
        self._rng = random.Random(seed)
        self._segments = _SegmentCache(segment_cache_bytes)
        self._reference_now_s = -1.0
        self._positions_by_model: dict[str, tuple[int, dict[str, int]]] = {}
        self._broken_warned_s: dict[str, float] = {}
        # Called with each decision the approximate index learns (to share it with replicas).
        self.on_record: Callable[[tuple[int, ...], str, float], None] | None = None
        # Called with each response that changed a backend's claim lifetime in the
        # approximate index (backend, claim age, hit): ApproxIndexSync.lesson tells the others.
        self.on_lesson: Callable[[str, float, bool], None] | None = None
        # Called after each change of a backend's in-flight books (ApproxIndexSync.notify),
        # with whether the other replicas should hear it at once: a dispatch (it raised
        # them), or a fall by at least urgent_prefill_tokens of prefill (falls_urgently).
        self.on_booked: Callable[[bool], None] | None = None
        self.urgent_prefill_tokens = URGENT_PREFILL_TOKENS

    # -- the request ----------------------------------------------------------------------
    def describe(self, model: str, body: dict[str, Any], tenant_id: str | None) -> RoutePlan:
        text = prompt_text(body)
        char_hashes = tuple(char_block_hashes(
            text[:self.block_chars * MAX_PREFIX_BLOCKS], self.block_chars, model))
        block_hashes: tuple[int, ...] = ()
        tokenizer = self.tokenizers.get(model)
        num_prompt_tokens = max(1, len(text) // 4)
        is_exact_count = False
        if tokenizer is not None and len(text) <= MAX_TOKENIZED_CHARS:
            ids = self._token_ids(tokenizer, body)
            if ids is not None:
                num_prompt_tokens, is_exact_count = len(ids), True
                block_hashes = tuple(token_block_hashes(
                    ids[:self.block_size * MAX_PREFIX_BLOCKS], self.block_size, model,
                    body.get("cache_salt") or None))
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        max_tokens = max_tokens if isinstance(max_tokens, int) else None
        session = body.get("user")
        request = RouteRequest(
            model=model, num_prompt_tokens=num_prompt_tokens, block_hashes=block_hashes,
            char_hashes=char_hashes, session_key=session if isinstance(session, str) else None,
            tenant_id=tenant_id, max_tokens=max_tokens, is_exact_count=is_exact_count,
        )
        return RoutePlan(request, num_prompt_tokens + (max_tokens or self.default_output_tokens))

    def unservable(self, request: RouteRequest) -> str | None:
        """Why no backend serving the model could ever hold ``request`` (its context length or
        its whole KV cache, whatever their health now), or None. Only for an exact count: an
        estimate is the engines' to judge (``ResourcesFilter``)."""
        if not request.is_exact_count:
            return None
        pool = self.registry.for_model(request.model)
        num_tokens = request.num_prompt_tokens + (request.max_tokens or 0)
        if not pool or any(holds(b.profile, num_tokens) for b in pool):
            return None
        limits = [min(n for n in (b.profile.max_context_tokens, b.profile.kv_capacity_tokens)
                      if n is not None) for b in pool]  # each has one: none holds the request
        largest = f" (the most one holds: {max(limits):,} tokens)"
        output = (f" + max_tokens {request.max_tokens:,}" if request.max_tokens else "")
        return (f"This request needs {num_tokens:,} tokens (prompt {request.num_prompt_tokens:,}"
                f"{output}), more than any backend serving {request.model!r} can hold"
                f"{largest}; shorten the prompt or lower max_tokens.")

    def _token_ids(self, tokenizer: Tokenizer, body: dict[str, Any]) -> list[int] | None:
        messages = body.get("messages")
        try:
            if isinstance(messages, list):
                rendered = tokenizer.render_chat(messages)
                ids: list[int] = []
                for index, part in enumerate(rendered.split(_IM_START)):
                    if index == 0:
                        if part:
                            ids += self._segments.encode(tokenizer, part)
                        continue
                    ids += self._segments.encode(tokenizer, _IM_START + part)
                return ids
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return list(self._segments.encode(tokenizer, prompt))
            if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
                return prompt
        except ValueError:
            return None  # the engine will reject what cannot be rendered; route it anyway
        return None

    # -- the decision ---------------------------------------------------------------------
    def _reference_s(self, now_s: float) -> float:
        """The time snapshots are taken for: ``now_s``, or up to ``SNAPSHOT_REUSE_S`` before it.

        A backend's state is rebuilt only when one of its figures changed since the last
        snapshot for the same reference time (``Backend.state``), so most requests rebuild a
        few backends, not the whole fleet (64 states cost ~200 µs). Ages stay exact: states
        are relative to the reference time, and routing adds the snapshot's own age."""
        reference_s = self._reference_now_s
        if not 0.0 <= now_s - reference_s <= SNAPSHOT_REUSE_S:
            reference_s = self._reference_now_s = now_s
        return reference_s

    def snapshot(self, request: RouteRequest, now_s: float) -> FleetSnapshot:
        """The backends serving the request's model, and how much of its prefix each holds."""
        pool = self.registry.for_model(request.model)
        reference_s = self._reference_s(now_s)
        return FleetSnapshot(
            now_s=reference_s, backends=tuple([b.state(reference_s) for b in pool]),
            prefix=self._match(request, now_s) if pool else PrefixMatch(),
            max_age_s=self.max_age_s, positions=self._positions(request.model, pool),
        )

    def _positions(self, model: str, pool: list[Backend]) -> dict[str, int]:
        """Each backend's index in ``pool`` by name, kept until the membership changes."""
        version = self.registry.version
        cached = self._positions_by_model.get(model)
        if cached is not None and cached[0] == version:
            return cached[1]
        positions = {b.name: i for i, b in enumerate(pool)}
        self._positions_by_model[model] = (version, positions)
        return positions

    def num_running_reported(self, backend: str) -> int | None:
        """What ``backend``'s engine last reported running (None: no such backend)."""
        found = self.registry.get(backend)
        return None if found is None else found.num_running_reported

    def fleet_snapshot(self, now_s: float) -> FleetSnapshot:
        """Every backend, no request: for the admission dispatcher's capacity check."""
        reference_s = self._reference_s(now_s)
        return FleetSnapshot(now_s=reference_s, backends=tuple(
            [b.state(reference_s) for b in self.registry.backends]), max_age_s=self.max_age_s)

    def rank(self, plan: RoutePlan, max_ranked: int = MAX_RANKED) -> list[tuple[Backend, Ranked]]:
        """The backends to try, best first, each with its score, reasons and expected hit:
        the ranking SLO admission decided on (``route``) while its snapshot is fresh, else a
        decision now."""
        now_s = self._clock()
        ranked = plan.ranked
        plan.ranked = None  # handed out once: a later call decides on the fleet of its time
        if (ranked is not None and max_ranked <= MAX_RANKED and plan.ranked_on is plan.snapshot
                and now_s - plan.snapshot_taken_s <= SNAPSHOT_FRESH_S):
            return ranked[:max_ranked]
        request = plan.request
        if not self.registry.for_model(request.model):
            return []
        snapshot = plan.snapshot  # admission's, when it decided just now
        if snapshot is None or now_s - plan.snapshot_taken_s > SNAPSHOT_FRESH_S:
            snapshot = self.snapshot(request, now_s)
            plan.snapshot = snapshot
            plan.snapshot_taken_s = now_s
        return self._decide(plan, snapshot, now_s, max_ranked)[0]

    def route(self, plan: object, snapshot: FleetSnapshot, now_s: float
              ) -> list[BackendState]:
        """Decide where ``plan`` goes on ``snapshot`` (SLO admission's, taken at ``now_s``)
        and keep the ranking for ``rank``; return the backends the decision scored (the
        shortlist's survivors in a large fleet), over which admission predicts TTFTs: one
        decision for both, not one each."""
        assert isinstance(plan, RoutePlan)
        plan.snapshot, plan.snapshot_taken_s, plan.ranked_on = snapshot, now_s, snapshot
        plan.ranked, scored = self._decide(plan, snapshot, now_s, MAX_RANKED)
        return scored

    def _decide(self, plan: RoutePlan, snapshot: FleetSnapshot, now_s: float, max_ranked: int
                ) -> tuple[list[tuple[Backend, Ranked]], list[BackendState]]:
        request = plan.request
        ranked, scored = schedule_scored(
            request, _with_free_slots(snapshot) if plan.needs_free_slot else snapshot,
            self.profile, now_s, self._rng, max_ranked=max_ranked)
        if log.isEnabledFor(logging.DEBUG) and ranked:
            best = ranked[0]
            log.debug("route %s -> %s score=%.3f expected_cached=%d reasons=%s",
                      request.model, best.backend, best.score, best.expected_cached_tokens,
                      best.reasons)
        get = self.registry.get
        pairs = [(backend, r) for r in ranked if (backend := get(r.backend)) is not None]
        return pairs, scored

    def _match(self, request: RouteRequest, now_s: float) -> PrefixMatch:
        """The exact index's match; where it knows no holder, the approximate index's: its
        claims on backends without KV events, and those younger than ``FOLLOWED_CLAIM_S`` on
        backends with them (a prefix sent there just now, whose blocks' ``stored`` events are
        not in yet). An older claim on a backend the exact index follows is stale: that
        backend evicted the prefix (the exact index heard it), and trusting the claim sent a
        prompt nobody held to its old backend as a hit: no room made for it, its prefill
        left out of that backend's backlog."""
        if request.block_hashes:
            exact = self.exact_index.match(request.block_hashes)
            if exact.num_blocks:
                return exact
        if request.char_hashes:
            # Wall-clock time: claims are shared with other replicas through Redis.
            wall_s = self._wall_clock()
            approx = self.approx_index.match(request.char_hashes, wall_s)
            if request.block_hashes and approx.num_blocks:
                return self._without_stale_claims(request.char_hashes, approx, wall_s)
            return approx
        return PrefixMatch()

    def _without_stale_claims(self, char_hashes: tuple[int, ...], approx: PrefixMatch,
                              wall_s: float) -> PrefixMatch:
        follows = self.exact_index.follows
        claim_s = self.approx_index.claim_s
        kept = {}
        for name, num_blocks in approx.num_blocks.items():
            if follows(name):
                recorded_s = claim_s(char_hashes, num_blocks, name)
                if recorded_s is None or wall_s - recorded_s > FOLLOWED_CLAIM_S:
                    continue
            kept[name] = num_blocks
        if len(kept) == len(approx.num_blocks):
            return approx
        return PrefixMatch(kept, approx.block_tokens, is_exact=False)

    # -- bookkeeping ----------------------------------------------------------------------
    def started(self, backend: Backend, plan: RoutePlan, expected_cached_tokens: int = 0) -> None:
        plan.sent_s = self._clock()
        # Only what it must prefill: a cache hit costs the backend almost nothing.
        plan.pending_prefill_tokens = max(0, plan.request.num_prompt_tokens
                                          - expected_cached_tokens)
        backend.book_started(plan.reserved_tokens, plan.pending_prefill_tokens)
        if self.on_booked is not None:
            self.on_booked(True)
        plan.expected_cached_tokens = expected_cached_tokens
        plan.claim_age_s = plan.claim_ttl_s = None
        if plan.request.char_hashes:
            now_s = self._wall_clock()
            record_claim(self.approx_index, plan, backend.name, now_s)
            if self.on_record is not None:
                self.on_record(plan.request.char_hashes, backend.name, now_s)

    def learn(self, backend: Backend, plan: RoutePlan, num_prompt_tokens: int,
              num_cached_tokens: int) -> None:
        """What ``backend`` reported it had cached of this request's prompt: kept in its
        books, and fed back to the approximate index when the expectation came from there (a
        miss shortens that backend's claim lifetime at once: ``ApproxPrefixIndex.observe``)."""
        expected = min(plan.expected_cached_tokens, num_prompt_tokens)
        feedback = backend.cache_feedback
        feedback.add(num_prompt_tokens, expected, num_cached_tokens)
        claim_age_s = plan.claim_age_s
        if claim_age_s is not None and expected >= 2 * self.block_size:
            is_hit = num_cached_tokens >= expected // 2
            if (self.approx_index.observe(backend.name, claim_age_s, is_hit)
                    and self.on_lesson is not None):
                self.on_lesson(backend.name, claim_age_s, is_hit)
        if feedback.is_broken():
            now_s = self._clock()
            if now_s - self._broken_warned_s.get(backend.name, -inf) >= BROKEN_WARN_EVERY_S:
                self._broken_warned_s[backend.name] = now_s
                expected_ratio, reported_ratio = feedback.hit_ratios()
                log.warning(
                    "prefix affinity is not working on backend %s: routing expected %.0f%% of "
                    "prompt tokens cached there, it reports %.0f%% (is prefix caching on? is "
                    "its KV cache large enough for the traffic?)", backend.name,
                    100 * expected_ratio, 100 * reported_ratio)

    def first_token(self, backend: Backend, plan: RoutePlan) -> None:
        backend.book_first_token(plan.pending_prefill_tokens, plan.sent_s)
        if self.on_booked is not None:
            self.on_booked(self.falls_urgently(plan))

    def falls_urgently(self, plan: RoutePlan) -> bool:
        """Whether ``plan``'s first token (or its end before one) takes enough prefill off
        its backend's books, ``urgent_prefill_tokens``, that the other replicas should hear
        it at once, not with the next dispatch or ``routing.share_lazy_ms`` later. A cache
        miss's prefill, the whole prompt's (thousands of tokens: a hundred ms or more of a
        worker's time), would otherwise weigh in their TTFT estimates for that long after it
        is done, and send requests away from a backend that holds their prefix; a hit's is
        its question, tens of tokens."""
        return plan.pending_prefill_tokens >= self.urgent_prefill_tokens

    def nearly_done(self, backend: Backend, plan: RoutePlan) -> None:
        """The request's stream is on its last step (one token left of its ``max_tokens``):
        its batch slot counts as free for the next request (``BackendState.num_holding``),
        which reaches the engine's queue while that step runs and starts as it ends. Without
        this, each slot idled for one engine step between a stream's end and the next
        request's start: ~2 % of a 16-slot fleet running 40-token answers. Once per request."""
        if not plan.is_ending:
            plan.is_ending = True
            backend.book_ending()
            if self.on_booked is not None:
                self.on_booked(False)

    def finished(self, backend: Backend, plan: RoutePlan, *, had_first_token: bool) -> None:
        backend.book_finished(plan.reserved_tokens, plan.pending_prefill_tokens,
                              had_first_token=had_first_token, was_ending=plan.is_ending)
        plan.is_ending = False
        if self.on_booked is not None:
            self.on_booked(not had_first_token and self.falls_urgently(plan))


def record_claim(approx_index: ApproxPrefixIndex, plan: RoutePlan, backend: str,
                 now_s: float) -> None:
    """Record that ``plan``'s prompt went to ``backend`` at ``now_s``, first keeping in
    ``plan.claim_age_s`` how old the approximate index's claim it was sent on was (``learn``
    judges the engine's reported cached tokens against it; None when the expectation was not
    the approximate index's) and in ``plan.claim_ttl_s`` how long that backend's claims
    counted then. ``plan.expected_cached_tokens`` must be set."""
    char_hashes = plan.request.char_hashes
    snapshot = plan.snapshot
    if plan.expected_cached_tokens > 0 and snapshot is not None and not snapshot.prefix.is_exact:
        depth = snapshot.prefix.num_blocks.get(backend, 0)
        claim_s = approx_index.claim_s(char_hashes, depth, backend)
        if claim_s is not None:
            plan.claim_age_s = now_s - claim_s
            plan.claim_ttl_s = approx_index.ttl_for(backend)
    approx_index.record(char_hashes, backend, now_s)


_PROMPT_TOKENS_RE = re.compile(rb'"prompt_tokens"\s*:\s*(\d+)')
_CACHED_TOKENS_RE = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


def reported_cache_usage(tail: bytes) -> tuple[int, int] | None:
    """(prompt tokens, cached tokens) from the usage object at the end of a response (its
    last 4 KiB: a body, or a stream's last events); None when the engine did not say."""
    prompt, cached = reported_usage(tail)
    if cached is None or prompt is None:
        return None
    return prompt, cached


def reported_usage(tail: bytes) -> tuple[int | None, int | None]:
    """(prompt tokens, cached tokens) as far as the usage object at the end of a response
    (its last 4 KiB) says them; None for each it does not."""
    tail = tail[-4096:]
    cached = _CACHED_TOKENS_RE.search(tail)
    prompt = _PROMPT_TOKENS_RE.search(tail)
    return (int(prompt.group(1)) if prompt is not None else None,
            int(cached.group(1)) if cached is not None else None)


def _with_free_slots(snapshot: FleetSnapshot) -> FleetSnapshot:
    """The snapshot without the backends whose batch is full, unless that leaves none (a
    backend that does not advertise ``max_batch`` counts as having room)."""
    backends = snapshot.backends
    roomy = tuple(b for b in backends
                  if (free := backend_free_slots(b, max_age_s=snapshot.max_age_s)) is None
                  or free > 0)
    if not roomy or len(roomy) == len(backends):
        return snapshot
    return replace(snapshot, backends=roomy, positions=None)


def prompt_text(body: dict[str, Any]) -> str:
    """The text of a request's prompt: its messages (role and content) or its prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = "\n".join(p.get("text", "") for p in content
                                    if isinstance(p, dict) and isinstance(p.get("text"), str))
            parts.append(f"{message.get('role')}\n{content or ''}\n")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, list):
        return " ".join(str(t) for t in prompt[:100_000])
    return ""
