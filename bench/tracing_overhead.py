"""Issue 6: what tracing costs the gateway, in CPU-µs per request: off, 100% and 1% sampled.

Three benchmark fleets (`bench.fleet`, as `bench.overhead` uses) run side by side, identical
but for the gateway's ``OTEL_*`` environment: tracing off; OTLP/HTTP export with every request
sampled; and 1% sampled (``parentbased_traceidratio``). The traced gateways export to an OTLP
sink in this process that discards what it gets; the spans each gateway exported, dropped or
failed to send are read from its ``/metrics`` (a lost span would flatter the figure). Each run
drives the same load (`bench.overhead`'s phases, through its load generator process) at the
three gateways at once, for 6 s a phase, so that other work on the machine weighs on the three
alike; medians over runs are reported::

    python -m bench.tracing_overhead             # 7 runs; about 3 minutes
    python -m bench.tracing_overhead --quick     # a smoke run (about 40 s)

Results go to ``bench/results/tracing-overhead-<timestamp>.json``; the target (at most 15%
added CPU per request at 100% sampling) is printed as PASS/FAIL, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.fleet import CHAT_PATH, BenchFleet, bench_fleet
from bench.overhead import QUICK, Plan, phases, result_figures
from bench.overhead import _loadgen as run_loadgen
from bench.report import machine
from bench.stats import median

RESULTS_DIR = Path(__file__).resolve().parent / "results"
TARGET_ADDED_FRAC = 0.15
VARIANTS: dict[str, dict[str, str]] = {
    "off": {"OTEL_TRACES_EXPORTER": "none"},
    "sampled_100": {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "parentbased_always_on"},
    "sampled_1": {"OTEL_TRACES_EXPORTER": "otlp",
                  "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                  "OTEL_TRACES_SAMPLER_ARG": "0.01"},
}
MEASURED_PHASES = ("nonstream", "stream")
FULL = dataclasses.replace(Plan(), runs=7)


class OtlpSink:
    """Accepts OTLP/HTTP trace exports and throws them away: a collector that costs this
    machine as little as possible (the gateways count what they exported)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def span_counts(fleet: BenchFleet) -> dict[str, float]:
    """The gateway's own count of spans exported and dropped (zero with tracing off)."""
    counts = {"exported": 0.0, "dropped": 0.0, "failed": 0.0}
    for line in httpx.get(fleet.gateway_url + "/metrics", timeout=10).text.splitlines():
        for outcome in counts:
            if line.startswith(f"switchyard_trace_spans_{outcome}_total "):
                counts[outcome] = float(line.split()[1])
    return counts


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """The fleet's processes inherit this process's environment when they are spawned."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def traced_fleets(workdir: Path, sink: OtlpSink) -> Iterator[dict[str, BenchFleet]]:
    with contextlib.ExitStack() as stack:
        fleets = {}
        for variant, env in VARIANTS.items():
            directory = workdir / variant
            directory.mkdir()
            with _environment({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                               "OTEL_SERVICE_NAME": f"gateway-{variant}"}):
                fleets[variant] = stack.enter_context(bench_fleet(directory))
        yield fleets


def _for_duration(args: tuple[str, ...], duration_s: float) -> tuple[str, ...]:
    """A phase's load-generator arguments, run for ``duration_s`` instead of a request count."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--requests", "--duration"):
            skip = True
        else:
            out.append(arg)
    return (*out, "--duration", str(duration_s))


def _measure(fleet: BenchFleet, args: tuple[str, ...], num_warmup: int) -> dict[str, float]:
    before = span_counts(fleet)
    result = run_loadgen(fleet, fleet.gateway_url + CHAT_PATH, {"proxy": fleet.gateway_pid},
                         *args)
    measured = result_figures(result)
    time.sleep(0.3)  # the last batch of spans goes out
    after = span_counts(fleet)
    return {"cpu_us_per_request": measured["proxy_cpu_us_per_request"],
            "p50_ms": measured["p50_ms"], "requests_per_s": measured["requests_per_s"],
            "spans_per_request": (after["exported"] - before["exported"]) / (
                result["num_ok"] + num_warmup),
            "spans_lost": sum(after[k] - before[k] for k in ("dropped", "failed"))}


