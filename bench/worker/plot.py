"""The batch sweep's plot: decode throughput and per-token latency against batch size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.worker.sweep import BatchPoint


def plot_sweep(points: Sequence[BatchPoint], path: Path, *, title: str,
               latency_limits_ms: Sequence[float] = (50.0, 100.0)) -> Path:
    """Throughput (left axis) and latency (right axis: median, bars over the passes; the
    limits dashed) against batch size on a log2 axis."""
    batches = [p.batch_size for p in points]
    figure, throughput_axis = plt.subplots(figsize=(7.5, 4.5))
    throughput_axis.plot(batches, [p.decode_tokens_per_s for p in points], "o-",
                         color="tab:blue", label="decode tokens/s")
    throughput_axis.set_xscale("log", base=2)
    throughput_axis.set_xticks(batches, [str(b) for b in batches])
    throughput_axis.set_xlabel("batch size (sequences decoding together)")
    throughput_axis.set_ylabel("decode tokens/s", color="tab:blue")
    latency_axis = throughput_axis.twinx()
    latency_axis.errorbar(
        batches, [p.decode_step_ms for p in points], fmt="s-", color="tab:red", capsize=3,
        yerr=[[p.decode_step_ms - p.decode_step_ms_min for p in points],
              [p.decode_step_ms_max - p.decode_step_ms for p in points]],
        label="per-token latency (ms)")
    for limit in latency_limits_ms:
        latency_axis.axhline(limit, color="tab:red", linestyle="--", linewidth=0.8, alpha=0.6)
        latency_axis.annotate(f"{limit:g} ms", (batches[0], limit), color="tab:red",
                              fontsize=8, va="bottom")
    latency_axis.set_ylabel("per-token latency, ms (median decode step)", color="tab:red")
    throughput_axis.set_title(title, fontsize=10)
    throughput_axis.grid(True, alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
