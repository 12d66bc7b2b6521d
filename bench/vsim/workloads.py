"""Request streams for the virtual-time simulator: token-id prompts in ``bench.run``'s shapes.

The live load generator's workloads (``bench.run.workloads``) write text; the simulator needs
token ids, and tokenizing 100k prompts would cost more than simulating them. So these draw
token ids directly, with the same shape parameters (``WorkloadOptions``: ``TokenRange``
lengths, Zipf popularity via ``zipf_weights``, per-part seeds via ``sub_rng``):

- ``shared-prefix``: ``num_groups`` system prompts (``system_tokens`` long) with Zipf
  popularity (``zipf_s``; 0 is uniform), each request one of them plus a unique question;
- ``hot-prefix``: the same, but group 0 carries ``hot_share`` of the traffic and the others
  share the rest by the same Zipf law;
- ``multi-turn``: conversations whose prompts grow turn by turn. A turn is sent only after the
  previous one finished (as ``bench.run``'s driver does): each arrival takes a random
  conversation that is not waiting for an answer, starting a new one when none is ready; a
  conversation that reached its ``turns`` is replaced. The answer appended to the history is
  ``max_tokens`` placeholder ids (the simulated engine always runs to ``max_tokens``).

``working_set_tokens`` is what ``--kv-fraction`` sizes caches against: the tokens of every
distinct shared prefix (all groups' system prompts), or for multi-turn the conversations in
progress at their mean final length (``num_conversations * mean turns * (question + answer)``).

Example::

    workload = SharedPrefix(WorkloadOptions(), num_groups=24, seed=1)
    request = workload.next_request(0)
    request.group, len(request.prompt_ids), request.num_prefix_tokens
"""

from __future__ import annotations

import random
from bisect import bisect
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

from bench.run.text import sub_rng
from bench.run.workloads.base import TokenRange, WorkloadOptions, zipf_weights

VOCAB_SIZE = 32_000
_VOCAB = list(range(VOCAB_SIZE))  # shared int objects: a prompt costs 8 bytes per token
WORKLOAD_NAMES = ("shared-prefix", "hot-prefix", "multi-turn")


def token_ids(num_tokens: int, rng: random.Random) -> tuple[int, ...]:
    """``num_tokens`` token ids drawn uniformly from the vocabulary."""
    return tuple(rng.choices(_VOCAB, k=num_tokens))


def mean_tokens(tokens: TokenRange) -> float:
    return (tokens.low + tokens.high) / 2


@dataclass(frozen=True, slots=True)
class VRequest:
    """One request of a workload.

    Requests with the same ``prefix_group`` share their first ``num_prefix_tokens`` tokens (a
    system prompt); the router hashes that part once per group. None: nothing known shared.
    ``text`` is the prompt as the gateway reads it (``bench.vsim.replay``): when set, the
    approximate index hashes it as the gateway does, not the token blocks.
    """

    index: int
    prompt_ids: tuple[int, ...]
    max_tokens: int
    group: int
    prefix_group: int | None = None
    num_prefix_tokens: int = 0
    text: str | None = None


class Workload(Protocol):
    """A seeded request stream; ``finished`` tells it a request's answer is complete."""

    name: str
    working_set_tokens: int
    max_request_tokens: int

    def next_request(self, index: int) -> VRequest: ...

    def finished(self, request: VRequest) -> None: ...


