"""One experiment from parsed options: target, tenants, schedule, drive, report.

Everything blocking (starting a fleet, the admin API, scraping /metrics, writing files) happens
before or after the event loop; only the send loop runs inside it. Example::

    run_experiment(build_parser().parse_args(argv), argv)   # writes results into --out
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import resource
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.common.procstat import busy_cpu_seconds
from bench.run import arrivals
from bench.run.client import Client, open_session
from bench.run.driver import DriveLimits, Driver, Scheduled
from bench.run.fleet import local_fleet
from bench.run.options import (
    OptionError,
    check_loopback,
    parse_fleet,
    parse_rates,
    parse_slos,
    parse_tenants,
)
from bench.run.plots import write_plots
from bench.run.progress import show_progress
from bench.run.report import markdown, write_results
from bench.run.spec import Record, RequestSpec, TenantSpec
from bench.run.summary import Phase, summarize
from bench.run.tenants import origin_of, provision, read_keys, write_keys
from bench.run.workers import load_spread, scrape_all
from bench.run.workloads import WORKLOADS, WorkloadOptions
from gateway.observe.waits import fetch as fetch_waits
from gateway.observe.waits import save_png

SECRET_OPTIONS = ("--admin-token", "--api-key")


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with the values of secret options (``SECRET_OPTIONS``) replaced by
    ``REDACTED``, in both ``--opt VALUE`` and ``--opt=VALUE`` forms (and argparse's unique
    prefixes)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append("REDACTED")
            hide_next = False
            continue
        name, eq, _ = arg.partition("=")
        is_secret = len(name) > 2 and name.startswith("--") and any(
            option.startswith(name) for option in SECRET_OPTIONS)
        if is_secret and eq:
            out.append(f"{name}=REDACTED")
        else:
            out.append(arg)
            hide_next = is_secret
    return out


def _keep_logs(fleet_dir: Path, logs_dir: Path) -> None:
    """Copy a finished fleet's logs next to the results, then delete its folder."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    for log_path in fleet_dir.glob("*.log"):
        shutil.copyfile(log_path, logs_dir / log_path.name)
    shutil.rmtree(fleet_dir, ignore_errors=True)


def _tenants(args: argparse.Namespace, url: str, admin_token: str | None) -> list[TenantSpec]:
    if args.keys_file is not None:
        return read_keys(args.keys_file)
    tenants = parse_tenants(args.tenants)
    if admin_token:
        tenants = provision(tenants, origin_of(url), admin_token)
        if args.save_keys is not None:
            write_keys(tenants, args.save_keys)
    elif args.api_key:
        tenants = [TenantSpec(t.name, t.tier, args.api_key) for t in tenants]
    return tenants


def _model(url: str, tenants: Sequence[TenantSpec]) -> str:
    headers = {"Authorization": f"Bearer {tenants[0].key}"} if tenants[0].key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/models", headers=headers, timeout=10)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise OptionError(f"cannot read the model from {url}/models ({exc}); pass --model")\
            from None


def _workload_options(args: argparse.Namespace) -> WorkloadOptions:
    return WorkloadOptions(
        num_groups=args.groups, system_tokens=args.system_tokens,
        question_tokens=args.question_tokens, max_tokens=args.max_tokens, zipf_s=args.zipf,
        num_conversations=args.conversations, turns=args.turns, num_docs=args.docs,
        doc_tokens=args.doc_tokens, trace_path=args.trace, time_scale=args.time_scale,
        max_context_tokens=args.max_context, is_stream=not args.no_stream,
    )


def _checked(specs: Iterator[RequestSpec]) -> Iterator[RequestSpec]:
    """``specs``, with the first drawn now, so a bad trace file fails before the run starts."""
    try:
        first = next(specs)
    except StopIteration:
        raise OptionError("the workload produced no requests (an empty trace?)") from None
    except (OSError, ValueError) as exc:
        raise OptionError(f"the workload cannot start: {exc}") from None
    return itertools.chain([first], specs)


def _schedule(args: argparse.Namespace, specs: Iterator[RequestSpec], send_window_s: float
              ) -> tuple[Iterator[Scheduled], list[Phase]]:
    if args.mode == "closed":
        return ((0.0, 0, spec) for spec in specs), [Phase(0, None, 0.0, send_window_s)]
    chosen = args.arrivals or ("trace" if args.workload == "trace" else "poisson")
    if chosen == "trace":
        if args.workload != "trace":
            raise OptionError("--arrivals trace needs --workload trace")
        return (((spec.at_s or 0.0), 0, spec) for spec in specs), \
            [Phase(0, None, 0.0, send_window_s)]
    process = arrivals.as_process(chosen)
    rates = parse_rates(args.rate)
    phase_s = send_window_s / len(rates)
    rng = random.Random(f"{args.seed}:arrivals")
    timeline = arrivals.sweep(rates, phase_s, process, args.cv, rng)
    phases = [Phase(i, rate, i * phase_s, (i + 1) * phase_s) for i, rate in enumerate(rates)]
    return ((a.at_s, a.phase, spec) for a, spec in zip(timeline, specs, strict=False)), phases


