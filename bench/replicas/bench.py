"""Replicas measured as one: 1, 2 and 4 gateway replicas behind a round-robin front, the same
workload and fleet, in own-fleet and third-party mode.

For each mode and each replica count N (``--replicas``, default 1,2,4), a fresh fleet
(`bench.replicas.fleet`: a private Redis, 4 simulated workers whose KV holds half the system
prompts' working set, N ``prefix_affinity`` gateways sharing the Redis, a round-robin TCP front)
is driven with the routing bench's shared-prefix workload (24 groups, 1.5-3k-token system
prompts, Zipf popularity, streaming), open loop at ``--rate`` for ``--duration`` seconds, the
same seed each time, through the front with a connection per request (`bench.replicas.drive`).
Every run starts cold: new workers (empty caches), a new Redis (no index or stream left from
the run before). Its cached-token share and TTFT p90 / p99 are set over the one-replica run's
(target: within 5 %). One replica again at the end (``1 again``) shows the run-to-run noise.
Third-party mode also runs N = max with each replica keeping its state in memory
(``control``: nothing shared), the gap sharing closes.

The simulated engines run on a core apart from the gateways and Redis (``bench.common.pinning``;
``--no-pin``), as engines on GPU hosts would, with the front and the load generator beside them
while the workload runs (their work is the same at every N; ``--driver-with-gateways`` puts
them on the gateways' core), and after the largest N one replica runs again with a ballast
burning the extra cores that N's gateway side used (``bench.common.ballast``; the same-CPU
control, ``--no-ballast``): what is left of N's gap over it is not the replicas' CPU.

On the largest-N fleet of each mode, after its run: approximate-index convergence after a
replica restarts (`bench.replicas.convergence`), revocation latency (`bench.replicas.revocation`),
then quota accuracy (`bench.replicas.quota`: one tenant at its requests-per-minute limit, one at
its tokens-per-minute limit, through the front). Run it under the shared lock::

    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.replicas      # ~13 minutes
    .venv/bin/python -m bench.replicas --mode third-party --replicas 1,2 --duration 20
    .venv/bin/python -m bench.replicas --quick                               # smoke, ~2 min

The JSON goes to ``--out`` (default ``bench/results/replicas-TIME.json``); the tables are
printed (`bench.replicas.report`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml

from bench.common.ballast import Ballast
from bench.common.fleet_modes import MODE_CHOICES, Mode, key_of, parse_modes
from bench.common.pinning import CorePlan, pin
from bench.common.procstat import busy_cpu_seconds, cpu_seconds
from bench.replicas.convergence import OFFSETS_S, measure_convergence
from bench.replicas.drive import drive_front
from bench.replicas.figures import ratios, revocation_figures, verdicts
from bench.replicas.fleet import ReplicaFleet, ReplicaSpec, replica_fleet
from bench.replicas.quota import measure_quota, overload_rate_per_s
from bench.replicas.report import document_markdown
from bench.replicas.revocation import measure_revocation
from bench.routing.drive import Load, make_tenants
from bench.routing.figures import ideal_per_request, run_figures
from bench.routing.live import KV_FRACTION, kv_blocks_for
from bench.routing.workloads import system_prompts, working_set_blocks
from bench.run.spec import Record, TenantSpec
from bench.run.workloads import WORKLOADS, WorkloadOptions

REPEAT_LABEL = "1 again"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything one invocation is parameterised by."""

    replicas: tuple[int, ...] = (1, 2, 4)
    num_workers: int = 4
    num_groups: int = 24
    rate_per_s: float = 26.0  # 0.75 of round_robin's capacity at this KV (routing_live.md)
    send_s: float = 50.0
    warmup_s: float = 10.0
    drain_s: float = 20.0
    seed: int = 1
    kv_fraction: float = KV_FRACTION
    speed_factor: float | None = None
    is_repeat: bool = True
    is_control: bool = True
    quota_rpm: int = 300
    quota_tpm: int = 36_000
    quota_rate_per_s: float | None = None  # each tenant's; None: `overload_rate_per_s`
    quota_window_s: float = 30.0
    num_revocation_trials: int = 5
    is_pinned: bool = True  # the simulated engines on a core of their own (bench.common.pinning)
    # The load generator and the front on the engines' core, off the one the gateways share
    # (with is_pinned): their work is the same at every N, and a real fleet's clients and load
    # balancer run elsewhere.
    is_driver_apart: bool = True
    is_extras: bool = True  # convergence, revocation and quota on the largest fleet
    is_ballast: bool = True  # one replica again with the largest fleet's extra CPU burnt
    overrides: tuple[tuple[str, Any], ...] = ()  # gateway settings (ReplicaSpec.overrides)
    is_engine_log: bool = False  # each run's engines log their requests' phases
    workdir: Path = Path("bench/results/replicas-fleet")

    @property
    def options(self) -> WorkloadOptions:
        return WorkloadOptions(num_groups=self.num_groups)


