"""Run the worker benchmark's sections in order and collect one results document.

Each section records its wall time and how busy the rest of the machine was meanwhile
(``others_cores_busy``: cores used by other processes, from /proc/stat), because the CPU
figures are only as good as the machine was quiet.

Example::

    results = run_benchmark(model, tokenizer, CPU, sections=SECTIONS, results_dir=Path("out"),
                            stamp="20261130-120000", labels={...})
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from backends.tokenizer import Tokenizer
from backends.worker.kv_cache import kv_dtype_name
from backends.worker.model import LlamaModel
from bench.common.procstat import busy_cpu_seconds, cpu_seconds
from bench.worker.calibration import fit_latency_model, write_calibration
from bench.worker.capacity import measure_capacity
from bench.worker.plot import plot_sweep
from bench.worker.prefix import measure_prefix
from bench.worker.quality import measure_quality
from bench.worker.settings import BenchSettings
from bench.worker.steps import StepSample
from bench.worker.sweep import best_under_limit, run_batch, run_sweep

SECTIONS = ("sweep", "prefix", "capacity", "quality")  # calibration comes with the sweep


def run_benchmark(model: LlamaModel, tokenizer: Tokenizer, settings: BenchSettings, *,
                  sections: Sequence[str], results_dir: Path, stamp: str,
                  labels: dict[str, Any], progress: Callable[[str], None] = print,
                  ) -> dict[str, Any]:
    results: dict[str, Any] = {**labels, "sections": list(sections), "load": {}}
    device = labels["device"]
    for section in sections:
        progress(f"== {section}")
        meter = _LoadMeter()
        if section == "sweep":
            results |= _sweep(model, tokenizer, settings, results_dir, stamp, labels, progress)
        elif section == "prefix":
            results["prefix"] = measure_prefix(
                model, tokenizer, prompt_tokens=settings.prefix_prompt_tokens,
                suffix_tokens=settings.prefix_suffix_tokens, repeats=settings.prefix_repeats,
                max_batched_tokens=settings.sweep.max_batched_tokens).to_json()
        elif section == "capacity":
            results["capacity"] = measure_capacity(
                model.config, budget_gib=settings.capacity_budget_gib,
                sequence_tokens=settings.capacity_sequence_tokens)
        elif section == "quality":
            baseline = "bfloat16"  # the 16-bit KV the engine uses on CUDA
            results["quality"] = measure_quality(model, tokenizer, baseline=baseline,
                                                 **settings.quality)
        else:
            raise ValueError(f"unknown section {section!r}; choose from {', '.join(SECTIONS)}")
        results["load"][section] = meter.read()
        progress(f"   {section}: {results['load'][section]['wall_s']:.0f} s, others kept "
                 f"{results['load'][section]['others_cores_busy']:.2f} cores busy "
                 f"({device})")
    return results


def _sweep(model: LlamaModel, tokenizer: Tokenizer, settings: BenchSettings, results_dir: Path,
           stamp: str, labels: dict[str, Any], progress: Callable[[str], None],
           ) -> dict[str, Any]:
    sweep = settings.sweep
    points, samples, stopped = run_sweep(model, tokenizer, sweep, progress=progress)
    calibration_samples: list[StepSample] = list(samples)
    context_points = []
    for batch_size, prompt_tokens in settings.calibration_runs:
        context_settings = dataclasses.replace(sweep, prompt_tokens=prompt_tokens)
        point, extra = run_batch(model, tokenizer, batch_size, context_settings, seed=1)
        context_points.append(point.to_json())
        calibration_samples.extend(extra)
        progress(f"  calibration run, batch {batch_size} at {prompt_tokens} tokens: "
                 f"{point.decode_step_ms:.1f} ms/token")
    device = labels["device"]
    plot_path = plot_sweep(points, results_dir / f"worker-{device}-{stamp}-sweep.png",
                           title=f"{labels['model']} on {labels['device_name']}, "
                                 f"{sweep.prompt_tokens}-token prompts, KV {labels['dtype']}",
                           latency_limits_ms=settings.latency_limits_ms)
    fit = fit_latency_model(calibration_samples)
    calibration_path = results_dir / f"worker-calibration-{device}-{stamp}.json"
    calibration = write_calibration(calibration_path, fit, device=labels["device_name"],
                                    model=labels["model"],
                                    kv_dtype=kv_dtype_name(model.dtype))
    return {
        "sweep": {
            "prompt_tokens": sweep.prompt_tokens, "kv_dtype": kv_dtype_name(model.dtype),
            "measured_steps": sweep.measured_steps, "passes": sweep.passes,
            "max_batched_tokens": sweep.max_batched_tokens, "stopped": stopped,
            "points": [p.to_json() for p in points],
            "best_under_limit": {
                f"{limit:g}": (None if (best := best_under_limit(points, limit)) is None
                               else best.to_json())
                for limit in settings.latency_limits_ms},
            "calibration_runs": context_points,
            "plot": str(plot_path),
        },
        "calibration": {**calibration, "path": str(calibration_path)},
        "step_samples": [s.to_json() for s in calibration_samples],
    }


class _LoadMeter:
    """Wall time of a section, and the cores other processes kept busy during it."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._busy = busy_cpu_seconds()
        self._own = cpu_seconds(os.getpid())
        self._loadavg = os.getloadavg()[0]

    def read(self) -> dict[str, float]:
        wall_s = time.perf_counter() - self._start
        others_s = (busy_cpu_seconds() - self._busy) - (cpu_seconds(os.getpid()) - self._own)
        return {"wall_s": wall_s, "others_cores_busy": max(others_s, 0.0) / wall_s,
                "loadavg_1m_start": self._loadavg, "loadavg_1m_end": os.getloadavg()[0]}
