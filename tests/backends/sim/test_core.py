"""The engine core in virtual time: analytic TTFT/TPOT, prefix-cache savings, load, purity."""

from __future__ import annotations

import pytest

from backends.engine_core.sequence import Sequence
from backends.sim.core import SimEngineCore
from backends.sim.profile import LatencyModel, WorkerProfile

LATENCY = LatencyModel(a_s=0.01, b_s_per_token=1e-4, c_s_per_seq=1e-3, d_s_per_kv_token=1e-6)


def simulate(core: SimEngineCore, now_s: float = 0.0) -> float:
    """Run until idle in virtual time, each step ending step_time_s after it starts."""
    while core.has_work:
        _, step_s = core.step(now_s)
        now_s += step_s
        core.finish_step(now_s)
    return now_s


def timings(seq: Sequence) -> tuple[float, float]:
    assert seq.first_token_time_s is not None and seq.finish_time_s is not None
    ttft_s = seq.first_token_time_s - seq.arrival_time_s
    tpot_s = (seq.finish_time_s - seq.first_token_time_s) / (seq.num_output_tokens - 1)
    return ttft_s, tpot_s


@pytest.mark.parametrize(
    ("num_prompt", "max_tokens", "budget", "speed"),
    [
        pytest.param(300, 5, 2048, 1.0, id="one-chunk"),
        pytest.param(300, 9, 2048, 2.0, id="one-chunk-2x"),
        pytest.param(5000, 3, 2048, 1.0, id="three-chunks"),
    ],
)
def test_single_request_matches_the_analytic_ttft_and_tpot(
    num_prompt: int, max_tokens: int, budget: int, speed: float
) -> None:
    profile = WorkerProfile(model="m", speed_factor=speed, num_kv_blocks=512,
                            max_num_batched_tokens=budget, latency=LATENCY)
    core = SimEngineCore(profile)
    seq = core.add_request("r", range(num_prompt), max_tokens, now_s=0.0)
    simulate(core)
    a, b, c, d = LATENCY.a_s, LATENCY.b_s_per_token, LATENCY.c_s_per_seq, LATENCY.d_s_per_kv_token
    chunk_ends = [*range(budget, num_prompt, budget), num_prompt]
    chunk_sizes = [end - start for start, end in zip([0, *chunk_ends], chunk_ends, strict=False)]
    expected_ttft_s = sum(a + b * n + d * end for n, end in zip(chunk_sizes, chunk_ends,
                                                                strict=True)) / speed
    expected_tpot_s = sum(a + c + d * (num_prompt + i) for i in range(1, max_tokens)) / (
        (max_tokens - 1) * speed)
    ttft_s, tpot_s = timings(seq)
    assert ttft_s == pytest.approx(expected_ttft_s, rel=1e-9)
    assert tpot_s == pytest.approx(expected_tpot_s, rel=1e-9)
    assert seq.finish_reason == "length"


def test_cached_prefix_cuts_ttft_by_the_prefill_it_skips() -> None:
    profile = WorkerProfile(model="m", speed_factor=1.5, num_kv_blocks=256)
    shared, suffix = list(range(512)), list(range(10_000, 10_100))
    warm = SimEngineCore(profile)
    warm.add_request("first", shared, 2, now_s=0.0)
    now_s = simulate(warm)
    hot = warm.add_request("second", shared + suffix, 2, now_s=now_s)
    plan, step_s = warm.step(now_s)
    assert plan.num_prefill_tokens == 100  # only the uncached suffix
    warm.finish_step(now_s + step_s)
    simulate(warm, now_s + step_s)
    cold_core = SimEngineCore(profile)
    cold = cold_core.add_request("second", shared + suffix, 2, now_s=0.0)
    simulate(cold_core)
    saved_s = timings(cold)[0] - timings(hot)[0]
    expected_s = profile.latency.b_s_per_token * 512 / profile.speed_factor
    assert saved_s == pytest.approx(expected_s, rel=0.01)
    assert hot.num_cached_tokens == 512
    load = warm.load()
    assert (load.prefix_cache_queries_tokens, load.prefix_cache_hits_tokens) == (1124, 512)


def test_load_figures() -> None:
    core = SimEngineCore(WorkerProfile(model="m", num_kv_blocks=10, block_size=4, max_batch=1,
                                       kv_watermark_frac=0.0))
    core.add_request("a", range(6), 4, now_s=0.0)
    core.add_request("b", range(100, 110), 2, now_s=0.0)
    load = core.load()
    assert (load.num_running, load.num_waiting, load.num_queued_prefill_tokens) == (0, 2, 16)
    core.step(0.0)
    core.finish_step(0.1)
    load = core.load()
    assert (load.num_running, load.num_waiting, load.num_queued_prefill_tokens) == (1, 1, 10)
    assert load.kv_usage == pytest.approx(0.2)
    assert (load.num_free_kv_blocks, load.num_cached_kv_blocks, load.num_preemptions) == (8, 1, 0)
    assert [event.kind for event in core.drain_kv_events()] == ["stored"]
    assert core.abort("a") and core.get("a") is None
    assert core.reset_prefix_cache()  # nothing holds KV now: b is still waiting
    assert [event.kind for event in core.drain_kv_events()] == ["cleared"]


def test_step_and_finish_step_alternate() -> None:
    core = SimEngineCore(WorkerProfile(model="m", num_kv_blocks=16))
    with pytest.raises(RuntimeError, match="without a step"):
        core.finish_step(0.0)
    core.add_request("a", range(4), 2, now_s=0.0)
    core.step(0.0)
    with pytest.raises(RuntimeError, match="must follow"):
        core.step(0.0)


def test_add_request_rejects_what_can_never_run() -> None:
    core = SimEngineCore(WorkerProfile(model="m", max_context_tokens=100))
    with pytest.raises(ValueError, match="max_context_tokens"):
        core.add_request("a", range(90), 20, now_s=0.0)