def _tenants(fleet: ReplicaFleet, settings: Settings) -> list[TenantSpec]:
    """The workload's tenants, made on replica 0 (and, without shared state, on every one)."""
    tenants = make_tenants(fleet.replica_fleet(0), settings.num_groups)
    if not fleet.is_shared:
        for tenant in tenants:
            assert tenant.key is not None
            fleet.provision_everywhere({"id": tenant.name, "name": tenant.name,
                                        "tier": tenant.tier, "models": ["*"]}, tenant.key)
    return tenants


def _extras(fleet: ReplicaFleet, settings: Settings, key: str) -> dict[str, Any]:
    """Convergence, revocation and quota on a fleet just driven (its caches warm)."""
    out: dict[str, Any] = {}
    num = len(fleet.replicas)
    mode = fleet.spec.mode
    if num >= 2:
        print(f"  {mode:11} N={num} convergence after a restart ...", file=sys.stderr)
        prompts = system_prompts(settings.options, settings.num_groups, settings.seed)
        out["convergence"] = measure_convergence(fleet, key, prompts, OFFSETS_S)
        print(f"  {mode:11} N={num} revocation ...", file=sys.stderr)
        trials = measure_revocation(fleet, num_trials=settings.num_revocation_trials)
        out["revocation"] = {"num_replicas": num, "trials": trials,
                             "figures": revocation_figures(trials)}
    print(f"  {mode:11} N={num} quota ({settings.quota_window_s:g} s) ...", file=sys.stderr)
    rate_per_s = settings.quota_rate_per_s or overload_rate_per_s(
        settings.quota_rpm, settings.quota_tpm, settings.quota_window_s, fleet.front.model)
    out["quota"] = measure_quota(fleet, rpm=settings.quota_rpm, tpm=settings.quota_tpm,
                                 rate_per_s=rate_per_s,
                                 window_s=settings.quota_window_s,
                                 is_exact_count=mode == "own")
    return out


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_calls(url: str | None) -> dict[str, int]:
    """The calls of each command the fleet's Redis has served so far (``INFO commandstats``);
    {} without one."""
    if not url:
        return {}
    client = redis.Redis.from_url(url)
    try:
        stats: Any = client.info("commandstats")
    finally:
        client.close()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def engine_pages(worker_urls: Iterable[str]) -> dict[str, int]:
    """The ``/metrics`` and ``/health`` GETs the simulated engines have served so far, all
    of them together (``backends/sim/server.py``'s ``/sim/profile``)."""
    served: dict[str, int] = {}
    with httpx.Client(timeout=5.0) as client:
        for url in worker_urls:
            pages = client.get(url.rstrip("/") + "/sim/profile").json().get("pages_served", {})
            for path, count in pages.items():
                served[path] = served.get(path, 0) + int(count)
    return served


