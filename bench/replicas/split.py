"""Where the cache hits' TTFT went, per mode and replica count, from the gateways' request logs.

Run the bench with ``--set request_log.mode=all`` (as for ``bench.replicas.misses``): each
gateway's line for a request then holds its ``ttft_s`` (from the request's arrival at the
gateway to its first byte out) and its ``waits``, of which ``upstream_connect`` and
``upstream_ttft`` are the engine's part (connecting, queueing, prefill). A hit's TTFT as the
client saw it (the run's record) so splits into

- **engine**: ``upstream_connect`` + ``upstream_ttft``;
- **gateway**: the gateway's ``ttft_s`` less the engine's part (parsing, auth, quota,
  admission, routing, the proxying of the first byte);
- **outside**: the record's TTFT less the gateway's ``ttft_s`` (the front, the client, the
  loopback between them).

With ``--engine-log`` too, the simulated engines' own lines (``backends.sim --request-log``)
split the engine's part further, in the engines' modelled time (which the machine's load does
not stretch): **queue** (arrival to its first step) and **prefill** (to its first token). A
hit's prefill is long when its step also prefills another request's many uncached tokens, so
each run also counts its **big prefills** (at least ``BIG_PREFILL_TOKENS`` uncached, after the
warm-up: cache misses and new prompts) and the hits that arrived on the same engine while one
ran; those hits make much of a run's p99.

Pooled over every JSON given (runs of one invocation are repeats, as in
``bench.replicas.pool``), each part's p50 / p90 / p99 over the hits sent after the warm-up
(requests an ideal router would have served partly from cache, that were no miss), and
its ratio to the one-replica runs (``1``) of the same mode. A part whose ratio stands out is
where N replicas lose time: the engine's (the replicas' view of the queues) or the gateway's
and the front's (CPU).

    .venv/bin/python -m bench.replicas.split bench/results/replicas-split-{1,2,3}.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.common.stats import percentile
from bench.replicas.misses import indexed_lines, log_lines, runs_of
from bench.replicas.pool import REFERENCE, is_counted
from bench.routing.figures import is_miss
from bench.routing.fleet import ENGINE_LOG

PARTS = ("client", "engine", "gateway", "outside", "queue", "prefill")
BIG_PREFILL_TOKENS = 512
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def parts_of(record: Mapping[str, Any], line: Mapping[str, Any] | None,
             engine: Mapping[str, Any] | None = None) -> dict[str, float] | None:
    """A request's TTFT split into ``PARTS`` (seconds; ``queue`` and ``prefill`` only with the
    engine's line); None without a logged gateway line or TTFT."""
    if line is None or record["ttft_s"] is None or line.get("ttft_s") is None:
        return None
    waits = line.get("waits") or {}
    if "upstream_ttft" not in waits:
        return None
    engine_s = waits["upstream_ttft"] + waits.get("upstream_connect", 0.0)
    parts = {"client": record["ttft_s"], "engine": engine_s,
             "gateway": line["ttft_s"] - engine_s, "outside": record["ttft_s"] - line["ttft_s"]}
    if engine is not None and engine.get("ttft_s") is not None:
        parts |= {"queue": engine["queue_s"], "prefill": engine["prefill_s"]}
    return parts


