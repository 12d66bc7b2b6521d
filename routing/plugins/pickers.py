"""The built-in pickers: which candidate goes first, given the weighted total scores.

Randomness comes only from the ``rng`` passed to ``schedule()``, so a seeded ``random.Random``
makes every decision reproducible. Each picker is O(backends).

Example config::

    picker: {type: max_score}
    picker: {type: softmax, temperature: 0.2}
    picker: {type: power_of_two}
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from random import Random

from routing.plugin import below, check_number
from routing.registry import register_picker
from routing.types import BackendState

TIE_EPSILON = 1e-9


@register_picker("max_score")
class MaxScorePicker:
    """The highest score; ties (within 1e-9) broken uniformly by ``rng``."""

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        best = max(scores)
        ties = [i for i, s in enumerate(scores) if s >= best - TIE_EPSILON]
        if len(ties) == 1:
            return ties[0]
        return ties[below(rng, len(ties))]


@register_picker("softmax")
class SoftmaxPicker:
    """Samples ``i`` with probability proportional to ``exp(score_i / temperature)``.

    A low temperature approaches ``max_score``; a high one approaches uniform random.
    """

    def __init__(self, temperature: object = 0.1) -> None:
        self.temperature = check_number("temperature", temperature, above=0)

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        best = max(scores)
        weights = [math.exp((s - best) / self.temperature) for s in scores]
        target = rng.random() * sum(weights)
        for i, weight in enumerate(weights):
            target -= weight
            if target < 0:
                return i
        return len(weights) - 1


@register_picker("power_of_two")
class PowerOfTwoPicker:
    """Samples two distinct candidates and takes the better score (the first on a tie)."""

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        if len(scores) == 1:
            return 0
        first, second = rng.sample(range(len(scores)), 2)
        return first if scores[first] >= scores[second] else second


@register_picker("random")
class RandomPicker:
    """Uniformly at random, ignoring scores."""

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        return below(rng, len(scores))


@register_picker("round_robin")
class RoundRobinPicker:
    """Each call takes the next candidate in turn, ignoring scores.

    The turn counter lives in this picker instance (the one stateful plugin): keep one profile
    per process and build a fresh one (``profile_by_name``) for an independent rotation. When
    the candidate set changes between calls the rotation continues over the new set, so
    fairness is per call, not per backend. Not thread-safe; the gateway's event loop is one
    thread.
    """

    def __init__(self) -> None:
        self._num_calls = 0

    def start_at(self, turn: int) -> None:
        """Continue the rotation from ``turn``: each gateway replica starts at its own, or
        replicas behind a round-robin balancer would rotate in step and send N requests in a
        row to the same backend."""
        self._num_calls = turn

    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        index = self._num_calls % len(scores)
        self._num_calls += 1
        return index
