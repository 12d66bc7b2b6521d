"""`switchyard bench run` (also ``python -m bench.run``): drive load at an OpenAI-compatible
endpoint on this machine and report latency, throughput, goodput and cache use per tier.

Examples::

    switchyard bench run --url http://127.0.0.1:8080/v1 --admin-token T \\
        --tenants interactive:4,standard:16,batch:4 --workload shared-prefix --rate 20 \\
        --duration 30 --out bench/results/run-X
    switchyard bench run --fleet sim:4 --tenants interactive:4,standard:16,batch:4 \\
        --rate 5,10,20 --arrivals gamma --cv 2 --duration 90
    switchyard bench run --url http://127.0.0.1:9000/v1 --workload fixed --mode closed \\
        --concurrency 64 --duration 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.run.arrivals import PROCESSES
from bench.run.options import OptionError
from bench.run.workloads import WORKLOADS, TokenRange


def _tokens(text: str) -> TokenRange:
    try:
        return TokenRange.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The options of ``switchyard bench run``."""
    parser = argparse.ArgumentParser(prog="switchyard bench run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_argument_group("target (loopback only)")
    target.add_argument("--url", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1")
    target.add_argument("--fleet", metavar="sim:N|mock:N",
                        help="start redis, N engines and a gateway for this run, then stop them")
    target.add_argument("--fleet-tokenizer", choices=("approx", "real"), default="approx")
    target.add_argument("--model", help="model to ask for (default: the first in /v1/models)")
    target.add_argument("--worker-metrics", action="append", default=[], metavar="URL",
                        help="a worker's /metrics, read before and after (repeatable)")
    tenancy = parser.add_argument_group("tenants and keys")
    tenancy.add_argument("--tenants", default="standard:1",
                         help="tenant mix TIER:COUNT,..., e.g. interactive:4,standard:16,batch:4")
    tenancy.add_argument("--admin-token", help="make the tenants and keys through the admin API")
    tenancy.add_argument("--keys-file", type=Path, help="JSON [{tenant, tier, key}] to use")
    tenancy.add_argument("--save-keys", type=Path, metavar="FILE",
                         help="with --admin-token: save the keys made (mode 0600) for a later "
                         "--keys-file; results never hold keys")
    tenancy.add_argument("--api-key", help="one key for every tenant")
    tenancy.add_argument("--slo", action="append", default=[], metavar="TIER=TTFT_S[:TPOT_S]",
                         help="SLO per tier (defaults: interactive 0.5, standard 2, batch 60)")
    load = parser.add_argument_group("load")
    load.add_argument("--mode", choices=("open", "closed"), default="open")
    load.add_argument("--rate", default="10", help="open loop: req/s, or a sweep 5,10,20")
    load.add_argument("--arrivals", choices=(*PROCESSES, "trace"),
                      help="arrival process (default poisson; the trace workload: its own)")
    load.add_argument("--cv", type=float, default=2.0, help="gamma arrivals: burstiness (CV)")
    load.add_argument("--concurrency", type=int, default=16, help="closed loop: in flight")
    load.add_argument("--duration", type=float, default=60.0,
                      help="hard stop, seconds; in-flight requests are cut off then")
    load.add_argument("--drain", type=float,
                      help="no new requests in the last S seconds (default 20%%, at most 10)")
    load.add_argument("--max-requests", type=int, default=100_000)
    load.add_argument("--seed", type=int, default=1)
    shape = parser.add_argument_group("workload")
    shape.add_argument("--workload", choices=sorted(WORKLOADS), default="shared-prefix")
    shape.add_argument("--no-stream", action="store_true", help="ask for whole responses")
    shape.add_argument("--groups", type=int, help="shared-prefix: system prompts")
    shape.add_argument("--system-tokens", type=_tokens, default=TokenRange(1500, 3000))
    shape.add_argument("--question-tokens", type=_tokens, default=TokenRange(50, 200))
    shape.add_argument("--max-tokens", type=_tokens, default=TokenRange(32, 128))
    shape.add_argument("--zipf", type=float, default=1.1, help="popularity exponent")
    shape.add_argument("--conversations", type=int, default=16, help="multi-turn: at once")
    shape.add_argument("--turns", type=_tokens, default=TokenRange(2, 6))
    shape.add_argument("--docs", type=int, default=4, help="long-doc: documents")
    shape.add_argument("--doc-tokens", type=_tokens, default=TokenRange(4000, 6000))
    shape.add_argument("--trace", type=Path, help="trace workload: CSV (default: the sample)")
    shape.add_argument("--time-scale", type=float, default=1.0, help="trace: 2 = twice as fast")
    shape.add_argument("--max-context", type=int, default=8000, help="trace: clip rows to fit")
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, help="results directory (default bench/results/run-TIME)")
    out.add_argument("--no-progress", action="store_true")
    out.add_argument("--no-plots", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one experiment; 0 if any request succeeded, 1 if none did, 2 for a bad option."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:  # `switchyard bench run ...`; run is the only bench command so far
        argv = argv[1:]
    args = build_parser().parse_args(argv)
    from bench.run.runner import run_experiment  # loads aiohttp and matplotlib: not for --help

    try:
        return run_experiment(args, argv)
    except OptionError as exc:
        print(f"switchyard bench run: {exc}", file=sys.stderr)
        return 2
