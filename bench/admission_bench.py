"""Issue 5: SLO-class admission and tenant fairness under overload, quota accuracy, and cost.

One run (``flock /tmp/switchyard-bench.lock`` around it on a shared machine)::

    python -m bench.admission_bench            # the full benchmark (about 10 minutes)
    python -m bench.admission_bench --quick    # a smoke run (about 30 s, 2 workers)
    python -m bench.admission_bench --costs-only   # only the admission cost (about 4 min)

1. **Fleet**: a private Redis, simulated workers (small batches, slowed down, so the fleet
   saturates at a rate a 2-core machine can drive) joining through heartbeats, and two
   gateways on it: admission on (the default) and off (``admission: {slo_enabled: false}``:
   plain FIFO to the workers). Ten tenants, ``t0`` sending 10x each of the others; 20%
   interactive, 50% standard, 30% batch (`bench.admission_bench_load`).
2. **Capacity at 1x**, through the FIFO gateway: a closed loop at twice the fleet's batch slots
   gives the saturation throughput X; then Poisson rates 0.6 .. 1.0 X, and the capacity is the
   highest whose standard-tier TTFT p99 stays within its 2 s SLO.
3. **Overload**: 1x, 1.5x, 2x and 3x that capacity, each with admission on and off (same
   seed, so the same requests at the same times); figures in `bench.admission_bench_figures`.
4. **Quota accuracy** and **admission cost** on a mock engine (`bench.admission_bench_quota`).

Results go to ``bench/results/admission-<timestamp>.json``; targets are printed as PASS/FAIL,
never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.admission_bench_figures import run_figures
from bench.admission_bench_fleet import (
    SIM_MODEL,
    Fleet,
    GatewayProc,
    by_label,
    provision,
    scrape,
    wait_idle,
)
from bench.admission_bench_load import (
    HEAVY,
    TIERS,
    Mix,
    Workload,
    completions_per_s,
    drive,
    drive_closed,
)
from bench.admission_bench_quota import measure_costs, measure_quota
from bench.admission_bench_report import costs_table, judge, markdown
from bench.report import machine
from bench.run.options import DEFAULT_SLOS

RESULTS_DIR = Path(__file__).resolve().parent / "results"
Keys = Mapping[str, Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes of every phase; ``QUICK`` is the smoke-test size."""

    num_workers: int = 4
    max_batch: int = 4
    speed_factor: float = 0.25
    mix: Mix = field(default_factory=Mix)
    probe_s: float = 12.0
    sweep_fractions: tuple[float, ...] = (0.6, 0.75, 0.9, 1.0)
    sweep_s: float = 20.0
    levels: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0)
    level_s: float = 40.0
    drain_s: float = 5.0
    warmup_s: float = 5.0
    quota_rpm: int = 600
    quota_rate_per_s: float = 50.0
    quota_window_s: float = 60.0
    cost_requests: int = 5000
    cost_warmup: int = 300
    cost_runs: int = 3


QUICK = Plan(num_workers=2, mix=Mix(prompt_tokens=(50, 150), max_tokens=(4, 8)), probe_s=1.5,
             sweep_fractions=(1.0,), sweep_s=1.0, level_s=1.0, drain_s=0.5, warmup_s=0.0,
             quota_rpm=30, quota_rate_per_s=40.0, quota_window_s=1.5, cost_requests=100,
             cost_warmup=10, cost_runs=1)


def _wait_served(gateway: GatewayProc, key: str, timeout_s: float = 20.0) -> None:
    """Until the gateway has found the workers and answers a request."""
    deadline = time.monotonic() + timeout_s
    body = {"model": SIM_MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    while True:
        response = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=10,
                              headers={"Authorization": f"Bearer {key}"})
        if response.status_code == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{gateway.url} cannot serve: {response.text[:300]}\n"
                               f"--- gateway log ---\n{gateway.log_tail()}")
        time.sleep(0.2)


