"""Does the virtual-time simulator agree with the live bench? Same requests, both sides.

For each profile (round_robin, prefix_affinity with the exact index, prefix_affinity with the
approximate one) a fresh live fleet runs the shared-prefix workload as ``bench.routing.live``
runs it (``run_one``: redis, ``--workers`` sim workers joining through Redis, a gateway, open
loop, the first ``--warmup`` seconds not counted). Then ``bench.vsim`` replays that run's own
requests (the same prompts, output lengths and send times: ``bench.vsim.replay``) through the
same profile on a fleet of the same shape (KV blocks, speed factor, latency model), in virtual
time. The table compares TTFT p50 and the cached-token fraction: vsim / live, PASS within 10 %.

**The live path's fixed latency.** Before the profiles, a probe run (round_robin at
``--probe-load`` of the main rate, so almost nothing queues) is replayed with no added latency:
the median per-request difference live - vsim TTFT is what the live path adds to every request
(gateway, HTTP hops, the worker tokenizing the prompt, timer wake-ups). The main replays add it
as ``SimConfig.dispatch_s``; the figures without it are kept too (``vsim_no_path``).

**Rate.** 0.75 x round_robin's capacity as ``bench.routing.live`` calibrates it (closed loop),
unless ``--rate`` is given. On this 2-core machine, 8 workers at speed 1 fall behind their
modelled step deadlines; ``--speed-factor`` (default 0.5) slows the simulated GPU (both sides),
which lowers the rate and the CPU per second of traffic. Each live run reports its lateness.

    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.vsim.agreement   # ~8 minutes
    .venv/bin/python -m bench.vsim.agreement --quick   # smoke: 2 workers, 3 s runs
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.sim.profile import WorkerProfile
from bench.common.stats import percentile
from bench.routing.drive import Load
from bench.routing.live import PROFILES as LIVE_PROFILES
from bench.routing.live import Settings, calibrate, main_kv_blocks, run_one
from bench.routing.workloads import working_set_blocks
from bench.run.workloads import WorkloadOptions
from bench.vsim.replay import LiveReplay, replay_requests
from bench.vsim.sim import MODEL, SimConfig, Simulation

# live profile (bench.routing.live) -> vsim profile (bench.vsim)
PROFILES = {"round_robin": "round_robin", "prefix_affinity:exact": "prefix_affinity",
            "prefix_affinity:approx": "prefix_affinity_approx"}
TOLERANCE = 0.10


def live_run(profile: str, load: Load, settings: Settings, kv_blocks: int | None, name: str
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One ``bench.routing.live`` run in its own directory: its figures and request records."""
    workdir = settings.workdir / name
    figures = run_one(replace(LIVE_PROFILES[profile], num_kv_blocks=kv_blocks), "shared-prefix",
                      load, replace(settings, workdir=workdir))
    records = json.loads(next(workdir.glob("*/records.json")).read_text())
    return figures, records


def replay(profile: str, records: list[dict[str, Any]], settings: Settings,
           kv_blocks: int | None, dispatch_s: float, warmup_s: float
           ) -> tuple[dict[str, Any], list[float]]:
    """The live run's requests through ``bench.vsim``: figures, and TTFT per record (s)."""
    options = WorkloadOptions(num_groups=settings.num_groups,
                              num_conversations=settings.num_conversations)
    requests, arrivals_s = replay_requests(records, options, settings.seed)
    worker = WorkerProfile(model=MODEL, speed_factor=settings.speed_factor or 1.0)
    if kv_blocks is not None:
        worker = replace(worker, num_kv_blocks=kv_blocks)
    config = SimConfig(num_workers=settings.num_workers, num_requests=len(requests),
                       profile=PROFILES[profile], seed=settings.seed, worker=worker,
                       num_warmup=sum(t < warmup_s for t in arrivals_s), dispatch_s=dispatch_s)
    simulation = Simulation(config, LiveReplay(requests), arrivals_s)
    result = simulation.run()
    rec = simulation.recorder
    ttft = [rec.first_token_s[i] - rec.arrival_s[i] for i in range(len(requests))]
    counted = range(config.num_warmup or 0, len(requests))
    judged = [i for i in counted if not math.isnan(ttft[i]) and rec.num_ideal_tokens[i]]
    missed = [i for i in judged if rec.num_cached_tokens[i] < 0.5 * rec.num_ideal_tokens[i]]
    figures = {"num_requests": len(requests), "num_counted": len(counted),
               "num_completed": result.num_completed,
               "ttft_ms": {"p50": 1000 * result.ttft_p50_s, "p90": 1000 * result.ttft_p90_s,
                           "p99": 1000 * result.ttft_p99_s},
               "cached_fraction": result.cached_fraction,
               "ideal_cached_fraction": result.ideal_cached_fraction,
               "miss_share": len(missed) / len(judged) if judged else None,
               "dispatch_ms": 1000 * dispatch_s, "wall_s": result.wall_s}
    return figures, ttft


