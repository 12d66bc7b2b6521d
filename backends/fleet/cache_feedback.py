"""What a backend's responses said of its prefix cache, against what routing expected.

Routing expects a backend to hold some of each prompt (``Ranked.expected_cached_tokens``,
from the prefix index); the engine's answer says what it really had
(``usage.prompt_tokens_details.cached_tokens``). ``CacheFeedback`` keeps both per backend:
totals for ``/metrics`` and ``GET /admin/fleet``, and a window of recent responses that tells
when affinity has stopped working there (much expected, almost nothing reported: prefix
caching off, a cache too small for the traffic, a different tokenizer) so that the gateway
can say so in its log.

Example::

    feedback = CacheFeedback()
    feedback.add(num_prompt_tokens=2000, expected_cached_tokens=1800, reported_cached_tokens=0)
    feedback.hit_ratios()       # (0.9, 0.0): expected, reported
    feedback.is_broken()        # True once WINDOW responses say so
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 32  # responses with an expectation that decide is_broken
_MIN_EXPECTED_SHARE = 0.3  # affinity expected at least this share of the prompts...
_MAX_REPORTED_SHARE = 0.05  # ...and the engine reported at most this share of that


@dataclass(slots=True)
class CacheFeedback:
    """Expected and reported cached tokens of one backend's responses."""

    num_responses: int = 0
    num_prompt_tokens: int = 0
    num_expected_cached_tokens: int = 0
    num_reported_cached_tokens: int = 0
    _recent: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=WINDOW), repr=False)

    def add(self, num_prompt_tokens: int, expected_cached_tokens: int,
            reported_cached_tokens: int) -> None:
        self.num_responses += 1
        self.num_prompt_tokens += num_prompt_tokens
        self.num_expected_cached_tokens += expected_cached_tokens
        self.num_reported_cached_tokens += reported_cached_tokens
        if expected_cached_tokens > 0:
            self._recent.append((num_prompt_tokens, expected_cached_tokens,
                                 reported_cached_tokens))

    def hit_ratios(self) -> tuple[float, float]:
        """(expected, reported) cached tokens as shares of the prompt tokens, all responses."""
        prompt = max(1, self.num_prompt_tokens)
        return self.num_expected_cached_tokens / prompt, self.num_reported_cached_tokens / prompt

    def is_broken(self) -> bool:
        """The last ``WINDOW`` responses expected to hit much and reported almost nothing."""
        recent = self._recent
        if len(recent) < WINDOW:
            return False
        prompt = sum(r[0] for r in recent)
        expected = sum(r[1] for r in recent)
        reported = sum(r[2] for r in recent)
        return (expected >= _MIN_EXPECTED_SHARE * prompt
                and reported <= _MAX_REPORTED_SHARE * expected)
