"""What each fault does to clients, and how fast the gateway recovers: real processes on
loopback, under steady load, in both fleet modes.

One run (``flock /tmp/switchyard-bench.lock`` around it on a shared machine)::

    python -m bench.faults                          # every scenario, both modes, 3 runs (9.5 min)
    python -m bench.faults --mode own --runs 1      # one run of each, own fleet only
    python -m bench.faults --scenarios kill,stop    # some scenarios only

Each run of a scenario gets a fresh fleet (`bench.faults.fleet`: a private Redis, three
simulated workers each in its own process, slowed 4x so a 32-token stream lasts about a
second, and one gateway with default settings) and the same steady load
(`bench.faults.load`: ~20 req/s Poisson, 80 % 32-token streams, 20 % non-streaming, one key).
After `bench.faults.run.WARMUP_S` of load the scenario injects its fault
(`bench.faults.scenarios`), watching ``GET /admin/fleet`` (and for the Redis pause the
``switchyard_quota_fail_open_total`` counter) every 50 ms. The two modes of one scenario run
back to back, so a compared pair meets the same machine.

Results go to ``bench/results/faults/faults-<timestamp>.json`` (every run's figures, the
gateway's log lines of the run, each request that did not end well) with the summary beside
it (``.md``); targets are reported as met in k of N runs, never asserted (`bench.faults.report`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import orjson
import uvloop

import bench.faults
from bench.common.fleet_modes import MODE_CHOICES, Mode, parse_modes
from bench.common.paths import RESULTS_DIR
from bench.common.report import machine
from bench.faults.fleet import FaultFleet
from bench.faults.load import LoadShape
from bench.faults.report import markdown, summarise
from bench.faults.run import drive
from bench.faults.scenarios import MAX_CONCURRENT, SCENARIOS

NUM_WORKERS = 3
FAIL_OPEN_COUNTER = "switchyard_quota_fail_open_total"


def run_one(workdir: Path, scenario: str, mode: Mode, seed: int) -> dict[str, Any]:
    """One scenario on a fresh fleet; its figures."""
    with FaultFleet(workdir, mode) as fleet:
        fleet.start_workers(NUM_WORKERS)
        if scenario == "http_500":
            fleet.start_faulty()
        gateway = fleet.start_fault_gateway()
        limits = {"max_concurrent": MAX_CONCURRENT} if scenario == "redis_pause" else None
        key = fleet.provision(gateway, limits)
        roots = fleet.import_roots()
        counter = FAIL_OPEN_COUNTER if scenario == "redis_pause" else None
        figures = uvloop.run(drive(fleet, gateway, key, SCENARIOS[scenario],
                                   LoadShape(seed=seed), counter))
        figures["import_roots"] = roots
    return figures


def _line(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    keys = ("num_requests", "num_failed", "num_cut_error_event", "num_cut_silent")
    shown = {k: v for k, v in result.items() if k in keys or (k.endswith("_s") and
                                                              not isinstance(v, dict))}
    return " ".join(f"{k}={v}" for k, v in shown.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODE_CHOICES, default="both",
                        help="own: workers joining by heartbeat; third-party: the same engines "
                        "listed in backends:, no heartbeats; both (default)")
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario and mode")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR / "faults")
    args = parser.parse_args(argv)
    scenarios = [s for s in args.scenarios.split(",") if s]
    if not scenarios or not set(scenarios) <= set(SCENARIOS) or args.runs < 1:
        parser.error(f"--scenarios takes some of {', '.join(SCENARIOS)}; --runs at least 1")
    modes = parse_modes(args.mode)
    started = time.time()
    loadavg_at_start = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sy-faults-") as tmp:
        for run_index in range(args.runs):
            for scenario in scenarios:
                for mode in modes:
                    workdir = Path(tmp) / f"{scenario}-{mode}-{run_index}"
                    began = time.monotonic()
                    try:
                        result = run_one(workdir, scenario, mode, seed=run_index + 1)
                    except Exception as exc:  # one broken run must not lose the others
                        result = {"error": f"{exc.__class__.__name__}: {exc}"[:2000],
                                  "traceback": traceback.format_exc()[-4000:]}
                    result.update(scenario=scenario, mode=mode, run=run_index,
                                  wall_s=round(time.monotonic() - began, 1))
                    runs.append(result)
                    print(f"[{time.time() - started:6.0f} s] {scenario} {mode} run "
                          f"{run_index}: {_line(result)}", flush=True)
    document: dict[str, Any] = {
        "benchmark": "faults",
        "command": " ".join(["python -m bench.faults", *(argv if argv is not None
                                                         else sys.argv[1:])]),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "duration_s": round(time.time() - started, 1), "machine": machine(),
        "bench_imported_from": str(Path(bench.faults.__file__).resolve().parents[2]),
        "loadavg_at_start": loadavg_at_start, "loadavg_at_end": os.getloadavg(),
        "load": dataclasses.asdict(LoadShape()),
        "num_workers": NUM_WORKERS, "num_runs": args.runs, "scenarios": scenarios,
        "modes": list(modes), "runs": runs,
    }
    summary = summarise(document)
    document["summary"] = summary
    text = markdown(document, summary)
    print(text)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.results_dir / f"faults-{stamp}.json"
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    (args.results_dir / f"faults-{stamp}.md").write_text(
        f"`{document['command']}`, {document['started_at']}\n\n{text}\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
