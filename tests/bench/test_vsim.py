"""bench.vsim: the virtual-time fleet simulator, on small fleets (the module runs in ~6 s)."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from backends.sim.profile import WorkerProfile
from bench.run.workloads.base import TokenRange, WorkloadOptions
from bench.vsim import (
    MODEL,
    MultiTurn,
    RunResult,
    SharedPrefix,
    SimConfig,
    Simulation,
    VRequest,
    kv_blocks_for,
    simulate,
)
from bench.vsim.cli import main
from bench.vsim.metrics import Recorder, summarize
from bench.vsim.router import VirtualRouter
from gateway.router import RoutePlan
from routing.prefix import token_block_hashes

OPTIONS = WorkloadOptions(max_tokens=TokenRange(64, 256))
SMALL = WorkloadOptions(system_tokens=TokenRange(40, 80), question_tokens=TokenRange(5, 20),
                        max_tokens=TokenRange(2, 8), turns=TokenRange(2, 4))


class OneRequest:
    """A workload of one fixed request."""

    name = "one"
    working_set_tokens = 0

    def __init__(self, num_prompt_tokens: int, max_tokens: int) -> None:
        self.max_request_tokens = num_prompt_tokens + max_tokens
        self._request = VRequest(0, tuple(range(num_prompt_tokens)), max_tokens, group=0)

    def next_request(self, index: int) -> VRequest:
        return self._request

    def finished(self, request: VRequest) -> None:
        pass


def figures(result: RunResult) -> dict[str, object]:
    """Everything but the wall-clock measurements."""
    return {k: v for k, v in result.to_dict().items() if k not in ("wall_s",
                                                                   "requests_per_wall_s")}


def test_same_seed_same_results() -> None:
    config = SimConfig(num_workers=4, num_requests=300, profile="prefix_affinity",
                       rate_per_s=60.0, seed=3)
    first = figures(simulate(config, SharedPrefix(OPTIONS, 12, seed=3)))
    assert first == figures(simulate(config, SharedPrefix(OPTIONS, 12, seed=3)))
    other = figures(simulate(replace(config, seed=4), SharedPrefix(OPTIONS, 12, seed=4)))
    assert first != other


@pytest.mark.parametrize("num_prompt_tokens", [
    pytest.param(1000, id="one-chunk"),
    pytest.param(3000, id="two-chunks"),
])
def test_single_request_ttft_is_the_latency_models(num_prompt_tokens: int) -> None:
    profile = WorkerProfile(model=MODEL)
    latency, chunk = profile.latency, profile.max_num_batched_tokens
    expected_s, num_done = 0.0, 0
    while num_done < num_prompt_tokens:  # chunked prefill, each chunk attends to all before it
        num_tokens = min(chunk, num_prompt_tokens - num_done)
        num_done += num_tokens
        expected_s += latency.step_time_s(num_tokens, 0, num_done)
    config = SimConfig(num_workers=1, num_requests=1, profile="round_robin", rate_per_s=1.0)
    result = simulate(config, OneRequest(num_prompt_tokens, max_tokens=4))
    assert result.num_completed == 1
    assert result.ttft_p50_s == pytest.approx(expected_s, rel=1e-9)
    assert result.tpot_p50_s == pytest.approx(latency.step_time_s(0, 1, num_prompt_tokens + 1),
                                              rel=0.01)


def test_prefix_affinity_beats_round_robin_on_shared_prefixes() -> None:
    config = SimConfig(num_workers=8, num_requests=2000, rate_per_s=160.0)
    results = {profile: simulate(replace(config, profile=profile), SharedPrefix(OPTIONS, 48, 1))
               for profile in ("round_robin", "prefix_affinity")}
    rr, pa = results["round_robin"], results["prefix_affinity"]
    assert rr.ideal_cached_fraction == pa.ideal_cached_fraction  # the same requests
    assert pa.cached_fraction > rr.cached_fraction + 0.03
    assert pa.ttft_p50_s < 0.5 * rr.ttft_p50_s
    assert pa.num_completed == rr.num_completed == 1800


def test_hot_prefix_spreads_over_several_workers() -> None:
    options = replace(OPTIONS, zipf_s=0.0)
    simulation = Simulation(
        SimConfig(num_workers=8, num_requests=1500, profile="prefix_affinity", rate_per_s=120.0),
        SharedPrefix(options, 24, seed=1, hot_share=0.3))
    simulation.run()
    recorder = simulation.recorder
    hot = Counter(w for w, g in zip(recorder.worker, recorder.group, strict=True) if g == 0)
    assert sum(hot.values()) == pytest.approx(0.3 * 1500, rel=0.1)
    # the hot group is 2.4 workers' worth of load: it must not stay on its first holder
    assert len([n for n in hot.values() if n >= 0.05 * sum(hot.values())]) >= 3


@pytest.mark.parametrize(("profile", "num_silent", "silent_gets_requests"), [
    pytest.param("round_robin", 1, False, id="rr-one-silent-is-dropped"),
    pytest.param("prefix_affinity", 1, False, id="pa-one-silent-is-dropped"),
    pytest.param("round_robin", 4, True, id="rr-all-silent-all-kept"),
])
def test_stale_load_figures_follow_the_fresh_filter(profile: str, num_silent: int,
                                                    silent_gets_requests: bool) -> None:
    config = SimConfig(num_workers=4, num_requests=300, profile=profile, rate_per_s=100.0,
                       max_age_s=1.0, num_silent_workers=num_silent, warmup_fraction=0.0)
    simulation = Simulation(config, SharedPrefix(SMALL, 4, seed=1))
    simulation.run()
    recorder = simulation.recorder
    late = [w for w, t in zip(recorder.worker, recorder.arrival_s, strict=True) if t > 1.0]
    early = [w for w, t in zip(recorder.worker, recorder.arrival_s, strict=True) if t <= 1.0]
    assert 0 in early  # fresh at first: worker 0 takes its turn
    assert (0 in late) is silent_gets_requests
    assert len(set(late)) == 4 if silent_gets_requests else set(late) == {1, 2, 3}


def test_cached_states_give_exact_staleness_verdicts() -> None:
    # heartbeats every 0.7 s, stale after 0.5 s: every worker goes stale between heartbeats
    config = SimConfig(num_workers=3, num_requests=300, profile="least_load", rate_per_s=50.0,
                       heartbeat_s=0.7, max_age_s=0.5, num_silent_workers=1)
    simulation = Simulation(config, SharedPrefix(SMALL, 4, seed=1))
    router = simulation.router
    rank = router.rank
    verdicts: list[bool] = []

    def checked_rank(plan: RoutePlan, now_s: float) -> int | None:
        index = rank(plan, now_s)
        cached = [s.age_s > config.max_age_s for s in router._states]
        exact = [b.state(now_s).age_s > config.max_age_s for b in router.backends]
        assert cached == exact, now_s
        verdicts.extend(exact)
        return index

    router.rank = checked_rank  # type: ignore[method-assign]
    simulation.run()
    assert len(verdicts) == 900 and 0.2 < sum(verdicts) / 900 < 0.8


def test_router_hashes_a_shared_prefix_once_with_the_same_result() -> None:
    workload = SharedPrefix(SMALL, 3, seed=2)
    router = VirtualRouter([], "round_robin", "exact", model=MODEL)
    for index in range(20):
        request = workload.next_request(index)
        assert router.block_hashes(request) == token_block_hashes(request.prompt_ids, 16, MODEL)
    assert len(router._prefix_hashes) == 3


def test_multi_turn_prompts_grow_by_the_previous_turn() -> None:
    workload = MultiTurn(SMALL, num_conversations=2, seed=1)
    first = workload.next_request(0)
    workload.finished(first)
    later = [workload.next_request(i) for i in range(1, 4)]
    follow_up = [r for r in later if r.group == first.group]
    assert follow_up and follow_up[0].prompt_ids[:len(first.prompt_ids)] == first.prompt_ids
    assert len(follow_up[0].prompt_ids) > len(first.prompt_ids) + first.max_tokens


@pytest.mark.parametrize(("fraction", "expected_blocks"), [
    pytest.param(1.0, 50, id="whole-working-set"),
    pytest.param(0.01, None, id="floored-to-the-largest-request"),
])
def test_kv_fraction_sizes_caches(fraction: float, expected_blocks: int | None) -> None:
    workload = SharedPrefix(SMALL, 10, seed=1)
    profile = WorkerProfile(model=MODEL)
    blocks = kv_blocks_for(fraction, workload, profile)
    if expected_blocks is None:
        assert blocks * 16 >= workload.max_request_tokens
    else:
        assert blocks == math.ceil(workload.working_set_tokens / 16)
        assert workload.working_set_tokens == pytest.approx(10 * 60, rel=0.35)


def test_cli_prints_a_table_and_writes_json(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vsim.json"
    code = main(["--workers", "2", "--requests", "60", "--workload", "multi-turn",
                 "--profiles", "round_robin,prefix_affinity_approx", "--rate", "20",
                 "--question-tokens", "5-20", "--max-tokens", "2-8", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    assert "| round_robin |" in table and "| prefix_affinity_approx |" in table
    assert '"profile": "prefix_affinity_approx"' in out.read_text()


def test_missed_counts_requests_under_half_their_ideal_hit() -> None:
    """A request whose prompt the fleet had seen (its ideal hit) but that got under half of it
    cached is a miss; the warm-up's requests and ones with nothing to hit are not."""
    recorder = Recorder(num_requests=5, block_size=16)
    prompt = tuple(range(1, 9))  # 8 blocks' hashes
    for index in range(5):
        recorder.arrived(index, at_s=float(index), block_hashes=prompt, num_prompt_tokens=129)
        recorder.first_token_s[index] = index + 0.1
        recorder.finish_s[index] = index + 0.2
        recorder.num_output_tokens[index] = 2
        recorder.worker[index] = 0
    # ideal: 0 for the first (left out as warm-up), 128 tokens for the rest; cached 0 (a
    # miss), 64 (exactly half: a hit), 63 (a miss) and 128.
    recorder.num_cached_tokens[:] = [0, 0, 64, 63, 128]
    assert recorder.num_ideal_tokens == [0, 128, 128, 128, 128]
    result = summarize(recorder, profile="p", workload="w", rate_per_s=1.0,
                       kv_tokens_per_worker=1, busy_s=[1.0], num_preemptions=0, wall_s=1.0,
                       num_warmup=1)
    assert result.num_completed == 4
    assert result.missed_fraction == pytest.approx(2 / 4)  # indexes 1 and 3
