"""How long a planned step takes on a given worker.

Example::

    plan = scheduler.schedule(now_s)
    step_s = step_time_s(plan, profile)   # profile.latency priced, / profile.speed_factor
"""

from __future__ import annotations

from backends.engine_core.scheduler import StepPlan
from backends.sim.profile import WorkerProfile


def step_time_s(plan: StepPlan, profile: WorkerProfile) -> float:
    """Seconds ``plan`` runs on ``profile``'s worker; 0.0 for an empty plan."""
    return profile.latency.step_time_s(
        num_prefill_tokens=plan.num_prefill_tokens,
        num_decode_seqs=plan.num_decode_seqs,
        num_kv_tokens=plan.num_kv_tokens_attended,
        speed_factor=profile.speed_factor,
    )
