"""Write a synthetic trace in the Azure LLM inference trace format (the shipped sample).

The distributions imitate the published Azure conversation trace (2023): log-normal context
lengths (median ~1,000 tokens, long right tail), log-normal output lengths (median ~130),
and bursty arrivals (gamma gaps, CV 2) around a slowly drifting rate. Example::

    python -m bench.run.tracegen --rows 500 --rate 4 --out bench/traces/azure-conv-sample.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from datetime import datetime, timedelta
from pathlib import Path

from bench.run.arrivals import gap_s

START = datetime(2023, 11, 16, 18, 0, 0)


def synthesize(num_rows: int, rate_per_s: float, seed: int) -> list[tuple[str, int, int]]:
    """``(TIMESTAMP, ContextTokens, GeneratedTokens)`` rows."""
    rng = random.Random(seed)
    rows: list[tuple[str, int, int]] = []
    offset_s = 0.0
    for _ in range(num_rows):
        # The rate drifts by +-50% over a ~60 s cycle, as real traffic does over minutes.
        rate = rate_per_s * (1.0 + 0.5 * math.sin(2 * math.pi * offset_s / 60.0))
        offset_s += gap_s(rate, "gamma", 2.0, rng)
        context = int(min(7000, max(8, rng.lognormvariate(math.log(1000), 0.85))))
        generated = int(min(1500, max(1, rng.lognormvariate(math.log(130), 0.9))))
        stamp = (START + timedelta(seconds=offset_s)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        rows.append((stamp, context, generated))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Write the trace CSV."""
    parser = argparse.ArgumentParser(prog="python -m bench.run.tracegen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--rate", type=float, default=4.0, help="mean requests/s")
    parser.add_argument("--seed", type=int, default=2023)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    with args.out.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(synthesize(args.rows, args.rate, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
