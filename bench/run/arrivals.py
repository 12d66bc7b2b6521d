"""Arrival processes for open-loop runs: pure functions of a seeded ``random.Random``.

- ``poisson``: exponential gaps, coefficient of variation (CV) 1;
- ``gamma``: gamma-distributed gaps with the same mean and a chosen CV (burstiness): CV > 1 is
  burstier than Poisson, CV < 1 more regular, CV = 1 is Poisson;
- ``uniform``: evenly spaced, CV 0.

A sweep runs one phase per rate, back to back. Example::

    arrivals = list(sweep([10.0, 20.0], phase_s=5.0, process="gamma", cv=2.0,
                          rng=random.Random(1)))
    arrivals[0]   # Arrival(at_s=0.03..., phase=0)
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

Process = Literal["poisson", "gamma", "uniform"]
PROCESSES: tuple[Process, ...] = ("poisson", "gamma", "uniform")


@dataclass(frozen=True, slots=True)
class Arrival:
    """When a request arrives (seconds from the start of the run) and in which phase."""

    at_s: float
    phase: int


def as_process(name: str) -> Process:
    """The arrival process called ``name``; ValueError for an unknown one."""
    for process in PROCESSES:
        if name == process:
            return process
    raise ValueError(f"unknown arrival process {name!r}; use one of {', '.join(PROCESSES)}")


def gap_s(rate_per_s: float, process: Process, cv: float, rng: random.Random) -> float:
    """One inter-arrival gap with mean ``1 / rate_per_s``."""
    if rate_per_s <= 0:
        raise ValueError(f"rate must be > 0, got {rate_per_s}")
    if process == "poisson":
        return rng.expovariate(rate_per_s)
    if process == "uniform":
        return 1.0 / rate_per_s
    if cv <= 0:
        raise ValueError(f"gamma arrivals need a CV > 0, got {cv}")
    shape = 1.0 / (cv * cv)
    return rng.gammavariate(shape, 1.0 / (rate_per_s * shape))


def sweep(rates_per_s: Sequence[float], phase_s: float, process: Process, cv: float,
          rng: random.Random) -> Iterator[Arrival]:
    """Arrivals for each rate in turn, ``phase_s`` seconds per phase."""
    for phase, rate in enumerate(rates_per_s):
        start_s = phase * phase_s
        offset_s = gap_s(rate, process, cv, rng) if process != "uniform" else 0.0
        while offset_s < phase_s:
            yield Arrival(start_s + offset_s, phase)
            offset_s += gap_s(rate, process, cv, rng)

