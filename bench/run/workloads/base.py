"""What every workload shares: its options, token-length ranges, and tenant assignment.

A workload is a pure generator ``generate(options, tenants, seed) -> Iterator[RequestSpec]``:
the same options, tenants and seed give the same requests, in the same order.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.run.spec import RequestSpec, TenantSpec


@dataclass(frozen=True, slots=True)
class TokenRange:
    """An inclusive range of token counts, drawn uniformly; parsed from ``"50-200"`` or ``"64"``.

    Example::

        TokenRange.parse("50-200").draw(random.Random(1))   # 78
    """

    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> TokenRange:
        """A range from ``"LOW-HIGH"`` or a single ``"N"``."""
        low, _, high = text.partition("-")
        try:
            value = cls(int(low), int(high or low))
        except ValueError:
            raise ValueError(f"expected a token count or range such as 50-200, not {text!r}")\
                from None
        if not 0 <= value.low <= value.high:
            raise ValueError(f"a token range needs 0 <= low <= high, not {text!r}")
        return value

    def draw(self, rng: random.Random) -> int:
        """A count drawn uniformly from the range, inclusive."""
        return rng.randint(self.low, self.high)


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """Every workload's knobs; each workload reads the ones it needs.

    Defaults follow ANCHORS.md's routing workload: 1.5-3k-token system prompts, Zipf group
    popularity, unique 50-200-token questions.
    """

    num_groups: int | None = None  # shared-prefix: system prompts (default: one per tenant)
    system_tokens: TokenRange = TokenRange(1500, 3000)
    question_tokens: TokenRange = TokenRange(50, 200)
    max_tokens: TokenRange = TokenRange(32, 128)
    zipf_s: float = 1.1
    num_conversations: int = 16  # multi-turn: conversations in progress at once
    turns: TokenRange = TokenRange(2, 6)  # multi-turn: turns per conversation
    num_docs: int = 4  # long-doc
    doc_tokens: TokenRange = TokenRange(4000, 6000)
    trace_path: Path | None = None
    time_scale: float = 1.0  # trace: 2.0 replays twice as fast
    max_context_tokens: int = 8000  # trace rows are clipped to fit the engine
    is_stream: bool = True


Generate = Callable[[WorkloadOptions, Sequence[TenantSpec], int], Iterator[RequestSpec]]


def zipf_weights(num_items: int, s: float) -> list[float]:
    """Popularity of items ranked 1..n: proportional to ``1 / rank**s``, summing to 1."""
    raw = [1.0 / (rank ** s) for rank in range(1, num_items + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def shuffled(tenants: Sequence[TenantSpec], seed: int) -> list[TenantSpec]:
    """The tenants in a seeded order; item ``i`` (a group, a conversation) belongs to
    ``shuffled(...)[i % len(tenants)]``, so the most popular items are not all one tier's."""
    if not tenants:
        raise ValueError("a workload needs at least one tenant")
    order = list(tenants)
    random.Random(f"{seed}:owners").shuffle(order)
    return order
