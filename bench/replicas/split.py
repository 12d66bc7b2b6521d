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

Pooled over every JSON given (runs of one invocation are repeats, as in
``bench.replicas.pool``), each part's p50 / p90 / p99 over the hits sent after the warm-up, and
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
from bench.replicas.misses import log_lines
from bench.replicas.pool import REFERENCE, is_counted
from bench.routing.figures import is_miss

PARTS = ("client", "engine", "gateway", "outside")
QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def parts_of(record: Mapping[str, Any], line: Mapping[str, Any] | None) -> dict[str, float] | None:
    """A request's TTFT split into ``PARTS`` (seconds); None without a logged line or TTFT."""
    if line is None or record["ttft_s"] is None or line.get("ttft_s") is None:
        return None
    waits = line.get("waits") or {}
    if "upstream_ttft" not in waits:
        return None
    engine_s = waits["upstream_ttft"] + waits.get("upstream_connect", 0.0)
    return {"client": record["ttft_s"], "engine": engine_s,
            "gateway": line["ttft_s"] - engine_s, "outside": record["ttft_s"] - line["ttft_s"]}


def hit_parts(paths: Iterable[Path]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(mode, run label) -> part -> the pooled hits' seconds."""
    pooled: dict[tuple[str, str], dict[str, list[float]]] = {}
    for path in paths:
        result = json.loads(path.read_text())
        warmup_s = float(result["config"]["warmup_s"])
        fleet_dir = path.with_name(path.stem + "-fleet")
        for mode in result.get("modes", []):
            runs = (result.get(mode.replace("-", "_"), result.get(mode)) or {}).get("runs", {})
            for label, run in runs.items():
                lines = log_lines(fleet_dir / f"{mode}-{label.replace(' ', '-')}")
                columns = pooled.setdefault((mode, label), {part: [] for part in PARTS})
                for record in run.get("records") or []:
                    ideal = record.get("ideal_cached_tokens")
                    if (not is_counted(record, warmup_s) or ideal is None
                            or is_miss(record["num_cached_tokens"] or 0, ideal)):
                        continue
                    parts = parts_of(record, lines.get(record["index"]))
                    if parts is not None:
                        for part, seconds in parts.items():
                            columns[part].append(seconds)
    return pooled


def table(pooled: Mapping[tuple[str, str], Mapping[str, list[float]]]) -> list[str]:
    """One row per mode and run: each part's percentiles (ms) and ratios to one replica."""
    header = f"{'mode':<12} {'N':<8} {'hits':>6}  " + "  ".join(
        f"{part + ' ' + name:>15}" for part in PARTS for name, _ in QUANTILES)
    rows = [header]
    for (mode, label), columns in sorted(pooled.items()):
        reference = pooled.get((mode, REFERENCE))
        cells = []
        for part in PARTS:
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
    try:
        pooled = hit_parts(args.results)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cannot read the results: {exc}", file=sys.stderr)
        return 2
    if not any(columns["client"] for columns in pooled.values()):
        print("no hit has a request-log line with its waits: run the bench with "
              "--set request_log.mode=all", file=sys.stderr)
        return 1
    print("\n".join(table(pooled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
