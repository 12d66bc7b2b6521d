"""Cores apart for the simulated engines: what a real deployment has and a loopback bench lacks.

On a real fleet the engines run on their GPUs' hosts, so a gateway's CPU never delays an
engine step. On one small machine the simulated engines share cores with the gateways, Redis,
the front and the load generator, and every extra core-second a run's gateways use makes the
engines' steps wake late (the sim's ``lateness``): a comparison of 1 and N gateway replicas then
measures the replicas' CPU on the engines as much as their routing. ``engines_apart`` gives the
engine processes the first core of this process's affinity set and everything else the rest,
Linux's ``sched_setaffinity`` per thread (other people's processes are not touched).

Example::

    plan = CorePlan.split()            # None on a single core
    plan.keep_self()                   # before spawning: children inherit the rest
    ...                                # start the fleet
    plan.pin_engines([sim_pid])        # the engine process (every thread) to its own core
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of ``pid`` (and of its children) onto ``cpus``."""
    pin_threads(pid, cpus)
    for child in _children(pid):
        pin(child, cpus)


def pin_threads(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of ``pid`` onto ``cpus``, its children left where they are."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended since it was listed


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in _threads(pid):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except (FileNotFoundError, PermissionError):
            continue
        out += [int(word) for word in text.split()]
    return out


@dataclass(frozen=True, slots=True)
class CorePlan:
    """Which cores the engines get and which everything else gets."""

    engines: frozenset[int]
    rest: frozenset[int]

    @classmethod
    def split(cls) -> CorePlan | None:
        """The first core of this process's set for the engines, the others for the rest;
        None when this process may run on one core only."""
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            return None
        return cls(frozenset(cpus[:1]), frozenset(cpus[1:]))

    def keep_self(self) -> frozenset[int]:
        """This process (and what it spawns from now on) onto ``rest``; the set it had."""
        before = frozenset(os.sched_getaffinity(0))
        pin(os.getpid(), self.rest)
        return before

    def pin_engines(self, pids: Iterable[int]) -> None:
        for pid in pids:
            pin(pid, self.engines)

    def pin_driver(self, pids: Iterable[int]) -> None:
        """This process's threads (not its children: the fleet stays on ``rest``) and ``pids``
        onto the engines' core: the load generator and the front, whose work is the same
        whatever is measured, off the core the gateways share."""
        pin_threads(os.getpid(), self.engines)
        for pid in pids:
            pin(pid, self.engines)

    def unpin_driver(self, pids: Iterable[int]) -> None:
        pin_threads(os.getpid(), self.rest)
        for pid in pids:
            pin(pid, self.rest)

    def describe(self) -> dict[str, list[int]]:
        return {"engines": sorted(self.engines), "rest": sorted(self.rest)}