def live_summary(figures: dict[str, Any], records: list[dict[str, Any]], warmup_s: float
                 ) -> dict[str, Any]:
    num_steps = sum(figures["num_steps_per_worker"].values())
    return {"num_requests": len(records),
            "num_counted": sum(r["sent_at_s"] >= warmup_s for r in records),
            "num_completed": figures["num_ok"], "num_errors": figures["num_errors"],
            "ttft_ms": {k: figures["ttft_ms"][k] for k in ("p50", "p90", "p99")},
            "cached_fraction": figures["cached_fraction"],
            "ideal_cached_fraction": figures["ideal_cached_fraction"],
            "miss_share": figures["misses"]["miss_share"],
            "late_per_step_ms": 1000 * figures["engine_lateness_s"] / num_steps if num_steps
            else None,
            "fleet_cores": figures["fleet_cores"], "others_cores": figures["others_cores"]}


def path_latency_s(records: list[dict[str, Any]], vsim_ttft_s: list[float]) -> dict[str, Any]:
    """Per request live - vsim TTFT (the replay is in send order): median, p10, p90 (ms)."""
    ordered = sorted(records, key=lambda r: (r["sent_at_s"], r["index"]))
    diffs = [r["ttft_s"] - v for r, v in zip(ordered, vsim_ttft_s, strict=True)
             if r["ttft_s"] is not None and not math.isnan(v)]
    return {"median_ms": 1000 * statistics.median(diffs) if diffs else math.nan,
            "p10_ms": 1000 * percentile(diffs, 0.1), "p90_ms": 1000 * percentile(diffs, 0.9),
            "num_requests": len(diffs)}


def compare(live: dict[str, Any], vsim: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: float | None, b: float | None) -> float | None:
        return b / a if a and b is not None else None

    ttft = ratio(live["ttft_ms"]["p50"], vsim["ttft_ms"]["p50"])
    cached = ratio(live["cached_fraction"], vsim["cached_fraction"])
    return {"ttft_p50_ratio": ttft, "cached_ratio": cached,
            "ttft_p50_within": ttft is not None and abs(ttft - 1) <= TOLERANCE,
            "cached_within": cached is not None and abs(cached - 1) <= TOLERANCE}


