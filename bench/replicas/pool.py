"""Pool the requests of several ``bench.replicas`` invocations, per mode and replica count.

One run sends about 1,000 requests after its warm-up, so its TTFT p99 is about the tenth
slowest. Under the bench's KV pressure some 0.1-1 % of the requests miss the prefix cache
(an eviction, or a spill off a busy holder) and take 4-5 times a hit's TTFT, so a run's p99 is
either a slow hit or a miss, depending on whether that run had ten misses: the same set-up run
twice gives p99 ratios from 0.5 to 3 (``docs/benchmarks/replicas.md``). Pooling K runs' requests
puts the p99 at the 10 K-th slowest of K times as many, where a few misses more or less move it
little. Every run of an invocation starts from a fresh fleet with the same seed, so the pooled
runs are repeats of one experiment.

What is pooled: the answered requests sent after each run's warm-up (`Record.is_ok`), from
``runs`` (``1``, ``2``, ``4``, ``1 again``) of each mode, of every JSON given. Per pool: TTFT
p50 / p90 / p99, the cached share (cached / prompt tokens, over the requests that reported
usage), the misses (under half the cached tokens an ideal router would have given,
`bench.routing.figures.is_miss`) and each figure over the pooled one-replica runs (``1``).

With ``--reference both`` the reference is every one-replica run: ``1`` and ``1 again``
together (row ``1 + 1 again``). An invocation runs one replica first and again last, with the
N-replica runs between, so the pair brackets them in time (a machine that slows or speeds up
over the invocation moves both sides alike), and it holds twice the requests: the single ``1``
is itself some 5-14 % off the pair at p99 over eight runs (``docs/benchmarks/replicas.md``),
more than the 5 % the verdict judges. ``1`` and ``1 again`` then get ratios too, which show how
far one run of the reference is from the pair.

With ``--max-others-cores C`` an invocation's mode is left out whole when any of its runs
had other processes on the machine (not the bench's) using more than ``C`` cores over its
window (``others_cores``): the shared machine's other work slows every process of that run,
and one such run moves its pool by more than the 5 % judged. Left out whole, so what is
pooled stays each invocation's runs side by side; the left-out ones are named.

    .venv/bin/python -m bench.replicas.pool bench/results/replicas-final-{1,2,3}.json
    .venv/bin/python -m bench.replicas.pool --reference both --max-others-cores 0.05 F...
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.common.stats import percentile
from bench.replicas.figures import RATIO_TOLERANCE
from bench.routing.figures import is_miss

REFERENCE = "1"
REPEAT = "1 again"  # bench.replicas.bench.REPEAT_LABEL
BOTH = "1 + 1 again"  # the reference of ``reference="both"``: every one-replica run


def is_counted(record: Mapping[str, Any], warmup_s: float) -> bool:
    return (record["status"] == 200 and not record["error"]
            and record["sent_at_s"] >= warmup_s)


def pool_figures(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of one pool of counted records."""
    ttfts = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    with_usage = [r for r in records if r["num_cached_tokens"] is not None
                  and r["num_prompt_tokens"]]
    num_prompt = sum(r["num_prompt_tokens"] for r in with_usage)
    judged = [r for r in records if r["ideal_cached_tokens"] is not None]
    return {
        "num_requests": len(records),
        "ttft_ms": {name: percentile(ttfts, q) * 1000 if ttfts else math.nan
                    for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "cached_fraction": (sum(r["num_cached_tokens"] for r in with_usage) / num_prompt
                            if num_prompt else math.nan),
        "num_missed": sum(is_miss(r["num_cached_tokens"] or 0, r["ideal_cached_tokens"])
                          for r in judged),
    }


def undisturbed(documents: Sequence[Mapping[str, Any]], max_others_cores: float,
                names: Sequence[str] | None = None
                ) -> tuple[list[Mapping[str, Any]], list[str]]:
    """``documents`` without the modes where a run's ``others_cores`` exceeded
    ``max_others_cores``, and a line naming each mode left out (by ``names``, else by the
    document's position)."""
    kept: list[Mapping[str, Any]] = []
    left_out: list[str] = []
    for index, document in enumerate(documents):
        modes = []
        for mode in document.get("modes", []):
            runs = (document.get(mode.replace("-", "_"), document.get(mode)) or {}).get(
                "runs", {})
            busiest = max(((float(run.get("others_cores") or 0.0), label)
                           for label, run in runs.items()), default=(0.0, ""))
            if busiest[0] > max_others_cores:
                name = names[index] if names is not None else f"#{index + 1}"
                left_out.append(f"{name} {mode}: left out, other work took "
                                f"{busiest[0]:.2f} cores during its N={busiest[1]} run")
            else:
                modes.append(mode)
        if modes:
            kept.append({**document, "modes": modes})
    return kept, left_out


def pool(documents: Iterable[Mapping[str, Any]], reference: str = "first"
         ) -> dict[str, dict[str, Any]]:
    """Mode -> label -> the pooled figures, the runs pooled and the ratios to ``1`` (with
    ``reference="both"``: to ``1`` and ``1 again`` pooled, as the row ``BOTH``)."""
    pooled: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
    num_runs: dict[tuple[str, str], int] = {}
    for document in documents:
        warmup_s = float(document["config"]["warmup_s"])
        for mode in document.get("modes", []):
            results = document.get(mode.replace("-", "_"), document.get(mode)) or {}
            for label, run in results.get("runs", {}).items():
                records = run.get("records")
                if records is None:
                    raise ValueError(f"{mode} N={label} holds no request records: pool "
                                     f"the JSON of a bench.replicas that keeps them")
                counted = [r for r in records if is_counted(r, warmup_s)]
                pooled.setdefault(mode, {}).setdefault(label, []).extend(counted)
                num_runs[mode, label] = num_runs.get((mode, label), 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for mode, by_label in pooled.items():
        figures = {label: pool_figures(records) | {"num_runs": num_runs[mode, label]}
                   for label, records in by_label.items()}
        base = figures.get(REFERENCE)
        if reference == "both" and REFERENCE in by_label and REPEAT in by_label:
            base = figures[BOTH] = pool_figures(by_label[REFERENCE] + by_label[REPEAT]) | {
                "num_runs": num_runs[mode, REFERENCE] + num_runs[mode, REPEAT]}
        for row in figures.values():
            if base is not None:
                row["ratio"] = {
                    "ttft_p90_ms": row["ttft_ms"]["p90"] / base["ttft_ms"]["p90"],
                    "ttft_p99_ms": row["ttft_ms"]["p99"] / base["ttft_ms"]["p99"],
                    "cached_fraction": row["cached_fraction"] / base["cached_fraction"]}
        out[mode] = figures
    return out


def _order(label: str) -> tuple[int, str]:
    return (int(label), "") if label.isdigit() else (1, label)


def pool_markdown(pooled: Mapping[str, Mapping[str, Any]]) -> str:
    is_both = any(BOTH in figures for figures in pooled.values())
    over = "N=1 (both)" if is_both else "N=1"
    lines = [f"| mode | N | runs | requests | TTFT p50 / p90 / p99 (ms) | p90 / {over} "
             f"| p99 / {over} | cached / {over} | missed | verdict |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for mode, figures in pooled.items():
        for label in sorted(figures, key=_order):
            row = figures[label]
            ttft, ratio = row["ttft_ms"], row.get("ratio", {})
            judged = label.isdigit() and label != REFERENCE and ratio
            verdict = ""
            if judged:
                is_met = (ratio["ttft_p90_ms"] <= 1 + RATIO_TOLERANCE
                          and ratio["ttft_p99_ms"] <= 1 + RATIO_TOLERANCE
                          and ratio["cached_fraction"] >= 1 - RATIO_TOLERANCE)
                verdict = "PASS" if is_met else "FAIL"
            lines.append(
                f"| {mode} | {label} | {row['num_runs']} | {row['num_requests']:,} | "
                f"{ttft['p50']:.0f} / {ttft['p90']:.0f} / {ttft['p99']:.0f} | "
                f"{ratio.get('ttft_p90_ms', math.nan):.3f} | "
                f"{ratio.get('ttft_p99_ms', math.nan):.3f} | "
                f"{ratio.get('cached_fraction', math.nan):.3f} | {row['num_missed']} | "
                f"{verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas.pool", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="bench.replicas JSON files")
    parser.add_argument("--out", type=Path, help="also write the pooled figures as JSON")
    parser.add_argument("--reference", choices=("first", "both"), default="first",
                        help="set the figures over the first one-replica runs (1), or over "
                             "those and the runs of one replica again together (1 + 1 again)")
    parser.add_argument("--max-others-cores", type=float, default=None, metavar="C",
                        help="leave out an invocation's mode whose runs had other processes "
                             "on the machine using more than C cores (e.g. 0.05)")
    args = parser.parse_args(argv)
    try:
        documents = [json.loads(path.read_text()) for path in args.results]
        if args.max_others_cores is not None:
            documents, left_out = undisturbed(documents, args.max_others_cores,
                                              [str(path) for path in args.results])
            for line in left_out:
                print(line)
        pooled = pool(documents, args.reference)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot pool {', '.join(map(str, args.results))}: {exc!r}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(json.dumps(pooled, indent=1))
    print(pool_markdown(pooled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
