"""Multi-turn conversations whose prompts grow turn by turn.

``num_conversations`` conversations are in progress at once; each request is the next turn of a
randomly chosen one, so turns of different conversations interleave. Turn ``n`` sends the whole
history: every earlier question and answer, then a new question. The answers written here are
placeholders of the requested length; the driver swaps in the engine's real answers as they
arrive, and sends turn ``n`` only after turn ``n - 1`` has finished. A finished conversation
(``turns`` long) is replaced by a new one. Example::

    specs = generate(WorkloadOptions(turns=TokenRange(3, 3)), tenants, seed=1)
    [len(s.messages) for s in specs if s.conversation == 0]   # [1, 3, 5]
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from bench.run.spec import Message, RequestSpec, TenantSpec
from bench.run.text import text
from bench.run.workloads.base import WorkloadOptions, shuffled


@dataclass(slots=True)
class _Conversation:
    number: int
    tenant: TenantSpec
    num_turns: int
    history: tuple[Message, ...] = ()
    turn: int = 0


def generate(options: WorkloadOptions, tenants: Sequence[TenantSpec],
             seed: int) -> Iterator[RequestSpec]:
    """Request specs of this workload, without end (see the module docstring)."""
    owners = shuffled(tenants, seed)
    rng = random.Random(f"{seed}:multi-turn")
    num_started = 0

    def start() -> _Conversation:
        nonlocal num_started
        number = num_started
        num_started += 1
        return _Conversation(number, owners[number % len(owners)], options.turns.draw(rng))

    active = [start() for _ in range(max(1, options.num_conversations))]
    index = 0
    while True:
        slot = rng.randrange(len(active))
        conversation = active[slot]
        question: Message = {"role": "user", "content": text(options.question_tokens.draw(rng),
                                                             rng)}
        max_tokens = options.max_tokens.draw(rng)
        messages = (*conversation.history, question)
        yield RequestSpec(
            index=index, tenant=conversation.tenant, max_tokens=max_tokens, messages=messages,
            is_stream=options.is_stream, conversation=conversation.number,
            turn=conversation.turn,
        )
        index += 1
        answer: Message = {"role": "assistant", "content": text(max_tokens, rng)}
        conversation.history = (*messages, answer)
        conversation.turn += 1
        if conversation.turn >= conversation.num_turns:
            active[slot] = start()
