"""How big each measurement is: the full CPU run, the CUDA run, and the ``--quick`` smoke run.

The CPU settings keep the whole benchmark near 8 minutes on 2 shared cores; the CUDA ones
take the sweep to batch 256 and longer calibration contexts; quick ones take seconds on the
tiny random model and only prove the code paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.worker.sweep import SweepSettings


@dataclass(frozen=True, slots=True)
class BenchSettings:
    sweep: SweepSettings
    # Extra (batch, prompt tokens) runs whose steps feed only the calibration fit: long
    # contexts separate the per-KV-token cost from the per-sequence one.
    calibration_runs: tuple[tuple[int, int], ...]
    prefix_prompt_tokens: int = 1024
    prefix_suffix_tokens: int = 24
    prefix_repeats: int = 5
    capacity_budget_gib: float = 1.0
    capacity_sequence_tokens: int = 2048
    quality: dict[str, int] = field(default_factory=dict)  # measure_quality's sizes
    latency_limits_ms: tuple[float, ...] = (50.0, 100.0)


CPU = BenchSettings(
    sweep=SweepSettings(batch_sizes=(1, 2, 4, 8, 16, 32, 64), prompt_tokens=128,
                        warmup_steps=2, measured_steps=10, max_batched_tokens=512, passes=3,
                        time_budget_s=240.0),
    calibration_runs=((4, 1024),),
    prefix_repeats=5,
    quality={"segment_tokens": 512, "max_segments": 8, "prefill_tokens": 64,
             "chunk_tokens": 64, "num_prompts": 20, "num_new_tokens": 64},
)

CUDA = BenchSettings(
    sweep=SweepSettings(batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128, 256), prompt_tokens=256,
                        warmup_steps=3, measured_steps=16, max_batched_tokens=2048,
                        passes=2, time_budget_s=100.0),
    calibration_runs=((16, 2048), (64, 1024)),
    prefix_repeats=7,
    quality={"segment_tokens": 512, "max_segments": 11, "prefill_tokens": 64,
             "chunk_tokens": 64, "num_prompts": 20, "num_new_tokens": 64},
)

QUICK = BenchSettings(
    sweep=SweepSettings(batch_sizes=(1, 2, 4), prompt_tokens=32, warmup_steps=1,
                        measured_steps=2, max_batched_tokens=64, passes=2,
                        time_budget_s=30.0),
    calibration_runs=((2, 96),),
    prefix_prompt_tokens=128,
    prefix_suffix_tokens=8,
    prefix_repeats=2,
    quality={"segment_tokens": 64, "max_segments": 2, "prefill_tokens": 16,
             "chunk_tokens": 16, "num_prompts": 3, "num_new_tokens": 8},
)