async def _drive(client_args: tuple[str, str], limits: DriveLimits, schedule: Iterator[Scheduled],
                 show: bool) -> list[Record]:
    async with open_session(limits.concurrency if limits.mode == "closed" else None) as session:
        driver = Driver(Client(session, *client_args), limits)
        async with show_progress(driver, limits, enabled=show):
            return await driver.run(schedule)


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _gateway_waits(url: str, admin_token: str | None, window_s: float) -> dict[str, Any] | None:
    """The gateway's waits report over the run (``gateway.observe.waits``), or None when the target
    is not a switchyard gateway or no admin token was given."""
    if not admin_token:
        return None
    root = url.rstrip("/").removesuffix("/v1")
    try:
        return fetch_waits(root, admin_token, window_s)
    except (httpx.HTTPError, RuntimeError, ValueError) as exc:
        print(f"no waits report from {root}: {exc}", file=sys.stderr)
        return None


def run_experiment(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the experiment ``args`` describe and write its results; the exit status."""
    if (args.url is None) == (args.fleet is None):
        raise OptionError("pass exactly one of --url (a running endpoint) or --fleet sim:N")
    if args.duration <= 0 or args.max_requests < 1 or args.concurrency < 1:
        raise OptionError("--duration, --max-requests and --concurrency must be positive")
    drain_s = args.drain if args.drain is not None else min(10.0, 0.2 * args.duration)
    if not 0 <= drain_s < args.duration:
        raise OptionError(f"--drain must be in [0, --duration), got {drain_s}")
    if args.url is not None:
        check_loopback(args.url)
    metrics_urls = [check_loopback(u) for u in args.worker_metrics]
    options = _workload_options(args)
    slos = parse_slos(args.slo)
    out_dir = args.out or Path("bench/results") / time.strftime("run-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        url, admin_token, model = args.url, args.admin_token, args.model
        if args.fleet is not None:
            kind, count = parse_fleet(args.fleet)
            print(f"starting {count} {kind} engine(s), redis and a gateway ...", file=sys.stderr)
            # The fleet's configuration holds its secrets: it lives outside the results, which
            # keep only its logs (``fleet-logs/``).
            fleet_dir = Path(tempfile.mkdtemp(prefix="switchyard-bench-fleet-"))
            stack.callback(_keep_logs, fleet_dir, out_dir / "fleet-logs")
            fleet = stack.enter_context(local_fleet(kind, count, fleet_dir,
                                                    tokenizer=args.fleet_tokenizer))
            url, admin_token, model = fleet.url, fleet.admin_token, model or fleet.model
            metrics_urls += fleet.worker_metrics
        url = check_loopback(url)
        admin_token = admin_token or os.environ.get("SWITCHYARD_ADMIN_TOKEN")
        tenants = _tenants(args, url, admin_token)
        model = model or _model(url, tenants)
        limits = DriveLimits(mode=args.mode, concurrency=args.concurrency,
                             max_requests=args.max_requests,
                             send_window_s=args.duration - drain_s, deadline_s=args.duration)
        specs = _checked(WORKLOADS[args.workload](options, tenants, args.seed))
        schedule, phases = _schedule(args, specs, limits.send_window_s)
        before = scrape_all(metrics_urls)
        cpu_before, busy_before = _own_cpu_s(), busy_cpu_seconds()
        show = not args.no_progress and sys.stderr.isatty()
        records = uvloop.run(_drive((url, model), limits, schedule, show))
        cpu_s, busy_s = _own_cpu_s() - cpu_before, busy_cpu_seconds() - busy_before
        spread = load_spread(before, scrape_all(metrics_urls))
        waits = _gateway_waits(url, admin_token, args.duration)
    summary = summarize(records, slos, phases)
    summary["workers"] = spread
    summary["loadgen"] = {"cpu_s": cpu_s, "machine_busy_cpu_s": busy_s,
                          "cpu_us_per_request": cpu_s / len(records) * 1e6 if records else None}
    config: dict[str, Any] = {
        "command": shlex.join(["switchyard", "bench", "run", *redacted(argv)]), "url": url,
        "model": model,
        "workload": args.workload, "mode": args.mode, "seed": args.seed,
        "num_tenants": len(tenants), "tenants": {t.name: t.tier for t in tenants},
        "limits": {"send_window_s": limits.send_window_s, "deadline_s": limits.deadline_s,
                   "max_requests": limits.max_requests, "concurrency": limits.concurrency},
        "workload_options": {f.name: str(getattr(options, f.name)) for f in fields(options)},
    }
    if waits is not None:
        summary["waits"] = {tier: {"most_expensive": figures.get("most_expensive")}
                            for tier, figures in waits.get("tiers", {}).items()}
        (out_dir / "waits.json").write_text(json.dumps(waits, indent=2) + "\n")
    write_results(out_dir, config, summary, records)
    table = markdown(config, summary)
    (out_dir / "summary.md").write_text(table + "\n")
    if not args.no_plots:
        write_plots(out_dir, records, summary)
        if waits is not None and waits.get("num_requests"):
            save_png(waits, out_dir / "waits.png")
    print(table)
    print(f"results in {out_dir}", file=sys.stderr)
    return 0 if summary["overall"]["num_ok"] else 1
