"""Sampling parameters and the sampler: next tokens from a step's logits.

Temperature 0 is greedy (argmax). Otherwise the logits are divided by the temperature, cut to
the ``top_k`` most likely tokens, then to the smallest set whose probability reaches ``top_p``
(the most likely token always stays), and one token is drawn. A request with a ``seed`` draws
from its own `torch.Generator`, seeded once when the request arrives and advanced once per
token, so its output depends on nothing but its prompt and parameters: not on its batch mates,
nor on being preempted and recomputed. Unseeded requests share the sampler's generator.

Example::

    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=32, stop=("\\n",))
    sampler = Sampler(device)
    generator = sampler.new_generator(params.seed)           # per request
    token_ids = sampler.sample(logits, [params], [generator])  # one id per logits row
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MAX_STOP_STRINGS = 16


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples and when it stops; invalid values raise ValueError.

    ``top_k`` 0 (or -1, vLLM's spelling) keeps every token. ``stop`` strings end the output
    before them (the text never includes them, as OpenAI does); ``stop_token_ids`` and, unless
    ``ignore_eos``, the model's EOS end it on that token (counted, not shown as text).

    Example::

        SamplingParams()                                   # greedy, 16 tokens, stop at EOS
        SamplingParams(temperature=0.8, top_k=50, seed=7, max_tokens=64, stop=("###",))
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if (not isinstance(self.temperature, int | float) or not math.isfinite(self.temperature)
                or self.temperature < 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got "
                             f"{self.temperature!r}")
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an integer >= 1, or 0 / -1 to disable it, got "
                             f"{self.top_k!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.stop, str) or not isinstance(self.stop, tuple | list):
            raise ValueError(f"stop must be a tuple of strings, got {self.stop!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got "
                             f"{len(self.stop)}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"each stop string must be a non-empty string, got {self.stop!r}")
        if not isinstance(self.stop_token_ids, tuple | list) or any(
                not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got "
                             f"{self.stop_token_ids!r}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class Sampler:
    """Draws one token per logits row; see the module docstring.

    Example::

        sampler = Sampler(torch.device("cpu"), seed=0)
        sampler.sample(logits, [SamplingParams()], [None])   # [argmax of row 0]
    """

    def __init__(self, device: torch.device, seed: int | None = None) -> None:
        self.device = device
        self._shared = torch.Generator(device=device)
        if seed is None:
            self._shared.seed()
        else:
            self._shared.manual_seed(seed)

    def new_generator(self, seed: int | None) -> torch.Generator | None:
        """A request's own generator when it has a seed; None shares the sampler's."""
        if seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(seed)

    def sample(self, logits: Tensor, params: Sequence[SamplingParams],
               generators: Sequence[torch.Generator | None]) -> list[int]:
        """One token id per row of ``logits`` ([num_rows, vocab], float32)."""
        if not len(params) == len(generators) == logits.shape[0]:
            raise ValueError(f"{logits.shape[0]} logits rows, {len(params)} params and "
                             f"{len(generators)} generators: they must match")
        token_ids = logits.argmax(dim=-1).tolist()
        for row, (row_params, generator) in enumerate(zip(params, generators, strict=True)):
            if not row_params.is_greedy:
                token_ids[row] = self._draw(logits[row], row_params,
                                            generator or self._shared)
        return [int(token_id) for token_id in token_ids]

    @staticmethod
    def _draw(logits: Tensor, params: SamplingParams, generator: torch.Generator) -> int:
        scaled = logits.float() / params.temperature
        if params.top_k > 0 and params.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1:
            sorted_probs, order = torch.sort(probs, descending=True)
            # Drop a token when the more likely ones already reach top_p.
            is_dropped = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
            sorted_probs = sorted_probs.masked_fill(is_dropped, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=generator))
