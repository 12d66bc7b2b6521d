"""``python -m bench.soak``: gateway RSS under a long stream of unique prompts, in both fleet modes.

Target: **every per-prompt cache bounded in bytes: gateway RSS grows < 10 % over 10 minutes of
unique prompts**, from the end of the warm-up (2 min: the caches fill first; each sample also
reads their gauges, so the summary shows when they were full) to the end of the run (12 min).
Per mode a fresh fleet (`bench.soak.fleet`)
gets ``--rate`` requests/s (at most ``--max-requests``, for at most ``--duration-s``), each a
new 200-2,000-word prompt (`bench.soak.prompts`), some multi-turn, some streamed, with a few
output tokens; the gateway's VmRSS is sampled every ``--sample-every-s``. ``--repeat-prompts``
sends a few prompts over and over instead: the control, where no per-prompt state can grow.
``--tracemalloc`` runs the gateway under tracemalloc and reports the allocation sites that grew
from the warm-up to the end (that gateway is slower and larger: its RSS is not the figure);
``--mallinfo`` reports only glibc's heap figures at the same points (no slowdown), and
``--gateway-env`` sets the gateway's environment (glibc's ``MALLOC_*`` tunables).

    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.soak                 # ~25 min
    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.soak --duration-s 60 # smoke
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvloop

from bench.common.fleet_modes import MODE_CHOICES, Mode, key_of, parse_modes
from bench.common.paths import BENCH_DIR, RESULTS_DIR
from bench.common.procstat import busy_cpu_seconds, cpu_seconds
from bench.common.report import machine
from bench.soak.allocations import heap_figures, request_snapshot, top_sites
from bench.soak.drive import DrivePlan, drive
from bench.soak.fleet import MODEL, soak_fleet
from bench.soak.prompts import PromptShape, RepeatedPrompts, UniquePrompts
from bench.soak.report import TARGET_GROWTH_PCT, run_figures, summary_text, write_results


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODE_CHOICES, default="both")
    parser.add_argument("--duration-s", type=float, default=720.0,
                        help="per mode, the warm-up included")
    parser.add_argument("--warmup-s", type=float, default=120.0,
                        help="growth is measured from this sample on (the caches fill first)")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s")
    parser.add_argument("--max-requests", type=int,
                        help="per mode (default rate x duration)")
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=4, help="simulated workers")
    parser.add_argument("--speed-factor", type=float, default=4.0,
                        help="the sims' GPU speed, 1 = an H100 (default 4: the fleet serves "
                        "the default load with room to spare)")
    parser.add_argument("--min-words", type=int, default=200)
    parser.add_argument("--max-words", type=int, default=2000)
    parser.add_argument("--multi-turn-share", type=float, default=0.3)
    parser.add_argument("--stream-share", type=float, default=0.25)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--repeat-prompts", action="store_true",
                        help="control: send --num-repeated prompts over and over")
    parser.add_argument("--num-repeated", type=int, default=8)
    parser.add_argument("--tracemalloc", action="store_true",
                        help="diagnosis: the gateway under tracemalloc; top growing sites")
    parser.add_argument("--tracemalloc-frames", type=int, default=8)
    parser.add_argument("--mallinfo", action="store_true",
                        help="diagnosis: glibc's heap figures at the warm-up, middle and end "
                        "(the gateway started through bench.soak.traced_gateway, untraced)")
    parser.add_argument("--gateway-env", action="append", default=[], metavar="NAME=VALUE",
                        help="add to the gateway's environment, e.g. "
                        "MALLOC_MMAP_THRESHOLD_=131072 (repeatable)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR / "soak")
    return parser


def _checkpoints(args: argparse.Namespace) -> tuple[tuple[float, str], ...]:
    if not (args.tracemalloc or args.mallinfo):
        return ()
    end_s = max(args.warmup_s + 1, args.duration_s - 2 * args.sample_every_s)
    middle_s = (args.warmup_s + end_s) / 2
    return ((args.warmup_s, "warmup"), (middle_s, "middle"), (end_s, "end"))


def run_mode(mode: Mode, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    shape = PromptShape(min_words=args.min_words, max_words=args.max_words,
                        multi_turn_share=args.multi_turn_share, stream_share=args.stream_share,
                        max_tokens=args.max_tokens)
    prompts = RepeatedPrompts(shape, MODEL, args.seed, args.num_repeated) \
        if args.repeat_prompts else UniquePrompts(shape, MODEL, args.seed)
    plan = DrivePlan(rate_per_s=args.rate, duration_s=args.duration_s,
                     max_requests=args.max_requests, sample_every_s=args.sample_every_s,
                     max_in_flight=args.max_in_flight, checkpoints_s=_checkpoints(args))
    traced_dir = workdir / "tracemalloc" if args.tracemalloc or args.mallinfo else None
    gateway_env = dict(item.split("=", 1) for item in args.gateway_env)
    if traced_dir is not None:
        frames = args.tracemalloc_frames if args.tracemalloc else 0
        gateway_env["SOAK_TRACEMALLOC_FRAMES"] = str(frames)
    with soak_fleet(mode, workdir, args.workers, speed_factor=args.speed_factor,
                    traced_dir=traced_dir, gateway_env=gateway_env) as fleet:
        watch = {"gateway": fleet.pids["gateway"], "sim": fleet.pids["sim"]}
        on_checkpoint = (lambda label: request_snapshot(traced_dir, label)) \
            if traced_dir is not None else None
        print(f"[{mode}] fleet up: {fleet.backends['sources']} / "
              f"{fleet.backends['load_sources']}; driving {plan.num_requests:,} requests over "
              f"{plan.duration_s:.0f} s", file=sys.stderr, flush=True)
        cpu_before, busy_before = cpu_seconds(watch["gateway"]), busy_cpu_seconds()
        started = time.monotonic()
        metrics_url = fleet.url.removesuffix("/v1/chat/completions") + "/metrics"
        result = uvloop.run(drive(fleet.url, fleet.api_key, prompts.body, plan, watch,
                                  on_checkpoint, metrics_url))
        elapsed_s = time.monotonic() - started
        gateway_cpu_s = cpu_seconds(watch["gateway"]) - cpu_before
        busy_s = busy_cpu_seconds() - busy_before
        backends = {k: v for k, v in fleet.backends.items() if k != "backends"}
    run: dict[str, Any] = {
        "mode": mode, "prompts": "repeated" if args.repeat_prompts else "unique",
        "gateway_env": gateway_env,
        "fleet": backends, "drive": result.to_json(),
        "figures": run_figures(result, args.warmup_s, args.duration_s),
        "gateway_cpu_s": gateway_cpu_s,
        "machine_busy_cores": (busy_s - gateway_cpu_s) / elapsed_s if elapsed_s else 0.0,
        "workdir": str(workdir),
    }
    if result.checkpoints:
        run["heap"] = {label: heap_figures(answer)
                       for label, answer in result.checkpoints.items()}
    end = result.checkpoints.get("end")
    if end:
        roots = (str(BENCH_DIR.parent), sys.prefix, sys.base_prefix)
        run["top_growth_sites"] = top_sites(end, roots=roots)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bad := [item for item in args.gateway_env if "=" not in item]:
        parser.error(f"--gateway-env takes NAME=VALUE, not {bad[0]!r}")
    modes = parse_modes(args.mode)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kind = "repeated" if args.repeat_prompts else "unique"
    runs: dict[str, Any] = {}
    for mode in modes:
        workdir = args.out_dir / f"soak-{stamp}-{key_of(mode)}-fleet"
        runs[f"{key_of(mode)} ({kind})"] = run_mode(mode, args, workdir)
    document: dict[str, Any] = {
        "config": {"command": " ".join(["python -m bench.soak", *(argv or sys.argv[1:])]),
                   "date": time.strftime("%Y-%m-%d %H:%M:%S"), "modes": list(modes),
                   "prompts": kind, "duration_s": args.duration_s, "warmup_s": args.warmup_s,
                   "rate_per_s": args.rate, "target_growth_pct": TARGET_GROWTH_PCT,
                   "shape": asdict(PromptShape(args.min_words, args.max_words,
                                               args.multi_turn_share, args.stream_share,
                                               args.max_tokens)),
                   "settings": {k: str(v) for k, v in vars(args).items()},
                   "machine": machine()},
        "runs": runs,
    }
    summary = summary_text(document)
    json_path, text_path = write_results(args.out_dir, document, summary)
    print(summary)
    print(f"results in {json_path} and {text_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