def run_once(gateway: GatewayProc, keys: Keys, plan: Plan, workers: Sequence[str], *,
             rate_rps: float, send_s: float, is_fifo: bool, seed: int) -> dict[str, Any]:
    """One open-loop run through ``gateway``: figures, gateway counters and the records."""
    idle_wait_s = wait_idle(workers)
    before = scrape(gateway.url + "/metrics")
    workload = Workload(keys, plan.mix, seed)
    records = drive(gateway.url + "/v1", SIM_MODEL, workload, rate_per_s=rate_rps,
                    send_s=send_s, drain_s=plan.drain_s)
    after = scrape(gateway.url + "/metrics")
    rejections = {reason: value - by_label(before, "switchyard_admission_rejections_total")
                  .get(reason, 0.0)
                  for reason, value in by_label(after, "switchyard_admission_rejections_total")
                  .items()}
    counters = {name: after.get(name, 0.0) - before.get(name, 0.0)
                for name in ("switchyard_admission_queued_total",
                             "switchyard_quota_refusals_total")}
    return {"rate_rps": rate_rps, "send_s": send_s, "idle_wait_s": idle_wait_s,
            "rejections": rejections, "counters": counters,
            "figures": run_figures(records, DEFAULT_SLOS, workload.demanded_tokens,
                                   window_s=send_s, is_fifo=is_fifo, heavy=HEAVY),
            "records": [r.to_json() for r in records]}


def measure_capacity(fifo: GatewayProc, keys: Keys, plan: Plan, workers: Sequence[str]
                     ) -> dict[str, Any]:
    """Saturation throughput, then the FIFO rate sweep; see the module docstring."""
    slots = plan.num_workers * plan.max_batch
    probe = drive_closed(fifo.url + "/v1", SIM_MODEL, Workload(keys, plan.mix, 7),
                         concurrency=2 * slots, send_s=plan.probe_s)
    saturation = completions_per_s(probe, plan.probe_s / 4, plan.probe_s)
    sweep = []
    for index, fraction in enumerate(plan.sweep_fractions):
        run = run_once(fifo, keys, plan, workers, rate_rps=fraction * saturation,
                       send_s=plan.sweep_s, is_fifo=True, seed=100 + index)
        tiers = run["figures"]["tiers"]
        p99 = tiers["standard"]["ttft_ms"]["p99"]
        sweep.append({"fraction": fraction, "rate_rps": run["rate_rps"],
                      "standard_ttft_p99_ms": p99,
                      "interactive_ttft_p99_ms": tiers["interactive"]["ttft_ms"]["p99"],
                      "goodput_rps": run["figures"]["goodput_rps"],
                      "throughput_rps": run["figures"]["throughput_rps"],
                      "is_under_slo": p99 is not None
                      and p99 <= DEFAULT_SLOS["standard"].ttft_s * 1000})
    passing = [s["rate_rps"] for s in sweep if s["is_under_slo"]]
    return {"method": "highest FIFO Poisson rate with standard TTFT p99 <= 2 s",
            "saturation_rps": saturation, "probe_concurrency": 2 * slots,
            "capacity_rps": max(passing) if passing else sweep[0]["rate_rps"],
            "is_capacity_met": bool(passing), "sweep": sweep}


