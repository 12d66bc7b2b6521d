"""Request bodies for the soak: every prompt new, or a few prompts over and over (the control).

A prompt is 200-2,000 words of random common English (`bench.run.text`, one token a word), so
its size is realistic and no two prompts share even a first 64-character block. A share of the
requests are multi-turn chats (a system prompt, then user and assistant turns ending with the
user's), the rest one user message; a share are streamed. Pure: the generator is seeded.
Example::

    prompts = UniquePrompts(PromptShape(), model="switchyard-sim", seed=1)
    body, is_stream = prompts.body(0)          # JSON bytes, never seen before
    control = RepeatedPrompts(PromptShape(), model="switchyard-sim", seed=1, num_prompts=8)
    control.body(8) == control.body(0)         # True: the pool cycles
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

from bench.run.text import text


@dataclass(frozen=True, slots=True)
class PromptShape:
    """How long prompts are, how many are chats of several turns, how many are streamed."""

    min_words: int = 200
    max_words: int = 2000
    multi_turn_share: float = 0.3
    stream_share: float = 0.25
    max_tokens: int = 8


def _split(num_words: int, num_parts: int, rng: random.Random) -> list[int]:
    """``num_words`` cut into ``num_parts`` non-empty pieces at random points."""
    cuts = sorted(rng.sample(range(1, num_words), num_parts - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, num_words], strict=True)]


def messages(shape: PromptShape, rng: random.Random) -> list[dict[str, str]]:
    """One request's messages: a single user turn, or a system prompt and 2-4 user turns with
    the assistant's answers between them."""
    num_words = rng.randint(shape.min_words, shape.max_words)
    if rng.random() >= shape.multi_turn_share:
        return [{"role": "user", "content": text(num_words, rng)}]
    num_user_turns = rng.randint(2, 4)
    roles = ["system"] + ["user", "assistant"] * (num_user_turns - 1) + ["user"]
    return [{"role": role, "content": text(size, rng)}
            for role, size in zip(roles, _split(num_words, len(roles), rng), strict=True)]


def chat_body(shape: PromptShape, model: str, rng: random.Random) -> tuple[bytes, bool]:
    """A chat completion request (JSON) and whether it asks for a stream."""
    is_stream = rng.random() < shape.stream_share
    body: dict[str, Any] = {"model": model, "messages": messages(shape, rng),
                            "max_tokens": shape.max_tokens, "stream": is_stream}
    if is_stream:
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body), is_stream


class UniquePrompts:
    """A new prompt for every request."""

    def __init__(self, shape: PromptShape, model: str, seed: int) -> None:
        self._shape = shape
        self._model = model
        self._rng = random.Random(f"{seed}:unique")

    def body(self, index: int) -> tuple[bytes, bool]:
        return chat_body(self._shape, self._model, self._rng)


class RepeatedPrompts:
    """``num_prompts`` prompts made once, sent in turn: the control run."""

    def __init__(self, shape: PromptShape, model: str, seed: int, num_prompts: int = 8) -> None:
        rng = random.Random(f"{seed}:repeated")
        self._pool = [chat_body(shape, model, rng) for _ in range(num_prompts)]

    def body(self, index: int) -> tuple[bytes, bool]:
        return self._pool[index % len(self._pool)]
