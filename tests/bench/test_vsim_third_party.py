"""bench.vsim's third-party mode: engines the gateway knows only by scraping them (~6 s)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from backends.fleet.registry import Backend
from backends.sim.core import SimEngineCore
from backends.sim.profile import WorkerProfile
from bench.run.workloads.base import TokenRange, WorkloadOptions
from bench.vsim import MODEL, SharedPrefix, SimConfig, Simulation, VRequest
from bench.vsim.cli import main
from bench.vsim.router import VirtualRouter
from bench.vsim.scrape import EnginePages
from gateway.router import RoutePlan
from routing.types import BackendProfile

SMALL = WorkloadOptions(system_tokens=TokenRange(40, 80), question_tokens=TokenRange(5, 20),
                        max_tokens=TokenRange(2, 8), turns=TokenRange(2, 4))
OPTIONS = WorkloadOptions(max_tokens=TokenRange(16, 64))
THIRD_PARTY = SimConfig(num_workers=3, num_requests=400, profile="prefix_affinity_approx",
                        rate_per_s=120.0, mode="third-party", warmup_fraction=0.0)


def test_third_party_fleet_sends_no_heartbeats_and_no_kv_events() -> None:
    simulation = Simulation(THIRD_PARTY, SharedPrefix(OPTIONS, 12, seed=1))
    pushed: list[int] = []
    push = simulation._push

    def counted_push(at_s: float, kind: int, worker: int) -> None:
        pushed.append(kind)
        push(at_s, kind, worker)

    simulation._push = counted_push  # type: ignore[method-assign]
    result = simulation.run()
    assert result.mode == "third-party" and result.num_completed == 400
    assert simulation.router.exact_index is None and not simulation._kv_queue
    assert set(pushed) == {0, 1, 6}  # step ends, arrivals, scrapes: no heartbeat, poll, KV
    for backend in simulation.backends:
        assert (backend.source, backend.load_source) == ("config", "metrics")
        assert backend.num_queued_prefill_tokens == 0 and backend.num_prefix_kv_blocks is None
        assert backend.profile_sources["block_size"] == "vllm:/metrics"
        assert backend.profile_sources["kv_capacity_tokens"] == "vllm:/metrics"
        assert backend.profile_sources["max_context_tokens"] == "/v1/models"
        assert backend.profile.prefill_tokens_per_s is None  # nothing states it
    # every finished request's usage reached the gateway's cache feedback
    assert sum(b.cache_feedback.num_responses for b in simulation.backends) == 400


def test_own_fleet_learns_by_heartbeat() -> None:
    simulation = Simulation(replace(THIRD_PARTY, mode="own", num_requests=50),
                            SharedPrefix(OPTIONS, 12, seed=1))
    simulation.run()
    assert {(b.source, b.load_source) for b in simulation.backends} == {("heartbeat",
                                                                          "heartbeat")}
    assert simulation.backends[0].profile.max_batch == 256
    assert simulation.backends[0].profile_sources["max_batch"] == "heartbeat"


@pytest.mark.parametrize("profile", [
    pytest.param("prefix_affinity", id="exact"),
    pytest.param("prefix_affinity_all", id="exact-all"),
])
def test_an_exact_profile_is_refused_in_third_party_mode(profile: str) -> None:
    with pytest.raises(ValueError, match="no exact index; use prefix_affinity"):
        Simulation(replace(THIRD_PARTY, profile=profile), SharedPrefix(OPTIONS, 12, seed=1))


@pytest.mark.parametrize("scrape_interval_s", [
    pytest.param(1.0, id="live-default-1s"),
    pytest.param(0.3, id="every-0.3s"),
])
def test_load_comes_from_scrapes_at_the_scrape_interval(scrape_interval_s: float) -> None:
    config = replace(THIRD_PARTY, scrape_interval_s=scrape_interval_s, profile="least_load")
    simulation = Simulation(config, SharedPrefix(OPTIONS, 12, seed=1))
    pages = simulation.pages
    assert pages is not None
    scraped: list[tuple[float, int, int]] = []
    scrape = pages.scrape

    def checked_scrape(index: int, now_s: float) -> None:
        scrape(index, now_s)
        core, backend = simulation.cores[index], simulation.backends[index]
        assert (backend.num_running, backend.num_waiting) == (core.num_running, core.num_waiting)
        assert backend.kv_usage == pytest.approx(core.kv_usage)
        scraped.append((now_s, index, backend.num_running))

    pages.scrape = checked_scrape  # type: ignore[method-assign]
    router, rank = simulation.router, simulation.router.rank
    ages: list[float] = []

    def checked_rank(plan: RoutePlan, now_s: float) -> tuple[int, int] | None:
        last_scrape_s = math.floor(now_s / scrape_interval_s + 1e-9) * scrape_interval_s
        for backend in router.backends:
            assert backend.load_observed_s == pytest.approx(last_scrape_s)
            ages.append(now_s - last_scrape_s)
        return rank(plan, now_s)

    router.rank = checked_rank  # type: ignore[method-assign]
    simulation.run()
    times = sorted({t for t, _, _ in scraped})
    assert times[0] == 0.0 and len(times) > 3
    assert all(b - a == pytest.approx(scrape_interval_s) for a, b in pairwise(times))
    assert max(ages) < scrape_interval_s and max(ages) > 0.8 * scrape_interval_s
    assert max(running for _, _, running in scraped) > 0  # it saw load, not just idle engines


def test_max_batch_is_unknown_until_saturation_is_seen() -> None:
    profile = WorkerProfile(model=MODEL, max_batch=2)
    cores = [SimEngineCore(profile)]
    backends = [Backend("w0", "vsim://w0", frozenset({MODEL}))]
    pages = EnginePages(backends, cores)
    pages.first_look_at(0.0)
    assert backends[0].profile.max_batch is None
    for i in range(4):
        cores[0].add_request(str(i), list(range(20)), max_tokens=50, now_s=0.0)
    cores[0].step(0.0)
    pages.scrape(0, 1.0)
    assert backends[0].profile.max_batch is None  # one saturated scrape is not enough
    pages.scrape(0, 2.0)
    assert backends[0].profile.max_batch == 2
    assert backends[0].load_observed_s == 2.0


def _fresh(name: str) -> Backend:
    backend = Backend(name, f"vsim://{name}", frozenset({MODEL}),
                      profile=BackendProfile(num_kv_blocks=10_000, block_size=16))
    backend.load_source, backend.load_observed_s = "metrics", 0.0
    return backend


@pytest.mark.parametrize(("is_fed_back", "keeps_claim"), [
    pytest.param(True, False, id="miss-reported-claims-dropped"),
    pytest.param(False, True, id="no-feedback-keeps-the-evicted-claim"),
])
def test_a_reported_miss_drops_the_evicted_backends_claims(is_fed_back: bool,
                                                           keeps_claim: bool) -> None:
    backends = [_fresh("w0"), _fresh("w1")]
    router = VirtualRouter(backends, "prefix_affinity", "approx", model=MODEL)
    prompt_a, prompt_b = tuple(range(1000, 1320)), tuple(range(5000, 5320))

    def send(prompt: tuple[int, ...], now_s: float, num_cached_tokens: int) -> tuple[int, int]:
        plan = router.describe(VRequest(0, prompt, 8, group=0))
        for index, backend in enumerate(backends):  # a scrape just now
            backend.load_observed_s = now_s
            router.mark_changed(index)
        ranked = router.rank(plan, now_s)
        assert ranked is not None
        index, expected_cached_tokens = ranked
        router.started(index, plan, now_s, expected_cached_tokens)
        router.first_token(index, plan)
        if is_fed_back:  # the response's usage, as the proxy hands it to Router.learn
            router.learn(index, plan, len(prompt), num_cached_tokens)
        router.finished(index, plan, had_first_token=True)
        return index, expected_cached_tokens

    holder, _ = send(prompt_a, 0.0, 0)
    other = 1 - holder
    backends[other].num_running = 50  # B goes to the same backend
    backends[other].invalidate()
    assert send(prompt_b, 0.0, 0)[0] == holder
    backends[other].num_running = 0
    backends[other].invalidate()
    # 30 s later A comes back to its holder, which has evicted it: it reports 0 cached
    assert send(prompt_a, 30.0, num_cached_tokens=0) == (holder, 320 // 16 * 16)
    assert router.approx_index is not None
    name = backends[holder].name
    assert router.approx_index.ttl_for(name) == (600.0 if keeps_claim else pytest.approx(30.0))
    # B's claim there is as old as the missed one: with the feedback, routing expects no hit
    b_chain = router.describe(VRequest(1, prompt_b, 8, group=0)).request.char_hashes
    assert (name in router.approx_index.match(b_chain, 31.0).num_blocks) is keeps_claim
    _, expected_cached_tokens = send(prompt_b, 31.0, num_cached_tokens=0)
    assert (expected_cached_tokens > 0) is keeps_claim
    assert backends[holder].cache_feedback.num_responses == (0 if keeps_claim else 4)


def test_cli_mode_both_runs_both_modes_and_compares(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "modes.json"
    code = main(["--workers", "2", "--requests", "200", "--groups", "6", "--rate", "30",
                 "--mode", "both", "--profiles", "round_robin,prefix_affinity,"
                 "prefix_affinity_approx", "--system-tokens", "200-400",
                 "--question-tokens", "5-20", "--max-tokens", "2-8", "--json", str(out)])
    assert code == 0
    captured = capsys.readouterr()
    assert "third-party mode skips prefix_affinity: a third-party fleet sends no KV events" \
        in captured.err
    assert "**own**" in captured.out and "**third-party**" in captured.out
    assert "| prefix_affinity_approx | prefix_affinity |" in captured.out
    document = json.loads(out.read_text())
    assert document["modes"] == ["own", "third-party"]
    ran = {(r["mode"], r["profile"]) for r in document["results"]}
    assert ran == {("own", "round_robin"), ("own", "prefix_affinity"),
                   ("own", "prefix_affinity_approx"), ("third-party", "round_robin"),
                   ("third-party", "prefix_affinity_approx")}
    pairs = {(r["third_party"], r["own"]): r for r in document["comparison"]}
    assert set(pairs) == {("round_robin", "round_robin"),
                          ("prefix_affinity_approx", "prefix_affinity_approx"),
                          ("prefix_affinity_approx", "prefix_affinity")}
    assert pairs[("round_robin", "round_robin")]["ttft_p99_ms"]["ratio"] == 1.0  # reads no load
    assert [p for p, r in pairs.items() if r["is_judged"]] == [
        ("prefix_affinity_approx", "prefix_affinity")]
    assert len(document["targets"]) == 3
    assert document["fleet"]["third_party"]["round_robin"]["load_sources"] == ["metrics"]
    assert document["fleet"]["own"]["round_robin"]["load_sources"] == ["heartbeat"]


def test_cli_refuses_an_exact_third_party_profile(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["--mode", "third-party", "--third-party-profiles", "prefix_affinity"])
    assert raised.value.code == 2
    assert "prefix_affinity: a third-party fleet sends no KV events" in capsys.readouterr().err