def run_main_fleet(workdir: Path, plan: Plan, admission: Mapping[str, Any] | None = None
                   ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Capacity, then every load level with admission on and off; ``admission``: settings
    for the admission-on gateway beyond the defaults (e.g. ``{"headroom_factor": 1.0}``)."""
    with Fleet(workdir) as fleet:
        workers = fleet.start_sim(plan.num_workers, max_batch=plan.max_batch,
                                  speed_factor=plan.speed_factor)
        off, on = fleet.start_gateways([False, True], admission=[{}, dict(admission or {})])
        gateways = {"off": off, "on": on}
        keys = provision(gateways["off"].url, fleet.admin_token, plan.mix.tenants, TIERS)
        for gateway in gateways.values():
            _wait_served(gateway, keys[HEAVY]["standard"])
        capacity = measure_capacity(gateways["off"], keys, plan, workers)
        rate = capacity["capacity_rps"]
        if plan.warmup_s:  # the admission gateway's TTFT predictor learns from first tokens
            run_once(gateways["on"], keys, plan, workers, rate_rps=0.5 * rate,
                     send_s=plan.warmup_s, is_fifo=False, seed=99)
        levels = []
        for index, level in enumerate(plan.levels):
            for mode in ("on", "off"):
                run = run_once(gateways[mode], keys, plan, workers, rate_rps=level * rate,
                               send_s=plan.level_s, is_fifo=mode == "off", seed=200 + index)
                levels.append({"level": level, "mode": mode, **run})
                print(f"{level:g}x admission {mode}: goodput "
                      f"{run['figures']['goodput_rps']:.2f} req/s of capacity {rate:.2f}",
                      file=sys.stderr, flush=True)
    return capacity, levels


def run_mock_fleet(workdir: Path, plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Quota accuracy through three replicas, then the cost of admission."""
    with Fleet(workdir) as fleet:
        backend = fleet.start_mock()
        *replicas, slo_gateway = fleet.start_gateways([False, False, False, True], [backend])
        quota = measure_quota(fleet, replicas, rpm=plan.quota_rpm,
                              rate_per_s=plan.quota_rate_per_s, window_s=plan.quota_window_s)
        costs = measure_costs(fleet, {False: replicas[0], True: slo_gateway},
                              num_requests=plan.cost_requests, num_warmup=plan.cost_warmup,
                              runs=plan.cost_runs)
    return quota, costs


def run_costs_only(workdir: Path, plan: Plan) -> dict[str, Any]:
    """The admission cost alone, on the mock fleet of `run_mock_fleet` (no quota phase)."""
    with Fleet(workdir) as fleet:
        backend = fleet.start_mock()
        plain, slo_gateway = fleet.start_gateways([False, True], [backend])
        return measure_costs(fleet, {False: plain, True: slo_gateway},
                             num_requests=plan.cost_requests, num_warmup=plan.cost_warmup,
                             runs=plan.cost_runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission_bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds a phase")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--headroom-factor", type=float, default=None,
                        help="admission.headroom_factor of the admission-on gateway "
                        "(default: the gateway's default)")
    parser.add_argument("--costs-only", action="store_true",
                        help="only the admission cost part (CPU and Redis calls per request)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    if args.costs_only:
        return _costs_only(plan, args.results_dir, argv)
    started = time.time()
    loadavg_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sy-admission-") as tmp:
        overrides = ({} if args.headroom_factor is None
                     else {"headroom_factor": args.headroom_factor})
        capacity, levels = run_main_fleet(Path(tmp) / "sim", plan, overrides)
        main_fleet_s = time.time() - started
        quota, costs = run_mock_fleet(Path(tmp) / "mock", plan)
    document: dict[str, Any] = {
        "benchmark": "admission", "issue": 5,
        "command": " ".join(["python -m bench.admission_bench", *(argv or sys.argv[1:])]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started, "main_fleet_s": main_fleet_s,
        "machine": machine(),
        "loadavg_at_start": loadavg_at_start, "loadavg_at_end": os.getloadavg(),
        "plan": dataclasses.asdict(plan), "admission_overrides": overrides,
        "slos": {tier: slo.ttft_s for tier, slo in DEFAULT_SLOS.items()},
        "capacity": capacity, "levels": levels, "quota": quota, "costs": costs,
    }
    targets = judge(document)
    document["targets"] = targets
    print(markdown(document, targets))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / time.strftime("admission-%Y%m%d-%H%M%S.json")
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    return 0


def _costs_only(plan: Plan, results_dir: Path, argv: list[str] | None) -> int:
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sy-admission-") as tmp:
        costs = run_costs_only(Path(tmp) / "mock", plan)
    document = {"benchmark": "admission-costs", "issue": 5,
                "command": " ".join(["python -m bench.admission_bench",
                                     *(argv or sys.argv[1:])]),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                "duration_s": time.time() - started, "machine": machine(),
                "plan": dataclasses.asdict(plan), "costs": costs}
    print(costs_table(costs))
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / time.strftime("admission-costs-%Y%m%d-%H%M%S.json")
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
