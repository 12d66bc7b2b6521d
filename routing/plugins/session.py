"""Session stickiness by rendezvous (highest-random-weight) hashing.

Each backend gets a pseudo-random draw per session, ``u = blake2b(session_key, backend)``
mapped into (0, 1); the backend with the highest ``-weight / ln(u)`` wins (weighted HRW). The
same key always picks the same backend while it stays a candidate, and when a backend leaves
only the sessions it won move (each to its own runner-up): minimal movement, no ring to keep.
The scores, normalised so the winner has 1, also order the retries (the runner-up next).

Without a session key the scorer falls back to least-load (the ``queue`` scorer's scores), so
the ``session`` profile spreads anonymous traffic instead of hashing it all to one place.
Cost: one 8-byte BLAKE2b per candidate, O(backends).

Example::

    rendezvous_scores("user-42", ["a", "b", "c"], [1.0, 1.0, 1.0])   # e.g. [0.31, 1.0, 0.54]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from hashlib import blake2b

from routing.plugin import Cycle
from routing.plugins.scorers import QueueScorer
from routing.registry import register_scorer
from routing.types import BackendState

_TWO_52 = float(2**52)


def rendezvous_scores(session_key: str, names: Sequence[str],
                      weights: Sequence[float]) -> list[float]:
    """Weighted HRW scores of ``names`` for ``session_key``, the highest scaled to 1."""
    seed = blake2b(session_key.encode(), digest_size=8, person=b"sy-session")
    raw = []
    for name, weight in zip(names, weights, strict=True):
        digest = seed.copy()
        digest.update(b"\x00" + name.encode())
        # 52 bits plus a half: exactly representable, so u is strictly inside (0, 1)
        u = ((int.from_bytes(digest.digest(), "little") >> 12) + 0.5) / _TWO_52
        raw.append(-max(weight, 0.0) / math.log(u))
    best = max(raw, default=0.0)
    if best <= 0:
        return [0.0] * len(raw)
    return [r / best for r in raw]


@register_scorer("session")
class SessionScorer:
    """Rendezvous-hash stickiness on ``request.session_key``; least-load without a key."""

    def __init__(self) -> None:
        self._fallback = QueueScorer()

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        key = cycle.request.session_key
        if not key:
            return self._fallback.score(cycle, candidates)
        return rendezvous_scores(key, [b.name for b in candidates],
                                 [b.weight for b in candidates])
