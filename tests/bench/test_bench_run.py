"""bench.run: workloads, arrivals and options as pure functions; then real runs against a local
fleet (redis, two simulated workers, a gateway) that must leave sane results behind."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.tokenizer import get_tokenizer
from bench.run import arrivals
from bench.run.cli import main
from bench.run.client import retry_after_s
from bench.run.fleet import LocalFleet, local_fleet
from bench.run.options import OptionError, Slo, check_loopback, parse_slos, parse_tenants
from bench.run.runner import redacted
from bench.run.spec import Record, RequestSpec
from bench.run.summary import Phase, summarize
from bench.run.text import WORDS, text
from bench.run.workers import load_spread, parse_counters
from bench.run.workloads import WORKLOADS, TokenRange, WorkloadOptions, zipf_weights
from bench.run.workloads.trace import SAMPLE_TRACE, read_trace
from gateway.cli.commands import main as switchyard_main

TENANTS = parse_tenants("interactive:2,standard:3,batch:1")
SMALL = WorkloadOptions(system_tokens=TokenRange(40, 60), question_tokens=TokenRange(5, 10),
                        max_tokens=TokenRange(4, 8), doc_tokens=TokenRange(100, 120),
                        turns=TokenRange(3, 5), num_conversations=4)


def take(name: str, seed: int, count: int = 60,
         options: WorkloadOptions = SMALL) -> list[RequestSpec]:
    return list(itertools.islice(WORKLOADS[name](options, TENANTS, seed), count))


# --- workloads -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_deterministic_per_seed(name: str) -> None:
    assert take(name, seed=3) == take(name, seed=3)
    if name != "trace":  # a trace's sizes and times are the trace's; only tenants vary
        assert take(name, seed=3) != take(name, seed=4)


@pytest.mark.parametrize("kind", ["approx", "real"])
def test_every_word_is_one_token(kind: str) -> None:
    tokenizer = get_tokenizer(kind)  # type: ignore[arg-type]
    assert all(len(tokenizer.encode(" " + word)) == 1 for word in WORDS)
    assert len(tokenizer.encode(text(500, random.Random(1)))) == 500


def test_shared_prefix_groups_follow_zipf_and_share_their_system_prompt() -> None:
    options = WorkloadOptions(num_groups=8, zipf_s=1.1, system_tokens=TokenRange(30, 50),
                              question_tokens=TokenRange(5, 10))
    specs = take("shared-prefix", seed=1, count=4000, options=options)
    counts = [sum(s.group == g for s in specs) for g in range(8)]
    for count, weight in zip(counts, zipf_weights(8, 1.1), strict=True):
        assert count / len(specs) == pytest.approx(weight, abs=0.025)
    assert counts[0] > counts[2] > counts[7]
    for group in range(8):
        members = [s for s in specs if s.group == group]
        assert len({s.messages[0]["content"] for s in members}) == 1
        assert len({s.tenant for s in members}) == 1
        assert 30 <= len(members[0].messages[0]["content"].split()) <= 50
    questions = [s.messages[1]["content"] for s in specs]
    assert len(set(questions)) == len(questions)


def test_multi_turn_prompts_grow_turn_by_turn() -> None:
    specs = take("multi-turn", seed=2, count=200)
    conversations: dict[int, list[RequestSpec]] = {}
    for spec in specs:
        assert spec.conversation is not None
        conversations.setdefault(spec.conversation, []).append(spec)
    assert len(conversations) > 10
    for turns in conversations.values():
        assert [t.turn for t in turns] == list(range(len(turns)))
        for earlier, later in itertools.pairwise(turns):
            assert len(later.messages) == len(earlier.messages) + 2
            assert later.messages[:len(earlier.messages)] == earlier.messages
            assert later.messages[-2]["role"] == "assistant"
            assert len(later.messages[-2]["content"].split()) == earlier.max_tokens


def test_long_doc_questions_share_their_document() -> None:
    specs = take("long-doc", seed=5, count=100)
    for doc in {s.group for s in specs}:
        bodies = [s.messages[1]["content"] for s in specs if s.group == doc]
        prefix = bodies[0].split("\n\nQuestion:")[0]
        assert 100 <= len(prefix.split()) <= 120
        assert all(b.startswith(prefix + "\n\nQuestion:") for b in bodies)
        assert len(set(bodies)) == len(bodies)


def test_trace_replay_keeps_inter_arrival_times(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.5000000,300,20\n"
                     "2023-11-16 18:15:46.7500000,400,30\n"
                     "2023-11-16 18:15:50.5000000,100,5\n")
    options = WorkloadOptions(trace_path=trace, time_scale=2.0)
    specs = list(WORKLOADS["trace"](options, TENANTS, 1))
    assert [s.at_s for s in specs] == pytest.approx([0.0, 0.125, 2.0])
    assert [s.max_tokens for s in specs] == [20, 30, 5]
    assert [len(s.messages[0]["content"].split()) for s in specs] == [268, 368, 68]


def test_the_sample_trace_has_realistic_shape() -> None:
    rows = read_trace(SAMPLE_TRACE)
    assert len(rows) == 500
    assert 60 < rows[-1].timestamp_s - rows[0].timestamp_s < 300
    assert 600 < statistics.median(r.num_context_tokens for r in rows) < 1600
    assert 60 < statistics.median(r.num_generated_tokens for r in rows) < 300


# --- arrivals --------------------------------------------------------------------------------

@pytest.mark.parametrize(("process", "cv"), [
    pytest.param("poisson", 1.0, id="poisson"),
    pytest.param("gamma", 3.0, id="gamma-bursty"),
    pytest.param("gamma", 0.5, id="gamma-regular"),
    pytest.param("uniform", 0.0, id="uniform"),
])
def test_arrivals_have_the_mean_rate_and_cv(process: arrivals.Process, cv: float) -> None:
    times = [a.at_s for a in arrivals.sweep([200.0], 100.0, process, cv, random.Random(9))]
    assert len(times) / 100.0 == pytest.approx(200.0, rel=0.05)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.pstdev(gaps) / statistics.mean(gaps) == pytest.approx(cv, abs=0.1)


def test_a_sweep_runs_one_phase_per_rate() -> None:
    timeline = list(arrivals.sweep([10.0, 40.0], 50.0, "poisson", 1.0, random.Random(2)))
    for phase, rate in enumerate([10.0, 40.0]):
        times = [a.at_s for a in timeline if a.phase == phase]
        assert all(50.0 * phase <= t < 50.0 * (phase + 1) for t in times)
        assert len(times) / 50.0 == pytest.approx(rate, rel=0.15)


# --- options, summary, worker metrics --------------------------------------------------------

@pytest.mark.parametrize(("url", "is_allowed"), [
    pytest.param("http://127.0.0.1:8080/v1", True, id="ipv4-loopback"),
    pytest.param("http://127.3.4.5:80/v1", True, id="127/8"),
    pytest.param("http://[::1]:8080/v1", True, id="ipv6-loopback"),
    pytest.param("http://localhost:8080/v1", True, id="localhost"),
    pytest.param("http://10.0.0.7:8080/v1", False, id="private"),
    pytest.param("https://api.openai.com/v1", False, id="public-name"),
    pytest.param("http://localhost.example.com/v1", False, id="lookalike"),
    pytest.param("ftp://127.0.0.1/", False, id="not-http"),
])
def test_only_loopback_targets_are_accepted(url: str, is_allowed: bool) -> None:
    if is_allowed:
        assert check_loopback(url) == url
    else:
        with pytest.raises(OptionError):
            check_loopback(url)


def test_a_non_loopback_url_is_refused_by_the_command(capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert switchyard_main(["bench", "run", "--url", "http://192.168.1.5:8080/v1"]) == 2
    assert "only targets loopback" in capsys.readouterr().err


def test_tenant_and_slo_specs() -> None:
    assert [(t.name, t.tier) for t in parse_tenants("interactive:1,batch:2")] == [
        ("bench-interactive-0", "interactive"), ("bench-batch-0", "batch"),
        ("bench-batch-1", "batch")]
    assert parse_slos(["interactive=0.3:0.05"])["interactive"] == Slo(0.3, 0.05)
    assert [t.tier for t in parse_tenants("batch")] == ["batch"]
    for bad in ("standard:x", ":3", "batch:0", ""):
        with pytest.raises(OptionError):
            parse_tenants(bad)
    with pytest.raises(OptionError):
        parse_slos(["batch=-1"])


def test_summary_counts_goodput_errors_and_cache() -> None:
    def record(tier: str, status: int, ttft_s: float | None, cached: int) -> Record:
        return Record(index=0, tenant="t", tier=tier, phase=0, is_stream=True, sent_at_s=0.0,
                      status=status, ttft_s=ttft_s, e2e_s=1.0, num_prompt_tokens=100,
                      num_completion_tokens=10, num_cached_tokens=cached)

    records = [record("interactive", 200, 0.1, 50), record("interactive", 200, 0.9, 0),
               record("batch", 200, 5.0, 100), record("batch", 429, None, 0)]
    summary = summarize(records, parse_slos([]), [Phase(0, 2.0, 0.0, 2.0)])
    overall = summary["overall"]
    assert overall["num_ok"] == 3 and overall["errors_by_status"] == {"429": 1}
    assert overall["goodput_rps"] == pytest.approx(2 / 1.0)  # window: last response at 1 s
    assert overall["cached_fraction"] == pytest.approx(150 / 300)
    assert summary["tiers"]["interactive"]["slo_attainment"] == 0.5
    assert summary["phases"][0]["throughput_rps"] == pytest.approx(1.5)


def test_load_spread_from_worker_counters() -> None:
    page = ('vllm:request_success_total{model_name="m",finished_reason="stop"} 3\n'
            'vllm:request_success_total{model_name="m",finished_reason="length"} 7\n'
            'vllm:prompt_tokens_total{model_name="m"} 500\n')
    assert parse_counters(page) == {"requests": 10.0, "prompt_tokens": 500.0}
    zero = {"requests": 0.0, "prompt_tokens": 0.0}
    spread = load_spread({"a": zero, "b": zero}, {"a": {"requests": 30.0, "prompt_tokens": 1.0},
                                                  "b": {"requests": 10.0, "prompt_tokens": 1.0}})
    assert spread["max_mean_requests"] == pytest.approx(1.5)


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("2", 2.0, id="delta-seconds"),
    pytest.param("0.25", 0.25, id="fraction"),
    pytest.param(None, None, id="absent"),
    pytest.param("Wed, 21 Oct 2026 07:28:00 GMT", None, id="http-date-not-read"),
    pytest.param("-1", None, id="negative"),
    pytest.param("inf", None, id="infinite"),
])
def test_retry_after_s(value: str | None, expected: float | None) -> None:
    assert retry_after_s(value) == expected


# --- end to end: a real gateway in front of two simulated workers ----------------------------

@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalFleet]:
    with local_fleet("sim", 2, tmp_path_factory.mktemp("bench-run-fleet")) as running:
        yield running


def run(fleet: LocalFleet, out: Path, *extra: str) -> dict[str, Any]:
    argv = ["run", "--url", fleet.url, "--admin-token", fleet.admin_token,
            "--tenants", "interactive:1,standard:2,batch:1", "--question-tokens", "10-20",
            "--max-tokens", "4-8", "--duration", "3", "--no-progress", "--out", str(out)]
    for url in fleet.worker_metrics:
        argv += ["--worker-metrics", url]
    assert main([*argv, *extra]) == 0
    document: dict[str, Any] = json.loads((out / "results.json").read_text())
    return document


def test_a_shared_prefix_run_writes_sane_results(fleet: LocalFleet, tmp_path: Path) -> None:
    document = run(fleet, tmp_path, "--workload", "shared-prefix", "--rate", "6,12",
                   "--system-tokens", "200-300")
    records = document["records"]
    assert len(records) >= 5
    assert all(r["status"] == 200 and r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"]
               for r in records)
    summary = document["summary"]
    assert summary["overall"]["cached_fraction"] > 0
    assert set(summary["tiers"]) == {"interactive", "standard", "batch"}
    assert sum(d["requests"] for d in summary["workers"]["per_worker"].values()) == len(records)
    assert [p["offered_rps"] for p in summary["phases"]] == [6.0, 12.0]
    for name in ("summary.md", "ttft_cdf.png", "e2e_cdf.png", "throughput.png",
                 "waits.json", "waits.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "| **all** |" in (tmp_path / "summary.md").read_text()
    # The gateway's waits report over the run, as `switchyard waits` gives it.
    waits = json.loads((tmp_path / "waits.json").read_text())
    assert waits["num_requests"] >= len(records)
    assert {"interactive", "standard", "batch"} <= set(summary["waits"])
    top = summary["waits"]["standard"]["most_expensive"]["wait"]
    assert top in waits["tiers"]["standard"]["waits"]


def test_no_secret_reaches_a_results_file(fleet: LocalFleet, tmp_path: Path) -> None:
    """The admin token and the keys made for the run stay out of every file it writes; the
    keys go only where --save-keys says (mode 0600)."""
    out, keys_path = tmp_path / "out", tmp_path / "keys.json"
    document = run(fleet, out, "--tenants", "standard:2", "--save-keys", str(keys_path),
                   "--no-plots")
    keys = [entry["key"] for entry in json.loads(keys_path.read_text())]
    assert len(keys) == 2 and keys_path.stat().st_mode & 0o777 == 0o600
    assert "--admin-token REDACTED" in document["config"]["command"]
    secrets = [fleet.admin_token.encode(), *(key.encode() for key in keys)]
    artefacts = [path for path in out.rglob("*") if path.is_file()]
    assert {p.name for p in artefacts} >= {"results.json", "summary.md"}
    leaks = {str(p.relative_to(out)) for p in artefacts for secret in secrets
             if secret in p.read_bytes()}
    assert leaks == set()


def test_a_run_with_its_own_fleet_keeps_no_secret_in_its_results(tmp_path: Path) -> None:
    """``--fleet``: the fleet's gateway configuration (its admin token and key secret) stays
    outside the results; its logs are kept there."""
    out = tmp_path / "out"
    assert main(["run", "--fleet", "sim:1", "--tenants", "standard:1", "--duration", "2",
                 "--rate", "4", "--max-tokens", "2-4", "--no-progress", "--no-plots",
                 "--out", str(out)]) == 0
    assert (out / "fleet-logs").is_dir() and list((out / "fleet-logs").glob("gateway*.log"))
    artefacts = [path for path in out.rglob("*") if path.is_file()]
    assert not [p for p in artefacts if p.suffix in (".yaml", ".yml")]
    for path in artefacts:
        text = path.read_text(errors="replace")
        assert "admin_token" not in text and "key_secret" not in text, path


@pytest.mark.parametrize(("argv", "expected"), [
    (["--admin-token", "s3cret", "--rate", "5"], ["--admin-token", "REDACTED", "--rate", "5"]),
    (["--api-key=sk-1", "--out", "x"], ["--api-key=REDACTED", "--out", "x"]),
    (["--admin", "s3cret"], ["--admin", "REDACTED"]),  # argparse's unique prefix
    (["--max-tokens", "4-8"], ["--max-tokens", "4-8"]),
])
def test_secret_options_are_redacted(argv: list[str], expected: list[str]) -> None:
    assert redacted(argv) == expected


def test_a_closed_loop_multi_turn_run_sends_turns_in_order(fleet: LocalFleet,
                                                           tmp_path: Path) -> None:
    document = run(fleet, tmp_path, "--workload", "multi-turn", "--mode", "closed",
                   "--concurrency", "4", "--no-plots")
    records = [r for r in document["records"] if r["status"] == 200]
    assert len(records) >= 10
    by_conversation: dict[int, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda r: r["sent_at_s"]):
        by_conversation.setdefault(record["conversation"], []).append(record)
    for turns in by_conversation.values():
        assert [t["turn"] for t in turns] == list(range(len(turns)))
        prompts = [t["num_prompt_tokens"] for t in turns]
        assert prompts == sorted(prompts)

