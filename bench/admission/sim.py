"""The admission benchmark's simulated fleet, phase by phase: capacity, load levels, retries.

`run_main_fleet` starts one fleet (own or third-party, `bench.common.fleet_modes`): simulated
workers and two gateways on them, admission on and off; measures the capacity through the FIFO
gateway (`measure_capacity`), runs every load level through both (`run_once`), then the retry
run at the target level (`run_retry`). `Plan` sizes every phase; `QUICK` is the smoke-test size.
Example::

    run = run_main_fleet(workdir, QUICK, mode="third-party")
    run["capacity"]["capacity_rps"], run["retry"]["retries"]["admitted_share"]
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from backends.fleet.prom import by_label
from bench.admission.figures import retry_figures, run_figures
from bench.admission.fleet import (
    SIM_MODEL,
    Fleet,
    GatewayProc,
    provision,
    scrape,
    wait_idle,
)
from bench.admission.load import (
    HEAVY,
    TIERS,
    Mix,
    RetryPolicy,
    Workload,
    completions_per_s,
    drive,
    drive_closed,
    drive_with_retries,
)
from bench.admission.report import TARGET_LEVEL
from bench.common.fleet_modes import (
    Mode,
    describe,
    fleet_snapshot,
    static_backends,
    wait_for_backends,
)
from bench.run.options import DEFAULT_SLOS

Keys = Mapping[str, Mapping[str, str]]


@dataclass(frozen=True, slots=True)
class Plan:
    """Sizes of every phase; ``QUICK`` is the smoke-test size."""

    num_workers: int = 4
    max_batch: int = 4
    speed_factor: float = 0.25
    mix: Mix = field(default_factory=Mix)
    probe_s: float = 12.0
    # Steps of 0.05 near X, each as long as a load level: a FIFO queue at X grows without
    # bound, which a 20 s step hid in about half the runs (capacity X one run, 0.9 X the next).
    sweep_fractions: tuple[float, ...] = (0.75, 0.85, 0.9, 0.95, 1.0)
    sweep_s: float = 40.0
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
    retry: RetryPolicy = field(default_factory=RetryPolicy)


QUICK = Plan(num_workers=2, mix=Mix(prompt_tokens=(50, 150), max_tokens=(4, 8)), probe_s=1.5,
             sweep_fractions=(1.0,), sweep_s=1.0, level_s=1.0, drain_s=0.5, warmup_s=0.0,
             quota_rpm=30, quota_rate_per_s=40.0, quota_window_s=1.5, cost_requests=100,
             cost_warmup=10, cost_runs=1, retry=RetryPolicy(max_wait_s=3.0, drain_s=2.0))


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
                                   window_s=send_s, is_fifo=is_fifo, heavy=HEAVY,
                                   weights=workload.mix.weights),
            "records": [r.to_json() for r in records]}


def measure_capacity(fifo: GatewayProc, keys: Keys, plan: Plan, workers: Sequence[str]
                     ) -> dict[str, Any]:
    """Saturation throughput, then the FIFO rate sweep (`bench.admission.bench`, step 2)."""
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


def run_retry(gateway: GatewayProc, keys: Keys, plan: Plan, workers: Sequence[str], *,
              rate_rps: float, seed: int) -> dict[str, Any]:
    """One open-loop run through the admission gateway whose retrying clients
    (``plan.retry``) retry each refusal once after its Retry-After: the first attempts'
    figures, and the retries' (`retry_figures`)."""
    idle_wait_s = wait_idle(workers)
    workload = Workload(keys, plan.mix, seed)
    first, retries = drive_with_retries(gateway.url + "/v1", SIM_MODEL, workload, plan.retry,
                                        rate_per_s=rate_rps, send_s=plan.level_s,
                                        drain_s=plan.drain_s)
    retrying = [r for r in first if plan.retry.is_retrying(r.tenant, r.tier)]
    return {"rate_rps": rate_rps, "send_s": plan.level_s, "idle_wait_s": idle_wait_s,
            "policy": dataclasses.asdict(plan.retry),
            "figures": run_figures(first, DEFAULT_SLOS, workload.demanded_tokens,
                                   window_s=plan.level_s, is_fifo=False, heavy=HEAVY,
                                   weights=workload.mix.weights),
            "retries": retry_figures(retrying, retries, DEFAULT_SLOS, plan.retry.tiers),
            "records": [r.to_json() for r in first],
            "retry_records": [r.to_json() for r in retries.values()]}


def run_main_fleet(workdir: Path, plan: Plan, admission: Mapping[str, Any] | None = None,
                   mode: Mode = "own") -> dict[str, Any]:
    """Capacity, then every load level with admission on and off, then the retry run at the
    target level; ``admission``: settings for the admission-on gateway beyond the defaults
    (e.g. ``{"headroom_factor": 1.0}``); ``mode``: own or third-party fleet."""
    started = time.monotonic()
    with Fleet(workdir) as fleet:
        is_own = mode == "own"
        workers = fleet.start_sim(plan.num_workers, has_redis=is_own, max_batch=plan.max_batch,
                                  speed_factor=plan.speed_factor)
        off, on = fleet.start_gateways(
            [False, True], [] if is_own else static_backends(workers, SIM_MODEL),
            admission=[{}, dict(admission or {})],
            routing=None if is_own else {"discover_workers": False})
        gateways = {"off": off, "on": on}
        for gateway in gateways.values():
            wait_for_backends(gateway.url, fleet.admin_token, plan.num_workers, mode,
                              fleet.group)
        known_by = describe(fleet_snapshot(on.url, fleet.admin_token))
        keys = provision(gateways["off"].url, fleet.admin_token, plan.mix.tenants, TIERS,
                         weights=plan.mix.weights)
        for gateway in gateways.values():
            _wait_served(gateway, keys[HEAVY]["standard"])
        capacity = measure_capacity(gateways["off"], keys, plan, workers)
        rate = capacity["capacity_rps"]
        if plan.warmup_s:  # the admission gateway's TTFT predictor learns from first tokens
            run_once(gateways["on"], keys, plan, workers, rate_rps=0.5 * rate,
                     send_s=plan.warmup_s, is_fifo=False, seed=99)
        levels = []
        for index, level in enumerate(plan.levels):
            for admission_mode in ("on", "off"):
                run = run_once(gateways[admission_mode], keys, plan, workers,
                               rate_rps=level * rate, send_s=plan.level_s,
                               is_fifo=admission_mode == "off", seed=200 + index)
                levels.append({"level": level, "mode": admission_mode, **run})
                print(f"{mode} {level:g}x admission {admission_mode}: goodput "
                      f"{run['figures']['goodput_rps']:.2f} req/s of capacity {rate:.2f}",
                      file=sys.stderr, flush=True)
        # The same requests at the same times as the target level's run (its seed).
        seed = 200 + (plan.levels.index(TARGET_LEVEL) if TARGET_LEVEL in plan.levels else 50)
        retry = run_retry(gateways["on"], keys, plan, workers, rate_rps=TARGET_LEVEL * rate,
                          seed=seed)
        print(f"{mode} {TARGET_LEVEL:g}x with retries: "
              f"{retry['retries']['num_admitted']} of {retry['retries']['num_retried']} "
              "retries admitted", file=sys.stderr, flush=True)
    return {"mode": mode, "fleet": {k: v for k, v in known_by.items() if k != "backends"},
            "fleet_backends": known_by["backends"], "capacity": capacity, "levels": levels,
            "retry": retry, "elapsed_s": time.monotonic() - started}