class SharedPrefix:
    """``shared-prefix`` and ``hot-prefix`` (see the module docstring)."""

    def __init__(self, options: WorkloadOptions, num_groups: int, seed: int,
                 hot_share: float | None = None) -> None:
        if num_groups < 1:
            raise ValueError(f"a shared-prefix workload needs >= 1 group, got {num_groups}")
        weights = zipf_weights(num_groups, options.zipf_s)
        self.name = "shared-prefix"
        if hot_share is not None:
            if not 0 < hot_share <= 1:
                raise ValueError(f"hot share must be in (0, 1], got {hot_share}")
            rest = zipf_weights(num_groups - 1, options.zipf_s) if num_groups > 1 else []
            weights = [hot_share, *[(1 - hot_share) * w for w in rest]]
            self.name = "hot-prefix"
        self.options = options
        self.weights = weights
        self._cum_weights = list(accumulate(weights))
        self._prompts = [token_ids(options.system_tokens.draw(sub_rng(seed, "system", g)),
                                   sub_rng(seed, "system-ids", g)) for g in range(num_groups)]
        self._rng = random.Random(f"{seed}:vsim-shared-prefix")
        self.working_set_tokens = sum(map(len, self._prompts))
        self.max_request_tokens = (options.system_tokens.high + options.question_tokens.high
                                   + options.max_tokens.high)

    def next_request(self, index: int) -> VRequest:
        rng = self._rng
        cum_weights = self._cum_weights
        group = min(bisect(cum_weights, rng.random() * cum_weights[-1]), len(cum_weights) - 1)
        system = self._prompts[group]
        question = token_ids(self.options.question_tokens.draw(rng), rng)
        return VRequest(index, system + question, self.options.max_tokens.draw(rng), group,
                        prefix_group=group, num_prefix_tokens=len(system))

    def finished(self, request: VRequest) -> None:
        pass


@dataclass(slots=True)
class _Conversation:
    number: int
    num_turns: int
    history: tuple[int, ...] = ()
    turn: int = 0


class MultiTurn:
    """``multi-turn`` (see the module docstring)."""

    name = "multi-turn"

    def __init__(self, options: WorkloadOptions, num_conversations: int, seed: int) -> None:
        if num_conversations < 1:
            raise ValueError(f"multi-turn needs >= 1 conversation, got {num_conversations}")
        self.options = options
        self._rng = random.Random(f"{seed}:vsim-multi-turn")
        self._num_started = 0
        self._ready = [self._start() for _ in range(num_conversations)]
        self._waiting: dict[int, _Conversation] = {}  # request index -> its conversation
        turn_tokens = mean_tokens(options.question_tokens) + mean_tokens(options.max_tokens)
        self.working_set_tokens = int(num_conversations * mean_tokens(options.turns)
                                      * turn_tokens)
        self.max_request_tokens = options.turns.high * (options.question_tokens.high
                                                        + options.max_tokens.high)

    def _start(self) -> _Conversation:
        self._num_started += 1
        return _Conversation(self._num_started - 1, self.options.turns.draw(self._rng))

    def next_request(self, index: int) -> VRequest:
        rng = self._rng
        ready = self._ready
        if not ready:
            ready.append(self._start())
        slot = rng.randrange(len(ready))
        conversation = ready[slot]
        ready[slot] = ready[-1]
        ready.pop()
        self._waiting[index] = conversation
        question = token_ids(self.options.question_tokens.draw(rng), rng)
        return VRequest(index, conversation.history + question,
                        self.options.max_tokens.draw(rng), conversation.number)

    def finished(self, request: VRequest) -> None:
        conversation = self._waiting.pop(request.index)
        conversation.turn += 1
        if conversation.turn >= conversation.num_turns:
            conversation = self._start()
        else:
            conversation.history = request.prompt_ids + token_ids(request.max_tokens, self._rng)
        self._ready.append(conversation)


def build_workload(name: str, options: WorkloadOptions, *, num_groups: int,
                   num_conversations: int, hot_share: float, seed: int) -> Workload:
    """The workload called ``name`` (one of ``WORKLOAD_NAMES``)."""
    if name == "shared-prefix":
        return SharedPrefix(options, num_groups, seed)
    if name == "hot-prefix":
        return SharedPrefix(options, num_groups, seed, hot_share=hot_share)
    if name == "multi-turn":
        return MultiTurn(options, num_conversations, seed)
    raise ValueError(f"unknown workload {name!r}; use one of {', '.join(WORKLOAD_NAMES)}")
