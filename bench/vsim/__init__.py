"""The virtual-time fleet simulator: ``routing.schedule`` and the simulated engine's core
(``backends.sim.core``), reused as they are, on one event heap, so fleets of hundreds of
workers and 100k+ requests run in minutes on one CPU.

Example::

    from bench.vsim import SharedPrefix, SimConfig, simulate
    from bench.run.workloads.base import WorkloadOptions

    result = simulate(SimConfig(num_workers=8, num_requests=2000, rate_per_s=40.0),
                      SharedPrefix(WorkloadOptions(), num_groups=48, seed=1))
    result.ttft_p50_s, result.cached_fraction, result.share_of_ideal
"""

from __future__ import annotations

from bench.vsim.metrics import Recorder, RunResult
from bench.vsim.profiles import MODEL, PROFILES
from bench.vsim.router import VirtualRouter
from bench.vsim.sim import SimConfig, Simulation, simulate
from bench.vsim.sizing import capacity_per_worker, kv_blocks_for
from bench.vsim.workloads import MultiTurn, SharedPrefix, VRequest, Workload, build_workload

__all__ = ["MODEL", "PROFILES", "MultiTurn", "Recorder", "RunResult", "SharedPrefix",
           "SimConfig", "Simulation", "VRequest", "VirtualRouter", "Workload",
           "build_workload", "capacity_per_worker", "kv_blocks_for", "simulate"]