def table(results: dict[str, Any]) -> str:
    lines = ["| profile | TTFT p50 live / vsim (ms) | ratio | within 10 % | cached live / vsim "
             "| ratio | within 10 % | vsim TTFT p50 without path latency | misses live / vsim "
             "| live late/step |",
             "| --- | --- | ---: | --- | --- | ---: | --- | ---: | --- | ---: |"]
    for profile, run in results.items():
        live, vsim, bare, verdict = run["live"], run["vsim"], run["vsim_no_path"], run["compare"]
        lines.append(
            f"| {profile} | {live['ttft_ms']['p50']:.1f} / {vsim['ttft_ms']['p50']:.1f} "
            f"| {verdict['ttft_p50_ratio'] or math.nan:.2f} "
            f"| {'PASS' if verdict['ttft_p50_within'] else 'FAIL'} "
            f"| {live['cached_fraction'] or math.nan:.3f} / {vsim['cached_fraction']:.3f} "
            f"| {verdict['cached_ratio'] or math.nan:.3f} "
            f"| {'PASS' if verdict['cached_within'] else 'FAIL'} "
            f"| {bare['ttft_ms']['p50']:.1f} "
            f"| {live['miss_share'] or 0:.1%} / {vsim['miss_share'] or 0:.1%} "
            f"| {live['late_per_step_ms'] or math.nan:.2f} ms |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.vsim.agreement", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--workers", type=int, default=8)
    add("--profiles", default=",".join(PROFILES),
        help=f"comma-separated, from {', '.join(PROFILES)}")
    add("--duration", type=float, default=50.0, help="seconds of sending per run")
    add("--warmup", type=float, default=10.0, help="seconds at the start not counted")
    add("--rate", type=float, help="req/s (default: 0.75 x round_robin's calibrated capacity)")
    add("--speed-factor", type=float, default=0.5, help="the sim's GPU speed, both sides")
    add("--kv-fraction", type=float, default=0.5, help="worker KV / the working set")
    add("--probe-load", type=float, default=0.1, help="the probe's rate / the main rate")
    add("--probe-s", type=float, default=20.0, help="seconds of sending of the probe")
    add("--seed", type=int, default=1)
    add("--quick", action="store_true", help="smoke run: 2 workers, 6 groups, 3 s runs")
    add("--out", type=Path, help="JSON path (default bench/results/vsim-agreement-TIME.json)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    profiles = [p for p in args.profiles.split(",") if p]
    if not profiles or any(p not in PROFILES for p in profiles):
        print(f"profiles: choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or Path("bench/results") / f"vsim-agreement-{stamp}.json"
    settings = Settings(num_workers=args.workers, send_s=args.duration, warmup_s=args.warmup,
                        seed=args.seed, speed_factor=args.speed_factor,
                        kv_fraction=args.kv_fraction, workdir=out.with_name(out.stem + "-fleet"))
    rate, probe_s = args.rate, args.probe_s
    if args.quick:
        settings = replace(settings, num_workers=2, num_groups=6, send_s=3.0, warmup_s=0.0,
                           drain_s=5.0)
        rate, probe_s = rate or 4.0, 3.0
    started = time.monotonic()
    working_set = working_set_blocks(WorkloadOptions(num_groups=settings.num_groups),
                                     settings.num_groups, settings.seed)
    kv_blocks = main_kv_blocks(settings, working_set)
    calibration = None
    if rate is None:
        print("calibrating round_robin's capacity ...", file=sys.stderr)
        calibration = calibrate(replace(settings, workdir=settings.workdir / "calibration"),
                                kv_blocks)
        rate = float(calibration["rate_75_rps"])
    probe_rate = max(1.0, args.probe_load * rate)
    print(f"probe: round_robin at {probe_rate:.1f} req/s for {probe_s:g} s", file=sys.stderr)
    probe_load = Load(rate_per_s=probe_rate, send_s=probe_s, drain_s=settings.drain_s,
                      seed=settings.seed)
    probe_live, probe_records = live_run("round_robin", probe_load,
                                         replace(settings, warmup_s=0.0), kv_blocks, "probe")
    _, probe_ttft = replay("round_robin", probe_records, settings, kv_blocks, 0.0, 0.0)
    path = path_latency_s(probe_records, probe_ttft)
    dispatch_s = max(0.0, path["median_ms"] / 1000) if not math.isnan(path["median_ms"]) else 0.0
    print(f"live path latency: median {path['median_ms']:.2f} ms per request", file=sys.stderr)
    load = Load(rate_per_s=rate, send_s=settings.send_s, drain_s=settings.drain_s,
                seed=settings.seed)
    results: dict[str, Any] = {}
    for profile in profiles:
        figures, records = live_run(profile, load, settings, kv_blocks, profile.replace(":", "-"))
        live = live_summary(figures, records, settings.warmup_s)
        vsim, _ = replay(profile, records, settings, kv_blocks, dispatch_s, settings.warmup_s)
        bare, _ = replay(profile, records, settings, kv_blocks, 0.0, settings.warmup_s)
        results[profile] = {"live": live, "vsim": vsim, "vsim_no_path": bare,
                            "compare": compare(live, vsim)}
    document = {
        "config": {"command": " ".join(["python -m bench.vsim.agreement",
                                        *(argv if argv is not None else sys.argv[1:])]),
                   "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "num_workers": settings.num_workers, "num_groups": settings.num_groups,
                   "send_s": settings.send_s, "warmup_s": settings.warmup_s,
                   "speed_factor": settings.speed_factor, "seed": settings.seed,
                   "kv_fraction": settings.kv_fraction, "num_kv_blocks": kv_blocks,
                   "working_set_blocks": working_set, "rate_per_s": rate,
                   "elapsed_s": time.monotonic() - started},
        "calibration": None if calibration is None else {
            k: calibration[k] for k in ("capacity_rps", "rate_75_rps", "engine_lateness_s")},
        "probe": {"rate_per_s": probe_rate, "send_s": probe_s, "path_latency": path,
                  "live": live_summary(probe_live, probe_records, 0.0)},
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, default=str))
    print(table(results))
    print(f"results in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
