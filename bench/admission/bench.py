"""SLO-class admission and tenant fairness under overload, quota accuracy, and cost,
on an own fleet and on a third-party one.

One run (``flock /tmp/switchyard-bench.lock`` around it on a shared machine)::

    python -m bench.admission                      # both modes (about 25 minutes)
    python -m bench.admission --mode own           # the own fleet only (about 12 min)
    python -m bench.admission --mode third-party   # the third-party fleet only
    python -m bench.admission --quick    # a smoke run, both modes (about 45 s, 2 workers)
    python -m bench.admission --costs-only   # only the admission cost (about 4 min)

1. **Fleet** (`bench.admission.sim`), once per mode (`bench.common.fleet_modes`, ``--mode``): a
   private Redis, simulated workers (small batches, slowed down, so the fleet saturates at a
   rate a 2-core machine can drive) and two gateways on them: admission on (the default) and
   off (``admission: {slo_enabled: false}``: plain FIFO to the workers). **own**: the workers
   join through heartbeats; **third-party**: the same workers without Redis, listed in
   ``backends:`` (no ``profile:``) with ``routing: {discover_workers: false}``. Ten tenants,
   ``t0`` sending 10x each of the others; 20% interactive, 50% standard, 30% batch
   (`bench.admission.load`).
2. **Capacity at 1x**, through the FIFO gateway: a closed loop at twice the fleet's batch slots
   gives the saturation throughput X; then Poisson rates 0.75 .. 1.0 X in steps of 0.05 from
   0.85, each as long as a load level (40 s), and the capacity is the highest whose
   standard-tier TTFT p99 stays within its 2 s SLO. Each mode measures its own. (At X itself a
   FIFO queue grows without bound; a 20 s step passed there in about half the runs by luck,
   which made the capacity, and every ratio to it, jump by 10 %.)
3. **Overload**: 1x, 1.5x, 2x and 3x that capacity, each with admission on and off (same
   seed, so the same requests at the same times); figures in `bench.admission.figures`.
4. **Retries**: the 2x run again through the admission gateway (same seed), with the
   interactive and standard clients (``--retry-tiers``, ``--retry-fraction``) retrying each
   refusal once, after exactly its ``Retry-After``: the share of those first retries admitted,
   and the share served within the tier's TTFT SLO.
5. **Quota accuracy** and **admission cost** on a mock engine (`bench.admission.quota`),
   once: a mock engine listed in the configuration is third-party in both modes.

Results go to ``bench/results/admission-<timestamp>.json``; targets are printed as PASS/FAIL
per mode, never asserted (`bench.admission.report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench.admission.fleet import Fleet
from bench.admission.load import TIERS, RetryPolicy
from bench.admission.quota import measure_costs, measure_quota
from bench.admission.report import costs_table, judge, markdown, quota_table
from bench.admission.sim import QUICK, Plan, run_main_fleet
from bench.common.fleet_modes import MODE_CHOICES, key_of, parse_modes
from bench.common.paths import RESULTS_DIR
from bench.common.report import machine
from bench.run.options import DEFAULT_SLOS

__all__ = ["QUICK", "Plan", "main", "run_costs_only", "run_main_fleet", "run_mock_fleet"]



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
    parser = argparse.ArgumentParser(prog="python -m bench.admission", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds a phase")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--headroom-factor", type=float, default=None,
                        help="admission.headroom_factor of the admission-on gateway "
                        "(default: the gateway's default)")
    parser.add_argument("--costs-only", action="store_true",
                        help="only the admission cost part (CPU and Redis calls per request)")
    parser.add_argument("--mock-only", action="store_true",
                        help="only the mock fleet: quota accuracy over 3 replicas, then the "
                        "admission cost")
    parser.add_argument("--mode", choices=MODE_CHOICES, default="both",
                        help="own: workers joining by heartbeat; third-party: the same engines "
                        "without Redis, listed in backends:; both (default): one after the other")
    parser.add_argument("--retry-tiers", default=",".join(RetryPolicy().tiers),
                        help="tiers whose clients retry a refusal once, after its Retry-After")
    parser.add_argument("--retry-fraction", type=float, default=RetryPolicy().fraction,
                        help="share of those tiers' clients (tenant keys) that retry")
    parser.add_argument("--levels", help="load levels as multiples of the capacity, "
                        "comma-separated (default 1,1.5,2,3; the targets are judged at 2)")
    parser.add_argument("--no-mock", action="store_true",
                        help="skip the mock-engine fleet (quota accuracy, admission cost)")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else Plan()
    tiers = tuple(t for t in args.retry_tiers.split(",") if t)
    if not set(tiers) <= set(TIERS) or not 0 <= args.retry_fraction <= 1:
        parser.error(f"--retry-tiers takes tiers of {', '.join(TIERS)}; --retry-fraction 0..1")
    plan = dataclasses.replace(plan, retry=dataclasses.replace(
        plan.retry, tiers=tiers, fraction=args.retry_fraction))
    if args.levels:
        try:
            levels = tuple(float(x) for x in args.levels.split(",") if x)
        except ValueError:
            levels = ()
        if not levels or min(levels) <= 0:
            parser.error(f"--levels takes multiples of the capacity such as 1,2; not "
                         f"{args.levels!r}")
        plan = dataclasses.replace(plan, levels=levels)
    if args.costs_only or args.mock_only:
        return _mock_only(plan, args.results_dir, argv, with_quota=args.mock_only)
    started = time.time()
    loadavg_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="sy-admission-") as tmp:
        overrides = ({} if args.headroom_factor is None
                     else {"headroom_factor": args.headroom_factor})
        modes = parse_modes(args.mode)
        by_mode = {mode: run_main_fleet(Path(tmp) / f"sim-{mode}", plan, overrides, mode)
                   for mode in modes}
        main_fleet_s = time.time() - started
        quota, costs = (None, None) if args.no_mock else run_mock_fleet(Path(tmp) / "mock",
                                                                         plan)
    document: dict[str, Any] = {
        "benchmark": "admission", "issue": 5,
        "command": " ".join(["python -m bench.admission", *(argv or sys.argv[1:])]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": time.time() - started, "main_fleet_s": main_fleet_s,
        "machine": machine(),
        "loadavg_at_start": loadavg_at_start, "loadavg_at_end": os.getloadavg(),
        "plan": dataclasses.asdict(plan), "admission_overrides": overrides,
        "slos": {tier: slo.ttft_s for tier, slo in DEFAULT_SLOS.items()},
        "modes": list(modes), **{key_of(mode): run for mode, run in by_mode.items()},
    }
    if quota is not None:
        document.update(quota=quota, costs=costs)
    targets = judge(document)
    document["targets"] = targets
    print(markdown(document, targets))
    args.results_dir.mkdir(parents=True, exist_ok=True)
    path = args.results_dir / time.strftime("admission-%Y%m%d-%H%M%S.json")
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    return 0


def _mock_only(plan: Plan, results_dir: Path, argv: list[str] | None, *,
               with_quota: bool) -> int:
    """``--costs-only`` (the admission cost alone) or ``--mock-only`` (the quota accuracy
    phase first): the mock fleet without the simulated one."""
    started = time.time()
    quota = None
    with tempfile.TemporaryDirectory(prefix="sy-admission-") as tmp:
        if with_quota:
            quota, costs = run_mock_fleet(Path(tmp) / "mock", plan)
        else:
            costs = run_costs_only(Path(tmp) / "mock", plan)
    name = "admission-mock" if with_quota else "admission-costs"
    document = {"benchmark": name, "issue": 5,
                "command": " ".join(["python -m bench.admission",
                                     *(argv or sys.argv[1:])]),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                "duration_s": time.time() - started, "machine": machine(),
                "plan": dataclasses.asdict(plan), "costs": costs,
                **({"quota": quota} if quota is not None else {})}
    if quota is not None:
        print(quota_table(quota) + "\n")
    print(costs_table(costs))
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / time.strftime(f"{name}-%Y%m%d-%H%M%S.json")
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
