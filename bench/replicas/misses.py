"""Why each cache miss of a ``bench.replicas`` run missed, from its gateways' request logs.

Run the bench with ``--set request_log.mode=all``: each gateway then writes a JSON line per
request to its log (``<out>-fleet/<mode>-<N>/gateway-*.log``) with what routing expected the
chosen backend to hold (``expected_cached_tokens``) and the most any backend held by its prefix
index (``best_cached_tokens``), and the bench sends each request's index as its
``x-request-id``, which joins the lines to the run's records. A miss (under half the cached
tokens an ideal router would have given, `bench.routing.figures.is_miss`) is then

- **nowhere**: the index knew no backend holding half of that (evicted everywhere);
- **sent away**: it knew a holder of over twice what it expected where it sent the request
  (a holder passed over for its load);
- **evicted**: it expected the chosen backend to hold it, and the backend had evicted it
  (the index had not heard yet, or believed a stale claim);
- **unlogged**: no line for it (the bench ran without the request log).

    .venv/bin/python -m bench.replicas.misses bench/results/replicas-why-1.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from bench.routing.figures import is_miss

ID_PREFIX = "bench-"


def indexed_lines(text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON lines of a log ``text`` whose ``request_id`` is a bench request's, with its
    index; other lines are skipped."""
    for row in text.splitlines():
        if not row.startswith("{") or ID_PREFIX not in row:
            continue
        try:
            line = json.loads(row)
        except ValueError:
            continue
        request_id = line.get("request_id") or ""
        if request_id.startswith(ID_PREFIX) and request_id[len(ID_PREFIX):].isdigit():
            yield int(request_id[len(ID_PREFIX):]), line


def log_lines(run_dir: Path) -> dict[int, dict[str, Any]]:
    """The request-log lines of a run's gateways, by request index."""
    lines: dict[int, dict[str, Any]] = {}
    for path in sorted(run_dir.glob("gateway-*.log")):
        for index, line in indexed_lines(path.read_text(errors="replace")):
            lines[index] = line | {"gateway": path.stem}
    return lines


def classify(ideal: int, line: Mapping[str, Any] | None) -> str:
    """Why a miss with ``ideal`` cached tokens missed, by its request-log ``line``."""
    if line is None or line.get("expected_cached_tokens") is None:
        return "unlogged"
    expected, best = line["expected_cached_tokens"], line["best_cached_tokens"]
    if best < 0.5 * ideal:
        return "nowhere"
    if expected < 0.5 * best:
        return "sent away"
    return "evicted"


def claim_of(line: Mapping[str, Any]) -> str:
    """The approximate claim the request was sent on, as its line tells it (route_detail):
    its age and the claim lifetime then; empty without one."""
    age = line.get("claim_age_s")
    return "" if age is None else f"  (claim {age:.1f} s old, lifetime {line['claim_ttl_s']:.1f} s)"


def runs_of(result: Mapping[str, Any], fleet_dir: Path
            ) -> Iterator[tuple[str, str, Mapping[str, Any], Path]]:
    """Each run of a bench.replicas result: its mode, label, figures and fleet folder (where
    its gateways' and engines' logs are)."""
    for mode in result.get("modes", []):
        runs = (result.get(mode.replace("-", "_"), result.get(mode)) or {}).get("runs", {})
        for label, run in runs.items():
            yield mode, label, run, fleet_dir / f"{mode}-{label.replace(' ', '-')}"


def misses(result: Mapping[str, Any], fleet_dir: Path
           ) -> Iterator[tuple[str, str, Counter[str], list[str]]]:
    """Per mode and run: the misses after the warm-up, counted by kind, and one line each."""
    warmup_s = float(result["config"]["warmup_s"])
    for mode, label, run, run_dir in runs_of(result, fleet_dir):
        lines = log_lines(run_dir)
        kinds: Counter[str] = Counter()
        rows = []
        for r in run.get("records") or []:
            ideal = r.get("ideal_cached_tokens")
            if (r["sent_at_s"] < warmup_s or r["ttft_s"] is None or ideal is None
                    or not is_miss(r["num_cached_tokens"] or 0, ideal)):
                continue
            line = lines.get(r["index"])
            kind = classify(ideal, line)
            kinds[kind] += 1
            seen = line or {}
            rows.append(
                f"  {r['sent_at_s']:6.2f} s  group {r['group']:>2}  {r['worker']}  "
                f"{seen.get('gateway', '?')}  prompt {r['num_prompt_tokens']}  ideal {ideal}"
                f"  best {seen.get('best_cached_tokens')}  expected "
                f"{seen.get('expected_cached_tokens')}  cached {r['num_cached_tokens']}  "
                f"TTFT {r['ttft_s'] * 1000:.0f} ms  {kind}{claim_of(seen)}")
        yield mode, label, kinds, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas.misses", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="bench.replicas JSON files")
    args = parser.parse_args(argv)
    for path in args.results:
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"cannot read {path}: {exc}", file=sys.stderr)
            return 2
        print(path)
        for mode, label, kinds, rows in misses(result, path.with_name(path.stem + "-fleet")):
            print(f"{mode} N={label}: {sum(kinds.values())} misses, "
                  f"{', '.join(f'{n} {kind}' for kind, n in kinds.most_common()) or 'none'}")
            print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
