"""What the gateway costs, in CPU and latency, over calling the engine directly.

In one run it starts a private redis-server, a zero-delay mock engine, two gateway processes
(the engine listed as 4 backends, and as 64) and a bare aiohttp pass-through proxy
(`bench.overhead.bare_proxy`, the floor for a Python proxy), creates a tenant with limits and a
key through the admin API, then drives the same load at the engine directly, through the bare
proxy and through the gateway (with auth; the 64-backend one under the non-streaming and paced
loads; under those two loads also as Anthropic Messages and OpenAI Responses requests, whose
CPU per request is set against chat's), ``--runs`` times, and reports medians::

    python -m bench.overhead            # the full benchmark (about 3 minutes)
    python -m bench.overhead --quick    # a smoke run (well under 20 s)

Load comes from `bench.common.loadgen` in a separate process, so its CPU is not counted; CPU is read
from /proc/PID/stat of the proxy and the engine around each measured phase, and /proc/stat tells
how much other work shared the machine ("others_cores_busy"). Results go to
``bench/results/overhead-<timestamp>.json``; targets are printed as PASS/FAIL, never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from bench.common.paths import RESULTS_DIR
from bench.common.report import judge, machine, markdown_table, text_table, write_results
from bench.common.stats import median
from bench.overhead.fleet import CHAT_PATH, BenchFleet, bench_fleet
from bench.overhead.profile import LOADS, STAGES, record, stage_shares

Figures = dict[str, float]


@dataclass(frozen=True, slots=True)
class Plan:
    """How much load each phase drives; ``QUICK`` is the smoke-test size."""

    runs: int = 3
    concurrency: int = 32
    num_requests: int = 5000
    max_tokens: int = 16
    num_streams: int = 500
    stream_max_tokens: int = 64
    token_delay_ms: float = 2.0
    rate_per_s: float = 200.0
    rate_duration_s: float = 10.0
    max_concurrency: int = 64
    max_duration_s: float = 5.0
    num_warmup: int = 300
    api_rounds: int = 3  # rounds of chat, Messages and Responses (``measure_apis``)


QUICK = Plan(runs=1, num_requests=400, num_streams=60, rate_duration_s=1.0, max_duration_s=0.5,
             num_warmup=40, api_rounds=1)


def _loadgen(fleet: BenchFleet, url: str, watch: dict[str, int], *args: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.common.loadgen", "--url", url, "--key", fleet.api_key,
            "--model", fleet.model, "--json", *args]
    for name, pid in watch.items():
        argv += ["--watch", f"{name}={pid}"]
    done = subprocess.run(argv, capture_output=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed ({done.returncode}): {done.stderr.decode()[-2000:]}"
                           f"{done.stdout.decode()[-500:]}")
    result: dict[str, Any] = orjson.loads(done.stdout)
    if result["num_errors"]:
        raise RuntimeError(f"{result['num_errors']} requests to {url} failed; first: "
                           f"{result['first_error']}")
    return result


@dataclass(frozen=True, slots=True)
class Phase:
    """One load shape, run against each endpoint in turn (engine alone, bare proxy, gateway)."""

    name: str
    args: tuple[str, ...]
    num_warmup: int


def phases(plan: Plan, mode: str = "third-party") -> list[Phase]:
    closed = ("--mode", "closed", "--duration", "120", "--concurrency", str(plan.concurrency))
    stream = (*closed, "--stream", "--requests", str(plan.num_streams),
              "--max-tokens", str(plan.stream_max_tokens))
    stream_warmup = max(1, plan.num_warmup // 10)
    warmup = ("--warmup", str(plan.num_warmup))
    found = [
        Phase("nonstream", (*closed, "--requests", str(plan.num_requests),
                            "--max-tokens", str(plan.max_tokens), *warmup), plan.num_warmup),
        # Zero-delay engine: its events arrive back to back and are relayed in a few writes.
        Phase("stream", (*stream, "--warmup", str(stream_warmup)), stream_warmup),
        # Tokens paced like a real engine's: every event is read and written on its own.
        Phase("paced_stream", (*stream, "--warmup", str(stream_warmup), "--token-delay-ms",
                               str(plan.token_delay_ms)), stream_warmup),
        Phase("latency", ("--mode", "open", "--rate", str(plan.rate_per_s), "--duration",
                          str(plan.rate_duration_s), "--max-tokens", str(plan.max_tokens),
                          "--concurrency", "4", *warmup), plan.num_warmup),
        Phase("max_rps", ("--mode", "closed", "--concurrency", str(plan.max_concurrency),
                          "--duration", str(plan.max_duration_s), "--max-tokens",
                          str(plan.max_tokens), *warmup), plan.num_warmup),
    ]
    # Own fleet: simulated workers, which the mock's per-request pacing does not reach.
    return [p for p in found if mode != "own" or p.name != "paced_stream"]


# Phases also run through the gateway with BACKEND_COUNTS[1] backends ("gateway64").
LARGE_FLEET_PHASES = ("nonstream", "paced_stream")
# Phases also run through the gateway as Anthropic Messages and OpenAI Responses requests
# ("gateway_messages", "gateway_responses"): the same prompt and output as the chat ones.
API_PHASES = ("nonstream", "paced_stream")
API_PATHS = {"messages": "/v1/messages", "responses": "/v1/responses"}
# Each round (``Plan.api_rounds``) measures chat, Messages and Responses back to back, so that
# each ratio is taken within seconds (this machine's speed drifts by tens of percent over a
# minute); the figure is the rounds' median.


def endpoints(fleet: BenchFleet, phase: str = "") -> dict[str, tuple[str, dict[str, int]]]:
    """URL and watched processes per endpoint; "proxy" is the process under test."""
    engine = {"engine": fleet.engine_pid}
    found = {
        "direct": (fleet.engine_url, engine),
        "floor": (fleet.floor_url, {"proxy": fleet.floor_pid, **engine}),
        "gateway": (fleet.gateway_url, {"proxy": fleet.gateway_pid, **engine,
                                        "redis": fleet.redis_pid}),
    }
    if phase in LARGE_FLEET_PHASES and fleet.large_url:
        found["gateway64"] = (fleet.large_url, {"proxy": fleet.large_pid, **engine,
                                                "redis": fleet.redis_pid})
    if phase == "nonstream" and fleet.interpreted_url:
        found["gateway_interpreted"] = (fleet.interpreted_url, {
            "proxy": fleet.interpreted_pid, **engine, "redis": fleet.redis_pid})
    return found


def _per(cpu_s: float, count: float) -> float:
    return cpu_s / count * 1e6 if count else 0.0


def result_figures(result: dict[str, Any]) -> Figures:
    """Per-request (and per-chunk) CPU of each watched process, throughput and latency."""
    num_ok, num_events, elapsed_s = result["num_ok"], result["num_events"], result["elapsed_s"]
    figures: Figures = {"requests_per_s": result["requests_per_s"], "p50_ms": result["p50_ms"],
                        "p99_ms": result["p99_ms"], "loadgen_lag_p99_ms": result["lag_p99_ms"]}
    for process, cpu_s in result["cpu_s"].items():
        figures[f"{process}_cpu_us_per_request"] = _per(cpu_s, num_ok)
        figures[f"{process}_cores_busy"] = cpu_s / elapsed_s
        if num_events:
            figures[f"{process}_cpu_us_per_chunk"] = _per(cpu_s, num_events)
    if num_events:
        figures["chunks_per_stream"] = num_events / num_ok
    # Cores that neither the load generator nor a watched process used: other work (noise).
    others_s = result["machine_busy_cpu_s"] - sum(result["cpu_s"].values())
    figures["others_cores_busy"] = max(0.0, others_s / elapsed_s)
    return figures


def measure_phase(fleet: BenchFleet, phase: Phase, api_rounds: int) -> Figures:
    figures: Figures = {}
    for target, (url, watch) in endpoints(fleet, phase.name).items():
        writes_before = fleet.streamed_chunks() if target == "gateway" else 0.0
        result = _loadgen(fleet, url + CHAT_PATH, watch, *phase.args)
        for key, value in result_figures(result).items():
            figures[f"{phase.name}.{target}.{key}"] = value
        if target == "gateway" and result["num_events"]:
            # Writes to the client: fewer than chunks when reads from the engine coalesce.
            writes = fleet.streamed_chunks() - writes_before
            figures[f"{phase.name}.gateway.writes_per_stream"] = writes / (
                result["num_ok"] + phase.num_warmup)
    if phase.name in API_PHASES:
        figures.update(measure_apis(fleet, phase, api_rounds))
    return figures


def measure_apis(fleet: BenchFleet, phase: Phase, rounds: int) -> Figures:
    """The gateway's CPU for Messages and Responses requests against chat's: per request
    and per relayed event, each ratio the median over ``rounds`` adjacent rounds."""
    url, watch = endpoints(fleet)["gateway"]
    ratios: dict[str, list[float]] = {}
    figures: Figures = {}
    for _ in range(rounds):
        chat = result_figures(_loadgen(fleet, url + CHAT_PATH, watch, *phase.args))
        for api, path in API_PATHS.items():
            found = result_figures(_loadgen(fleet, url + path, watch, *phase.args, "--api",
                                            api))
            for unit, ratio in (("request", "cpu_to_chat_ratio"),
                                ("chunk", "cpu_per_chunk_to_chat_ratio")):
                key = f"proxy_cpu_us_per_{unit}"
                if key in found and chat.get(key):
                    ratios.setdefault(f"{phase.name}.gateway_{api}.{ratio}", []).append(
                        found[key] / chat[key])
            for key, value in found.items():  # the last round's, for the table
                figures[f"{phase.name}.gateway_{api}.{key}"] = value
    figures.update({name: median(values) for name, values in ratios.items()})
    return figures


def derived(figures: Figures) -> Figures:
    """Added latency and throughput ratios of each proxy against the engine alone, and the
    gateway's CPU against the bare proxy's in the same run (the machine's speed varies from
    day to day by up to ~2x; the ratio does not)."""
    out: Figures = {}
    for phase, unit in (("nonstream", "request"), ("paced_stream", "chunk")):
        if f"{phase}.gateway.proxy_cpu_us_per_{unit}" not in figures:
            continue  # own fleet: no paced phase
        out[f"{phase}.gateway.cpu_to_floor_ratio"] = (
            figures[f"{phase}.gateway.proxy_cpu_us_per_{unit}"]
            / figures[f"{phase}.floor.proxy_cpu_us_per_{unit}"])
        if f"{phase}.gateway_interpreted.proxy_cpu_us_per_{unit}" in figures:
            out[f"{phase}.gateway.cpu_to_interpreted_ratio"] = (
                figures[f"{phase}.gateway.proxy_cpu_us_per_{unit}"]
                / figures[f"{phase}.gateway_interpreted.proxy_cpu_us_per_{unit}"])
            out[f"{phase}.gateway_interpreted.cpu_to_floor_ratio"] = (
                figures[f"{phase}.gateway_interpreted.proxy_cpu_us_per_{unit}"]
                / figures[f"{phase}.floor.proxy_cpu_us_per_{unit}"])
        if f"{phase}.gateway64.proxy_cpu_us_per_{unit}" in figures:
            out[f"{phase}.gateway64.cpu_to_gateway_ratio"] = (
                figures[f"{phase}.gateway64.proxy_cpu_us_per_{unit}"]
                / figures[f"{phase}.gateway.proxy_cpu_us_per_{unit}"])
    for target in ("floor", "gateway"):
        for q in ("p50", "p99"):
            out[f"latency.{target}.added_{q}_ms"] = (
                figures[f"latency.{target}.{q}_ms"] - figures[f"latency.direct.{q}_ms"])
        out[f"max_rps.{target}.to_direct_ratio"] = (
            figures[f"max_rps.{target}.requests_per_s"] / figures["max_rps.direct.requests_per_s"])
    return out


def measure_run(fleet: BenchFleet, plan: Plan) -> Figures:
    figures: Figures = {}
    for phase in phases(plan, fleet.mode):
        figures.update(measure_phase(fleet, phase, plan.api_rounds))
    figures.update(derived(figures))
    return figures


# Where the CPU goes, per stage (bench.overhead.profile.STAGES): each process and load below is
# profiled with py-spy after the measured runs, and each stage's share of the samples times
# the run's median CPU per request (a paced stream: per stream) is its µs per request. py-spy
# sees no frames inside compiled modules (routing.native): with the build, the gateway
# interpreted beside it is the one whose stages can be told apart.
STAGE_PROFILES = (("gateway", "nonstream"), ("gateway_interpreted", "nonstream"),
                  ("gateway64", "nonstream"), ("floor", "nonstream"),
                  ("gateway", "paced"), ("gateway64", "paced"), ("floor", "paced"))
_STAGE_PHASE = {"nonstream": "nonstream", "paced": "paced_stream"}


def measure_stages(fleet: BenchFleet, summary: Figures, duration_s: float) -> Figures:
    """``stages.<load>.<endpoint>.<stage>`` µs per request (see ``STAGE_PROFILES``), and
    ``...total``, the CPU per request they share, for ``summary`` (the medians) of the same
    fleet."""
    out: Figures = {}
    for target, load in STAGE_PROFILES:
        url, pid = fleet.proxy(target)
        if not url or f"{_STAGE_PHASE[load]}.{target}.proxy_cpu_us_per_request" not in summary:
            continue  # own fleet: no 64-backend gateway, no paced load
        raw = record(url, pid, fleet.api_key, fleet.model, LOADS[load], duration_s=duration_s)
        per_request = summary[f"{_STAGE_PHASE[load]}.{target}.proxy_cpu_us_per_request"]
        for stage, share in stage_shares(raw).items():
            out[f"stages.{load}.{target}.{stage}"] = share * per_request
        out[f"stages.{load}.{target}.total"] = per_request
    return out


def stages_table(figures: Figures) -> str:
    """The per-stage µs per request as a Markdown table: a column per profile."""
    columns = [(target, load) for target, load in STAGE_PROFILES
               if f"stages.{load}.{target}.total" in figures]
    names = {"gateway": "gateway, 4 backends", "gateway64": "gateway, 64 backends",
             "gateway_interpreted": "gateway, 4 backends, interpreted", "floor": "bare proxy"}
    loads = {"nonstream": "non-streaming", "paced": "paced stream"}
    head = ["stage (µs per request)"] + [f"{names[t]}, {loads[load]}" for t, load in columns]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(columns)]
    for stage in [*(name for name, _, _ in STAGES), "total"]:
        cells = [f"{figures[f'stages.{load}.{t}.{stage}']:,.0f}" for t, load in columns]
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def medians(runs: list[Figures]) -> Figures:
    return {key: median([run[key] for run in runs]) for key in runs[0]}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run, one repeat")
    parser.add_argument("--runs", type=int, help="repeats; medians are reported (default 3)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--mode", choices=("third-party", "own"), default="third-party",
                        help="engines listed in backends: (a mock), or simulated workers that "
                             "heartbeat through Redis")
    parser.add_argument("--no-stages", action="store_true",
                        help="skip the per-stage py-spy profiles after the runs")
    parser.add_argument("--stage-seconds", type=float, default=6.0,
                        help="seconds each per-stage profile samples")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.runs is not None:
        plan = dataclasses.replace(plan, runs=max(1, args.runs))
    started = time.time()
    loadavg_at_start = os.getloadavg()
    runs: list[Figures] = []
    with (tempfile.TemporaryDirectory(prefix="sy-bench-") as tmp,
          bench_fleet(Path(tmp), mode=args.mode) as fleet):
        for index in range(plan.runs):
            runs.append(measure_run(fleet, plan))
            print(f"run {index + 1}/{plan.runs} done ({time.time() - started:.0f} s)",
                  file=sys.stderr, flush=True)
        summary = medians(runs)
        stages_note = ""
        if not (args.no_stages or args.quick):
            try:
                summary.update(measure_stages(fleet, summary, args.stage_seconds))
            except (SystemExit, subprocess.SubprocessError, OSError) as exc:
                stages_note = f"NOTE  no per-stage profiles: {exc}"
    targets = judge(summary)
    print(text_table(summary, plan.runs))
    for target in targets:
        verdict = "PASS" if target["passed"] else "FAIL"
        print(f"{verdict}  {target['label']}: {target['value']:.3f} "
              f"(target <= {target['limit']:g})")
    noise = median([v for k, v in summary.items() if k.endswith("others_cores_busy")])
    if noise > 0.25:
        print(f"NOTE  other processes kept {noise:.2f} cores busy (median over phases): "
              "the machine was shared, so CPU and latency figures are inflated.")
    if args.markdown:
        print(markdown_table(summary))
    if any(key.startswith("stages.") for key in summary):
        print(stages_table(summary))
    elif stages_note:
        print(stages_note)
    path = write_results(args.results_dir, {
        "benchmark": "overhead", "issue": 2, "mode": args.mode,
        "command": " ".join(["python -m bench.overhead", *(argv or sys.argv[1:])]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started, "machine": machine(),
        "loadavg_at_start": loadavg_at_start, "loadavg_at_end": os.getloadavg(),
        "plan": dataclasses.asdict(plan), "median": summary, "runs": runs, "targets": targets,
    })
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
