"""Sizing a run: worker KV caches relative to the working set, and the arrival rate for a load.

**KV fraction.** ``kv_blocks_for(fraction, workload, profile)`` gives each worker
``fraction * workload.working_set_tokens`` tokens of KV cache (see ``workloads`` for the working
set), but never less than the largest request needs (an engine must hold any request whole,
past its watermark), so very small fractions are floored.

**Load.** ``load`` is a fraction of the fleet's capacity with round-robin routing, measured by
simulation (``capacity_per_worker``): one worker gets a burst of ``3 * max_batch`` requests
of the workload at once (it routes round-robin over one worker, so it sees the same request mix
as each worker of a round-robin fleet of any size), and its capacity is the completion rate
between the 20th and 80th percentile of completions, when the batch is full and the cache
warm. ``rate = load * num_workers * capacity``. The figure includes round-robin's own prefix
cache hits (each worker sees every group), so "75 % load" means 75 % of what round-robin can
sustain; a router that caches better has more headroom at the same rate. For ``multi-turn``
the burst is all first turns (no conversation has finished yet), so its capacity is only an
estimate; pass ``--rate`` for exact control.

Example::

    capacity = capacity_per_worker(SimConfig(worker=profile), make_workload)   # req/s
    rate_per_s = 0.75 * 8 * capacity
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from backends.sim.profile import WorkerProfile
from bench.vsim.sim import SimConfig, Simulation
from bench.vsim.workloads import Workload

BURST_RATE_PER_S = 1e6  # arrivals a microsecond apart: a burst


def min_kv_blocks(workload: Workload, profile: WorkerProfile) -> int:
    """The fewest KV blocks that hold the workload's largest request past the watermark."""
    num_blocks = -(-workload.max_request_tokens // profile.block_size)
    return math.ceil(num_blocks / (1 - profile.kv_watermark_frac)) + 1


def kv_blocks_for(fraction: float, workload: Workload, profile: WorkerProfile) -> int:
    """KV blocks per worker for ``fraction`` of the working set (floored; module docstring)."""
    if not fraction > 0:
        raise ValueError(f"KV fraction must be > 0, got {fraction}")
    wanted = math.ceil(fraction * workload.working_set_tokens / profile.block_size)
    return max(wanted, min_kv_blocks(workload, profile))


def capacity_per_worker(config: SimConfig, make_workload: Callable[[], Workload],
                        num_requests: int | None = None) -> float:
    """Requests/s one worker sustains under round-robin (see the module docstring)."""
    count = num_requests or 3 * config.worker.max_batch
    burst = replace(config, num_workers=1, num_requests=count, profile="round_robin",
                    rate_per_s=BURST_RATE_PER_S, num_silent_workers=0)
    simulation = Simulation(burst, make_workload())
    simulation.run()
    finish_s = sorted(t for t in simulation.recorder.finish_s if not math.isnan(t))
    low, high = int(0.2 * len(finish_s)), int(0.8 * len(finish_s)) - 1
    if high <= low or finish_s[high] <= finish_s[low]:
        raise ValueError("too few requests completed to measure capacity")
    return (high - low) / (finish_s[high] - finish_s[low])