def calls_between(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """The calls of each command from ``before`` to ``after`` (the ``INFO`` that read
    ``before`` left out), those with any."""
    calls = {name: n - before.get(name, 0) for name, n in after.items()}
    calls["info"] = calls.get("info", 0) - 1
    return {name: n for name, n in sorted(calls.items()) if n > 0}


def run_one(spec: ReplicaSpec, settings: Settings, label: str, *, is_extra: bool = False,
            ballast_cores: float = 0.0) -> dict[str, Any]:
    """One fresh fleet, the workload through its front; its figures (and, with ``is_extra``,
    the convergence, revocation and quota measurements). With ``settings.is_pinned`` the
    simulated engines run on a core of their own and everything else on the others; with
    ``ballast_cores`` a `Ballast` burns that share of a core beside the gateways while the
    workload runs."""
    plan = CorePlan.split() if settings.is_pinned else None
    affinity = None if plan is None else plan.keep_self()
    try:
        return _run_fleet(spec, settings, label, plan, is_extra=is_extra,
                          ballast_cores=ballast_cores)
    finally:
        if affinity is not None:
            pin(os.getpid(), affinity)


def _run_fleet(spec: ReplicaSpec, settings: Settings, label: str, plan: CorePlan | None, *,
               is_extra: bool, ballast_cores: float) -> dict[str, Any]:
    started = time.monotonic()
    slug = f"{spec.mode}-{label.replace(' ', '-')}{'' if spec.is_shared else '-memory'}"
    load = Load(rate_per_s=settings.rate_per_s, send_s=settings.send_s,
                drain_s=settings.drain_s, seed=settings.seed)
    extras: dict[str, Any] = {}
    with replica_fleet(spec, settings.workdir / slug) as fleet:
        pids = fleet.pids()
        driver = [pids["front"]] if plan is not None and settings.is_driver_apart else []
        if plan is not None:
            plan.pin_engines([pids["sim"]])
            if driver:
                plan.pin_driver(driver)
        # The window of the CPU figures: from here (the fleet up) to the end of the drive.
        window_started, busy_before, own_before = (time.monotonic(), busy_cpu_seconds(),
                                                   _own_cpu_s())
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        calls_before = redis_calls(fleet.local.redis_url)
        pages_before = engine_pages(fleet.front.worker_urls.values())
        tenants = _tenants(fleet, settings)
        specs = WORKLOADS["shared-prefix"](settings.options, tenants, settings.seed)
        ballast_cpu_s = 0.0
        if ballast_cores > 0:
            with Ballast(ballast_cores, max_s=load.send_s + load.drain_s + 60,
                         cpus=plan.rest if plan is not None else None) as ballast:
                run = drive_front(fleet, specs, load)
            extras["ballast"] = {"target_cores": ballast_cores, "cores": ballast.cores}
            ballast_cpu_s = ballast.cpu_s
        else:
            run = drive_front(fleet, specs, load)
        if plan is not None and driver:
            plan.unpin_driver(driver)
        cpu_s = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
        calls = calls_between(calls_before, redis_calls(fleet.local.redis_url))
        pages_after = engine_pages(fleet.front.worker_urls.values())
        fleet_cpu_s = sum(cpu_s.values())
        elapsed_s = time.monotonic() - window_started
        # What the gateways' scrapes and probes asked of each engine, a second
        pages_per_engine_s = {
            path: (count - pages_before.get(path, 0)) / len(fleet.front.worker_urls) / elapsed_s
            for path, count in pages_after.items()}
        own_cpu_s = _own_cpu_s() - own_before
        others_cores = (busy_cpu_seconds() - busy_before - fleet_cpu_s - own_cpu_s
                        - ballast_cpu_s) / elapsed_s
        if is_extra:
            assert tenants[0].key is not None
            extras = _extras(fleet, settings, tenants[0].key)
    result = run.result
    ideal = ideal_per_request(result.records, result.messages)
    figures = run_figures(result.records, result.messages, result.counters, result.window_s,
                          sorted(fleet.front.worker_urls), result.routed,
                          speed_factor=settings.speed_factor or 1.0, warmup_s=settings.warmup_s,
                          ideal_tokens=ideal)
    ttft = figures["ttft_ms"]
    calls_per_request = (sum(calls.values()) / len(result.records) if result.records
                         else math.nan)
    print(f"  {spec.mode:11} N={label:8} ok {figures['num_ok']:5} ttft p90/p99 "
          f"{ttft['p90'] or math.nan:6.0f}/{ttft['p99'] or math.nan:6.0f} ms  cached "
          f"{figures['cached_fraction'] or math.nan:.3f}  Redis calls/request "
          f"{calls_per_request:.1f}  /metrics per engine per s "
          f"{pages_per_engine_s.get('/metrics', math.nan):.2f}  "
          f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return {"label": label, "num_replicas": spec.num_replicas, "is_shared": spec.is_shared,
            "per_replica": run.per_replica, "fleet_cores": fleet_cpu_s / elapsed_s,
            "others_cores": others_cores,
            "process_cores": {name: used_s / elapsed_s for name, used_s in cpu_s.items()},
            "own_cores": own_cpu_s / elapsed_s,
            "cores": None if plan is None else plan.describe(),
            "driver_apart": bool(driver),
            "fleet": {k: v for k, v in fleet.front.backends.items() if k != "backends"},
            # Redis commands served while the workload ran, and per request sent
            "redis_calls": calls, "redis_calls_per_request": calls_per_request,
            # GETs of /metrics and /health each engine served a second over the same window
            "engine_pages_per_s": pages_per_engine_s,
            **figures, "extras": extras, "records": request_records(result.records, ideal)}


def request_records(records: Sequence[Record], ideal: Mapping[int, int]
                    ) -> list[dict[str, Any]]:
    """Every request's record, with the cached tokens an ideal router would have given it
    (``bench.replicas.pool`` pools the runs of several invocations from them)."""
    return [record.to_json() | {"ideal_cached_tokens": ideal.get(record.index)}
            for record in records]


def gateway_side_cores(run: Mapping[str, Any]) -> float:
    """The cores a run used on the gateways' core: its gateways and Redis, and the front and
    this process (the load generator) unless they ran beside the engines; the engines too when
    they were not on a core of their own."""
    apart = run.get("cores") is not None
    driver_apart = bool(run.get("driver_apart"))
    process_cores: Mapping[str, float] = run["process_cores"]
    beside_engines = {"sim", "front"} if driver_apart else {"sim"}
    return (0.0 if driver_apart else float(run["own_cores"])) + sum(
        cores for name, cores in process_cores.items()
        if not (apart and name in beside_engines))


def run_mode(mode: Mode, settings: Settings, num_kv_blocks: int) -> dict[str, Any]:
    """Every run of one mode, then the ratios to one replica."""
    base = ReplicaSpec(mode, 1, num_workers=settings.num_workers, num_kv_blocks=num_kv_blocks,
                       speed_factor=settings.speed_factor, overrides=settings.overrides,
                       engine_log=settings.is_engine_log)
    largest = max(settings.replicas)
    runs: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {}
    for num in settings.replicas:
        run = run_one(replace(base, num_replicas=num), settings, str(num),
                      is_extra=settings.is_extras and num == largest)
        out.update(run.pop("extras"))
        runs[str(num)] = run
    if settings.is_ballast and largest > 1 and "1" in runs:
        extra = gateway_side_cores(runs[str(largest)]) - gateway_side_cores(runs["1"])
        if extra > 0.01:
            label = f"1 + {min(extra, 1.0):.2f} cores"
            same = run_one(base, settings, label, ballast_cores=min(extra, 1.0))
            same.update(same.pop("extras"))
            same["ratio"] = ratios({"same": same, "N": runs[str(largest)]}, base="same")["N"]
            same["compared"] = str(largest)
            out["same_cpu"] = same
    if settings.is_repeat and 1 in settings.replicas:
        runs[REPEAT_LABEL] = run_one(base, settings, REPEAT_LABEL)
        runs[REPEAT_LABEL].pop("extras")
    out["runs"] = runs
    out["ratios"] = ratios(runs)
    if settings.is_control and mode == "third-party" and largest > 1:
        control = run_one(replace(base, num_replicas=largest, is_shared=False), settings,
                          f"{largest} unshared")
        control.pop("extras")
        control["ratio"] = ratios({"1": runs["1"], "control": control}).get("control", {}) \
            if "1" in runs else {}
        out["control"] = control
    return out


def parse_override(item: str) -> tuple[str, Any]:
    """``--set``'s "routing.share_push_ms=5" as ("routing.share_push_ms", 5)."""
    path, sep, text = item.partition("=")
    if not sep or not path or any(not name for name in path.split(".")):
        raise ValueError(f"--set takes PATH=VALUE such as routing.share_push_ms=5, got {item!r}")
    return path, yaml.safe_load(text)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m bench.replicas``."""
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="1,2,4",
                        help="comma-separated replica counts (1 is the reference)")
    parser.add_argument("--mode", choices=MODE_CHOICES, default="both")
    parser.add_argument("--rate", type=float, default=26.0, help="req/s of the workload")
    parser.add_argument("--duration", type=float, default=50.0,
                        help="seconds of sending a run, warm-up included")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds at the start of a run left out of the figures")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kv-fraction", type=float, default=KV_FRACTION,
                        help="each worker's KV as a share of the system prompts' working set")
    parser.add_argument("--speed-factor", type=float, help="the sim's GPU speed (default 1)")
    parser.add_argument("--no-repeat", action="store_true",
                        help="skip the second one-replica run (the noise check)")
    parser.add_argument("--no-control", action="store_true",
                        help="skip the third-party run without shared state")
    parser.add_argument("--no-pin", action="store_true",
                        help="leave the simulated engines on the cores everything else uses "
                             "(default: a core of their own, as engines on GPU hosts have)")
    parser.add_argument("--driver-with-gateways", action="store_true",
                        help="the load generator and the front on the gateways' core (default: "
                             "on the engines', leaving the gateways' core to them and Redis)")
    parser.add_argument("--no-ballast", action="store_true",
                        help="skip one replica again with the largest fleet's extra CPU burnt "
                             "beside it (the same-CPU control)")
    parser.add_argument("--no-extras", action="store_true",
                        help="skip convergence, revocation and quota (the TTFT runs alone)")
    parser.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                        help="a gateway setting over the bench's, e.g. routing.share_push_ms=5 "
                             "(YAML value; repeatable)")
    parser.add_argument("--engine-log", action="store_true",
                        help="the simulated engines log each request's queue and prefill "
                             "(sim-requests.jsonl in each run's fleet folder), which "
                             "bench.replicas.split reads")
    parser.add_argument("--quota-window", type=float, default=30.0, help="seconds")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: replicas 1,2, 10 s runs, 10 s quota window")
    parser.add_argument("--out", type=Path, help="JSON path (default bench/results/...)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, write its JSON and print its tables."""
    args = build_parser().parse_args(argv)
    try:
        replicas = tuple(sorted({int(n) for n in args.replicas.split(",") if n}))
        modes = parse_modes(args.mode)
    except ValueError as exc:
        print(f"--replicas takes counts such as 1,2,4 ({exc})", file=sys.stderr)
        return 2
    if not replicas or min(replicas) < 1:
        print("--replicas takes counts of at least 1", file=sys.stderr)
        return 2
    try:
        overrides = tuple(parse_override(item) for item in args.set)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path: Path = args.out or Path("bench/results") / f"replicas-{stamp}.json"
    settings = Settings(replicas=replicas, rate_per_s=args.rate, send_s=args.duration,
                        warmup_s=args.warmup, seed=args.seed, kv_fraction=args.kv_fraction,
                        speed_factor=args.speed_factor, is_repeat=not args.no_repeat,
                        is_control=not args.no_control, is_pinned=not args.no_pin,
                        is_driver_apart=not args.driver_with_gateways,
                        is_extras=not args.no_extras, is_ballast=not args.no_ballast,
                        overrides=overrides, is_engine_log=args.engine_log,
                        quota_window_s=args.quota_window,
                        workdir=out_path.with_name(out_path.stem + "-fleet"))
    if args.quick:
        settings = replace(settings, replicas=(1, 2), send_s=10.0, warmup_s=2.0, drain_s=10.0,
                           quota_window_s=10.0, num_revocation_trials=2, is_repeat=False)
    working_set = working_set_blocks(settings.options, settings.num_groups, settings.seed)
    num_kv_blocks = kv_blocks_for(settings.kv_fraction, working_set)
    started, busy_before = time.monotonic(), busy_cpu_seconds()
    results: dict[str, Any] = {
        "modes": list(modes),
        "kv": {"working_set_blocks": working_set, "num_kv_blocks": num_kv_blocks,
               "fraction": settings.kv_fraction}}
    for mode in modes:
        print(f"{mode} fleet ...", file=sys.stderr)
        results[key_of(mode)] = run_mode(mode, settings, num_kv_blocks)
    elapsed_s = time.monotonic() - started
    results["config"] = {
        "command": " ".join(["python -m bench.replicas", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "elapsed_s": elapsed_s,
        "machine_busy_cores": (busy_cpu_seconds() - busy_before) / elapsed_s,
        "replicas": list(settings.replicas), "rate_per_s": settings.rate_per_s,
        "send_s": settings.send_s, "warmup_s": settings.warmup_s, "seed": settings.seed,
        "overrides": dict(settings.overrides),
        "cores": (plan.describe() if settings.is_pinned and (plan := CorePlan.split())
                  else None),
        "driver_apart": settings.is_driver_apart and settings.is_pinned,
        "quota": {"rpm": settings.quota_rpm, "tpm": settings.quota_tpm,
                  "window_s": settings.quota_window_s}}
    results["targets"] = verdicts({mode: results[key_of(mode)] for mode in modes})
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=1, default=str))
    print(document_markdown(results))
    print(f"results in {out_path} ({elapsed_s / 60:.1f} min)", file=sys.stderr)
    return 0
