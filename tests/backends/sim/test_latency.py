"""A plan's step time is the latency model applied to the plan's totals on that worker."""

from __future__ import annotations

import pytest

from backends.engine_core.scheduler import PrefillChunk, StepPlan
from backends.sim.latency import step_time_s
from backends.sim.profile import LatencyModel, WorkerProfile

LATENCY = LatencyModel(a_s=0.01, b_s_per_token=1e-4, c_s_per_seq=1e-3, d_s_per_kv_token=1e-6)


def plan(prefill: int, decodes: int, kv: int) -> StepPlan:
    chunks = (PrefillChunk("p", prefill, prefill),) if prefill else ()
    return StepPlan(chunks, tuple(f"d{i}" for i in range(decodes)), (), prefill, decodes, kv)


@pytest.mark.parametrize(
    ("step", "speed", "expected_s"),
    [
        pytest.param(plan(0, 0, 0), 1.0, 0.0, id="empty"),
        pytest.param(plan(200, 0, 200), 1.0, 0.01 + 0.02 + 0.0002, id="prefill"),
        pytest.param(plan(0, 3, 900), 1.0, 0.01 + 0.003 + 0.0009, id="decode"),
        pytest.param(plan(200, 3, 1100), 4.0, (0.01 + 0.02 + 0.003 + 0.0011) / 4, id="fast"),
    ],
)
def test_step_time_of_a_plan(step: StepPlan, speed: float, expected_s: float) -> None:
    profile = WorkerProfile(model="m", speed_factor=speed, latency=LATENCY)
    assert step_time_s(step, profile) == pytest.approx(expected_s)