def engine_lines(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The simulated engines' request-log lines of a run, by request index."""
    path = run_dir / ENGINE_LOG
    if not path.exists():
        return {}
    return dict(indexed_lines(path.read_text(errors="replace")))


def is_hit(record: Mapping[str, Any]) -> bool:
    """A request an ideal router would have served partly from cache, that was no miss."""
    ideal = record.get("ideal_cached_tokens") or 0
    return ideal > 0 and not is_miss(record["num_cached_tokens"] or 0, ideal)


def crowding(records: Iterable[Mapping[str, Any]], engine: Mapping[int, Mapping[str, Any]],
             warmup_s: float) -> tuple[int, int]:
    """The big prefills sent after the warm-up, and the hits that arrived on the same engine
    while one of them had not had its first token."""
    rows = []
    for record in records:
        line = engine.get(record["index"])
        if line is None or line.get("ttft_s") is None or not is_counted(record, warmup_s):
            continue
        uncached = line["prompt_tokens"] - line["cached_tokens"]
        rows.append((line["worker"], line["arrival_s"], line["arrival_s"] + line["ttft_s"],
                     uncached >= BIG_PREFILL_TOKENS, record))
    bigs = [(worker, start, end) for worker, start, end, is_big, _ in rows if is_big]
    num_crowded = sum(
        1 for worker, arrival_s, _, is_big, record in rows
        if not is_big and is_hit(record)
        and any(w == worker and start < arrival_s < end for w, start, end in bigs))
    return len(bigs), num_crowded


def hit_parts(paths: Iterable[Path], crowds: dict[tuple[str, str], list[int]] | None = None
              ) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(mode, run label) -> part -> the pooled hits' seconds; with ``crowds``, also each run's
    big prefills and crowded hits added up there (``crowding``), where engine logs exist."""
    pooled: dict[tuple[str, str], dict[str, list[float]]] = {}
    for path in paths:
        result = json.loads(path.read_text())
        warmup_s = float(result["config"]["warmup_s"])
        fleet_dir = path.with_name(path.stem + "-fleet")
        for mode, label, run, run_dir in runs_of(result, fleet_dir):
            lines, engine = log_lines(run_dir), engine_lines(run_dir)
            columns = pooled.setdefault((mode, label), {part: [] for part in PARTS})
            records = run.get("records") or []
            if crowds is not None and engine:
                counts = crowds.setdefault((mode, label), [0, 0])
                for i, count in enumerate(crowding(records, engine, warmup_s)):
                    counts[i] += count
            for record in records:
                if not is_counted(record, warmup_s) or not is_hit(record):
                    continue
                parts = parts_of(record, lines.get(record["index"]),
                                 engine.get(record["index"]))
                if parts is not None:
                    for part, seconds in parts.items():
                        columns[part].append(seconds)
    return pooled


def table(pooled: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> list[str]:
    """One row per mode and run: each part's percentiles (ms) and ratios to one replica (the
    engine's queue and prefill only where some run has them)."""
    parts = [part for part in PARTS if any(columns[part] for columns in pooled.values())]
    header = f"{'mode':<12} {'N':<8} {'hits':>6}  " + "  ".join(
        f"{part + ' ' + name:>15}" for part in parts for name, _ in QUANTILES)
    rows = [header]
    for (mode, label), columns in sorted(pooled.items()):
        reference = pooled.get((mode, REFERENCE))
        cells = []
        for part in parts:
            for _, q in QUANTILES:
                values = columns[part]
                if not values:
                    cells.append(f"{'-':>15}")
                    continue
                ms = percentile(values, q) * 1000
                base = (percentile(reference[part], q) * 1000
                        if reference is not None and reference[part] else 0.0)
                ratio = f" {ms / base:5.2f}x" if base > 0 else " " * 7
                cells.append(f"{ms:7.1f}{ratio}")
        rows.append(f"{mode:<12} {label:<8} {len(columns['client']):>6}  " + "  ".join(cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas.split", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="bench.replicas JSON files")
    args = parser.parse_args(argv)
    crowds: dict[tuple[str, str], list[int]] = {}
    try:
        pooled = hit_parts(args.results, crowds)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read the results: {exc}", file=sys.stderr)
        return 2
    if not any(columns["client"] for columns in pooled.values()):
        print("no hit has a request-log line with its waits: run the bench with "
              "--set request_log.mode=all", file=sys.stderr)
        return 1
    print("\n".join(table(pooled)))
    for (mode, label), (num_big, num_crowded) in sorted(crowds.items()):
        print(f"{mode} N={label}: {num_big} big prefills (>= {BIG_PREFILL_TOKENS} uncached "
              f"tokens), {num_crowded} hits arrived on their engine during one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