def measure_run(fleets: dict[str, BenchFleet], plan: Plan, duration_s: float) -> dict[str, float]:
    """Each phase's load at the three gateways at once, so that the work of others on the
    machine, which comes and goes, weighs on the three alike."""
    figures: dict[str, float] = {}
    for phase in (p for p in phases(plan) if p.name in MEASURED_PHASES):
        args = _for_duration(phase.args, duration_s)
        with ThreadPoolExecutor(len(fleets)) as pool:
            futures = {variant: pool.submit(_measure, fleet, args, phase.num_warmup)
                       for variant, fleet in fleets.items()}
            for variant, future in futures.items():
                for key, value in future.result().items():
                    figures[f"{phase.name}.{variant}.{key}"] = value
        off = figures[f"{phase.name}.off.cpu_us_per_request"]
        for variant in ("sampled_100", "sampled_1"):
            figures[f"{phase.name}.{variant}.added_frac"] = (
                figures[f"{phase.name}.{variant}.cpu_us_per_request"] / off - 1.0)
    return figures


def report_table(summary: dict[str, float]) -> str:
    lines = ["| phase | tracing | gateway CPU-µs / request | added vs off | spans / request "
             "| p50 ms |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for phase in MEASURED_PHASES:
        for variant, label in (("off", "off"), ("sampled_100", "on, 100% sampled"),
                               ("sampled_1", "on, 1% sampled")):
            key = f"{phase}.{variant}"
            added = summary.get(f"{key}.added_frac")
            lines.append(
                f"| {phase} | {label} | {summary[f'{key}.cpu_us_per_request']:.0f} | "
                f"{'-' if added is None else f'{added:+.1%}'} | "
                f"{summary[f'{key}.spans_per_request']:.2f} | {summary[f'{key}.p50_ms']:.2f} |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small smoke run, one repeat")
    parser.add_argument("--runs", type=int, help="repeats; medians are reported (default 5)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plan = QUICK if args.quick else FULL
    duration_s = 1.5 if args.quick else 6.0
    if args.runs is not None:
        plan = dataclasses.replace(plan, runs=max(1, args.runs))
    started = time.time()
    sink = OtlpSink()
    runs: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="sy-trace-bench-") as tmp, \
                traced_fleets(Path(tmp), sink) as fleets:
            for index in range(plan.runs):
                runs.append(measure_run(fleets, plan, duration_s))
                print(f"run {index + 1}/{plan.runs} done ({time.time() - started:.0f} s)",
                      file=sys.stderr, flush=True)
    finally:
        sink.close()
    summary = {key: median([run[key] for run in runs]) for key in runs[0]}
    print(report_table(summary))
    added = summary["nonstream.sampled_100.added_frac"]
    verdict = "PASS" if added <= TARGET_ADDED_FRAC else "FAIL"
    print(f"{verdict}  CPU added per non-streaming request at 100% sampling: {added:+.1%} "
          f"(target <= {TARGET_ADDED_FRAC:.0%})")
    lost = sum(run[k] for run in runs for k in run if k.endswith("spans_lost"))
    if lost:
        print(f"NOTE  {lost:.0f} spans were dropped or failed to export: CPU is understated.")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / f"tracing-overhead-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_bytes(orjson.dumps({
        "benchmark": "tracing_overhead", "issue": 6,
        "command": " ".join(["python -m bench.tracing_overhead", *(argv or sys.argv[1:])]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started, "machine": machine(),
        "plan": dataclasses.asdict(plan), "median": summary, "runs": runs,
        "target": {"added_frac_at_100": TARGET_ADDED_FRAC, "value": added,
                   "passed": added <= TARGET_ADDED_FRAC},
    }, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
