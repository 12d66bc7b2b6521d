"""The gateway's routing side in virtual time: ``gateway/router.py``'s Router, clock passed in.

Per request it does what the live gateway does: describe the request (token-block chain for the
exact index, character-block chain for the approximate one), match it against the index in use,
snapshot the fleet from each backend's ``Backend.state()`` (the gateway's own record type:
heartbeat load figures with their age, plus this gateway's exact, current in-flight counts),
call ``routing.schedule`` and keep the same in-flight books (``started`` / ``first_token`` /
``finished``); the approximate index learns where each prompt went, and what each engine
reported it had cached of a prompt goes to ``gateway/router.py``'s own ``Router.learn``
(``learn``): into the backend's ``CacheFeedback``, and, when the expectation came from the
approximate index, to ``ApproxPrefixIndex.observe``, which drops a backend's claims as old as
one it missed.

Index modes: ``none`` (the profile reads no prefix; nothing is hashed), ``exact`` (as the
gateway with a tokenizer and KV events: the exact index, falling back to the approximate one
when no backend holds the first block) and ``approx`` (no KV events: the approximate index only).

Two shortcuts keep a decision cheap for large fleets, neither changing a decision:

- **Character chain.** The gateway hashes 64-character blocks of the prompt text; there is no
  text here. Each token block's chain hash, XORed with a constant, stands in for one character
  block (64 characters ~ 16 tokens, the gateway's ``block_chars // 4`` estimate), so the
  approximate index is as fine-grained as the exact one: what differs is only where its
  knowledge comes from (its own routing history with a TTL, blind to evictions). A request
  that carries its prompt ``text`` (a replayed live run) is hashed from the text as the
  gateway hashes it, and in ``approx`` mode its prompt tokens are the gateway's
  ``len(text) // 4`` estimate.
- **Cached states.** A backend's ``BackendState`` is rebuilt only when its figures change
  (``mark_changed``: a heartbeat, a dispatch, a first token, a finish, or its load turning
  stale). Its ``age_s`` is then as of that rebuild, not of the decision. Routing reads
  ``age_s`` to tell stale from fresh, and the simulation rebuilds a backend at the moment its
  figures go stale, so every fresh/stale verdict is the one an exact age would give; and to
  drain a reported prefill backlog (``BackendState.queued_prefill_now``), so a backend that
  reported one is rebuilt at every decision until it reports none.

Example::

    router = VirtualRouter(backends, "prefix_affinity", "exact", model="m")
    plan = router.describe(request)
    index, expected_cached_tokens = router.rank(plan, now_s=1.5)
    router.started(index, plan, now_s=1.5, expected_cached_tokens=expected_cached_tokens)
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import cast

from backends.engine_core.block_manager import KvEvent
from backends.fleet.registry import Backend, BackendRegistry
from bench.vsim.workloads import VRequest
from gateway.router import RoutePlan, Router
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import EventKind, ExactPrefixIndex
from routing.prefix import char_block_hashes, token_block_hashes
from routing.profiles import profile_by_name
from routing.scheduler import schedule
from routing.types import BackendState, FleetSnapshot, PrefixMatch, RouteRequest

INDEX_MODES = ("none", "exact", "approx")
CHAR_HASH_SALT = 0x5A5A_C3C3_A5A5_3C3C
CHAR_BLOCK_CHARS = 64  # the gateway's routing.block_chars default
_NO_MATCH = PrefixMatch()


class VirtualRouter:
    """Routing decisions and in-flight books for a simulated fleet; see the module docstring."""

    def __init__(self, backends: Sequence[Backend], profile: str, index_mode: str, *,
                 model: str, block_size: int = 16, max_age_s: float = 5.0,
                 approx_ttl_s: float = 600.0, seed: int | str = 0,
                 exact_index: ExactPrefixIndex | None = None) -> None:
        """``exact_index``: the one to read and feed (replicas share one: they read the same
        KV events); a new one by default."""
        if index_mode not in INDEX_MODES:
            raise ValueError(f"unknown index mode {index_mode!r}; use {', '.join(INDEX_MODES)}")
        self.backends = list(backends)
        self.profile = profile_by_name(profile)
        self.index_mode = index_mode
        self.model = model
        self.block_size = block_size
        self.max_age_s = max_age_s
        self.exact_index: ExactPrefixIndex | None = None
        if index_mode == "exact":
            self.exact_index = ExactPrefixIndex(block_size) if exact_index is None else exact_index
        self.approx_index = (ApproxPrefixIndex(approx_ttl_s, block_tokens=block_size)
                             if index_mode != "none" else None)
        self._rng = random.Random(f"{seed}:vsim-router")
        self._states: list[BackendState] = [b.state(0.0) for b in self.backends]
        self._changed: set[int] = set()
        # Backends whose state holds a reported prefill backlog: its drain depends on age_s.
        self._draining: set[int] = set()
        self._by_name = {b.name: i for i, b in enumerate(self.backends)}
        self._prefix_hashes: dict[int, list[int]] = {}  # prefix group -> its full blocks' chain
        # The live gateway's router on this simulator's clock, for its books and learn(); an
        # index mode without one gets indexes it never consults. (Not ``or``: an empty index
        # is falsy.)
        self._now_s = 0.0
        self._gateway = Router(
            BackendRegistry(self.backends), self.profile,
            ExactPrefixIndex(block_size) if self.exact_index is None else self.exact_index,
            ApproxPrefixIndex(approx_ttl_s, block_tokens=block_size)
            if self.approx_index is None else self.approx_index, {},
            block_size=block_size, max_age_s=max_age_s,
            clock=self._clock, wall_clock=self._clock)

    def _clock(self) -> float:
        return self._now_s

    @property
    def gateway(self) -> Router:
        """The live gateway's ``Router`` this one drives (``on_record``: share its claims)."""
        return self._gateway

    # -- the request ----------------------------------------------------------------------
    def describe(self, request: VRequest) -> RoutePlan:
        block_hashes: tuple[int, ...] = ()
        char_hashes: tuple[int, ...] = ()
        num_prompt_tokens = len(request.prompt_ids)
        if self.index_mode != "none":
            block_hashes = tuple(self.block_hashes(request))
            if request.text is None:
                char_hashes = tuple(h ^ CHAR_HASH_SALT for h in block_hashes)
            else:  # as gateway/router.py: 64-character blocks, len // 4 tokens without a tokenizer
                char_hashes = tuple(char_block_hashes(request.text, CHAR_BLOCK_CHARS, self.model))
            if self.index_mode == "approx":
                block_hashes = ()
                if request.text is not None:
                    num_prompt_tokens = max(1, len(request.text) // 4)
        route_request = RouteRequest(
            model=self.model, num_prompt_tokens=num_prompt_tokens, block_hashes=block_hashes,
            char_hashes=char_hashes, tenant_id=str(request.group), max_tokens=request.max_tokens)
        return RoutePlan(route_request, num_prompt_tokens + request.max_tokens)

    def block_hashes(self, request: VRequest) -> list[int]:
        """``token_block_hashes`` of the prompt; a group's shared prefix is hashed once."""
        ids, block_size, model = request.prompt_ids, self.block_size, self.model
        if request.prefix_group is None or request.num_prefix_tokens < block_size:
            return token_block_hashes(ids, block_size, model)
        num_head_tokens = request.num_prefix_tokens // block_size * block_size
        head = self._prefix_hashes.get(request.prefix_group)
        if head is None:
            head = token_block_hashes(ids[:num_head_tokens], block_size, model)
            self._prefix_hashes[request.prefix_group] = head
        return head + token_block_hashes(ids[num_head_tokens:], block_size, model,
                                         parent=head[-1])

    # -- the decision ---------------------------------------------------------------------
    def mark_changed(self, index: int) -> None:
        """Backend ``index``'s figures changed: rebuild its state before the next decision."""
        self._changed.add(index)

    def rank(self, plan: RoutePlan, now_s: float) -> tuple[int, int] | None:
        """The index of the backend to send ``plan`` to and the prompt tokens it is expected to
        hold cached, or None when no backend can take it."""
        states = self._states
        if self._draining:
            self._changed |= self._draining
        if self._changed:
            backends, draining = self.backends, self._draining
            for i in self._changed:
                state = states[i] = backends[i].state(now_s)
                if state.num_queued_prefill_tokens > 0:
                    draining.add(i)
                else:
                    draining.discard(i)
            self._changed.clear()
        snapshot = FleetSnapshot(now_s=now_s, backends=tuple(states),
                                 prefix=self._match(plan.request, now_s), max_age_s=self.max_age_s)
        plan.snapshot = snapshot  # as gateway/router.py: started() reads the claim's depth
        ranked = schedule(plan.request, snapshot, self.profile, now_s, self._rng, max_ranked=1)
        if not ranked:
            return None
        return self._by_name[ranked[0].backend], ranked[0].expected_cached_tokens

    def _match(self, request: RouteRequest, now_s: float) -> PrefixMatch:
        """The live router's match (``gateway/router.py``: the exact index, and where it
        knows no holder the approximate index's live claims), on the same indexes, at virtual
        ``now_s``."""
        if self.index_mode == "none":
            return _NO_MATCH
        self._now_s = now_s
        return self._gateway._match(request, now_s)

    # -- bookkeeping ----------------------------------------------------------------------
    def started(self, index: int, plan: RoutePlan, now_s: float,
                expected_cached_tokens: int = 0) -> None:
        """The live router's ``started``, at virtual ``now_s``: the backend's books, the
        expected hit and the approximate index's claim (with its age, for ``learn``)."""
        self._now_s = now_s
        self._gateway.started(self.backends[index], plan, expected_cached_tokens)
        self._changed.add(index)
        plan.snapshot = None  # not kept in flight: a large fleet's plans would hold one each

    def first_token(self, index: int, plan: RoutePlan) -> None:
        self._gateway.first_token(self.backends[index], plan)
        self._changed.add(index)

    def finished(self, index: int, plan: RoutePlan, *, had_first_token: bool) -> None:
        self._gateway.finished(self.backends[index], plan, had_first_token=had_first_token)
        self._changed.add(index)

    def learn(self, index: int, plan: RoutePlan, num_prompt_tokens: int,
              num_cached_tokens: int) -> None:
        """What backend ``index`` reported it had cached of ``plan``'s prompt (the response's
        ``usage``), as the gateway's proxy hands it to ``Router.learn`` at the response's end."""
        self._gateway.learn(self.backends[index], plan, num_prompt_tokens, num_cached_tokens)

    def apply_kv_events(self, index: int, events: Iterable[KvEvent]) -> None:
        """A worker's KV events, as the gateway's fleet sync applies them from Redis."""
        if self.exact_index is None:
            return
        name = self.backends[index].name
        apply = self.exact_index.apply
        for event in events:
            apply(name, cast(EventKind, event.kind), event.block_hashes)
