"""Shortlist: score a large fleet's likely winners, not every backend.

A decision over every backend costs one Python pass per plugin per backend (~1-2 µs per pass
for 64 backends, ~15 passes). In a large fleet most backends cannot win a prefix-affinity
decision: the ones holding the request's prefix are known from the index match, and among the
rest the load scores only need a few good alternatives, not the single least-loaded one. So
when the snapshot has more than ``above`` backends, ``schedule()`` first shortlists:

- the ``holders`` backends holding the most blocks of the request's prefix (ties broken
  at random by ``rng``);
- ``sampled`` backends drawn at random (``rng``) from the whole snapshot, the "power of d
  choices": the best of 8 random backends is nearly as lightly loaded as the best of all, and
  random draws keep several gateway replicas reading the same heartbeat from all sending to
  the same least-loaded backend until the next one. The draw is a random rotation of every
  (n / sampled)-th backend: one random number, and every backend equally likely;

and runs the profile's filters, scorers and picker on those alone. When the
shortlist cannot decide — a filter drops all of it, or a soft filter (``fresh``,
``not_saturated``) finds none of it passing, which says little about the rest of the fleet —
the decision is taken again over the whole snapshot, so a shortlist never sends a request to a
stale or saturated backend that the full decision would have avoided.

Cost: O(sampled) for the draw; for the holders O(holders) with ``snapshot.positions`` (the
gateway keeps it) or one pass over the snapshot without, plus O(h log h) when more than
``holders`` backends hold the prefix; then the profile's cost over at most ``holders + sampled``
backends.

Example config (``routing.profiles``)::

    shortlist: {above: 16, holders: 4, sampled: 8}
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from heapq import nlargest
from random import Random
from typing import Any

from routing.plugin import below, check_number
from routing.types import BackendState, FleetSnapshot

SETTINGS = ("above", "holders", "sampled")


@dataclass(frozen=True, slots=True)
class Shortlist:
    """Which backends a decision over more than ``above`` of them scores."""

    above: int = 16
    holders: int = 4
    sampled: int = 8

    @classmethod
    def from_config(cls, config: object) -> Shortlist:
        """From a profile's ``shortlist`` mapping; a ValueError naming the bad key if not."""
        if not isinstance(config, Mapping):
            raise ValueError(f"shortlist: expected a mapping, got {config!r}")
        unknown = [key for key in config if key not in SETTINGS]
        if unknown:
            raise ValueError(f"shortlist.{unknown[0]}: unknown setting; expected "
                             f"{', '.join(SETTINGS)}")
        values: dict[str, Any] = {}
        for key in SETTINGS:
            if key in config:
                number = check_number(f"shortlist.{key}", config[key], minimum=0)
                if number != int(number):
                    raise ValueError(f"shortlist.{key} must be a whole number, got "
                                     f"{config[key]!r}")
                values[key] = int(number)
        shortlist = cls(**values)
        if shortlist.holders + shortlist.sampled < 1:
            raise ValueError("shortlist: holders + sampled must be at least 1")
        return shortlist

    def applies(self, snapshot: FleetSnapshot) -> bool:
        return len(snapshot.backends) > self.above

    def candidates(self, snapshot: FleetSnapshot, rng: Random) -> list[BackendState]:
        """The deepest prefix holders and the sample, in snapshot order. The sample is a random
        rotation of every (n / sampled)-th backend: each backend is drawn with probability
        sampled / n, for one random number."""
        backends = snapshot.backends
        num_backends = len(backends)
        if not num_backends:
            return []
        num_sampled = min(self.sampled, num_backends)
        step = max(1, num_backends // num_sampled) if num_sampled else 1
        start = below(rng, num_backends)
        chosen = {(start + i * step) % num_backends for i in range(num_sampled)}
        num_blocks = snapshot.prefix.num_blocks
        if num_blocks and self.holders:
            holders: Collection[str]
            if len(num_blocks) <= self.holders:
                holders = num_blocks.keys()
            else:
                # The deepest; among equals (a prefix many backends hold equally deep) nlargest
                # keeps the first, so the scan starts at a random one of them, in name order
                # (deterministic for a seeded rng, whatever the hash seed).
                names = sorted(num_blocks)
                first = below(rng, len(names))
                holders = nlargest(self.holders, names[first:] + names[:first],
                                   key=num_blocks.__getitem__)
            if not self._add_positions(snapshot, holders, chosen):
                held = set(holders)
                chosen.update(i for i, b in enumerate(backends) if b.name in held)
        return [backends[i] for i in sorted(chosen)]

    @staticmethod
    def _add_positions(snapshot: FleetSnapshot, holders: Collection[str],
                       chosen: set[int]) -> bool:
        """Add the holders' indices from ``snapshot.positions``; False when there is none or
        it does not fit the snapshot (then the caller scans). A name it lacks is a backend the
        snapshot does not have (departed, or serving another model)."""
        positions = snapshot.positions
        if positions is None:
            return False
        backends = snapshot.backends
        found = []
        for name in holders:
            position = positions.get(name)
            if position is None:
                continue
            if position >= len(backends) or backends[position].name != name:
                return False
            found.append(position)
        chosen.update(found)
        return True
