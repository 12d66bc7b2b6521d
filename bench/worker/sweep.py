"""The batch sweep: decode throughput and per-token latency against batch size, and prefill
throughput, on the real engine (`LLMEngine`: scheduler, paged KV, sampler).

For each batch size B, B distinct random prompts of ``prompt_tokens`` tokens are prefilled
(chunked under ``max_batched_tokens``), then decoded together; after ``warmup_steps`` full
decode steps, ``measured_steps`` are timed. Per-token latency is the median decode step (every
sequence gets one token per step); decode throughput is B / that; prefill throughput is the
prompt tokens over the time of the steps that only prefilled. Every step is also kept as a
`StepSample` for the calibration fit.

A shared machine stalls a multi-threaded step now and then, so the sweep goes over every batch
size ``passes`` times (interleaved, after one warm-up run) and reports, per batch size, the
median of the passes' medians, with the range of the passes beside it.

Example::

    points, samples = run_sweep(model, tokenizer, SweepSettings(batch_sizes=(1, 2, 4)))
    best_under_limit(points, limit_ms=50.0)     # the fastest batch within 50 ms per token
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from backends.tokenizer import Tokenizer
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from bench.worker.steps import StepClock, StepSample, random_prompts


@dataclass(frozen=True, slots=True)
class SweepSettings:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    prompt_tokens: int = 256
    warmup_steps: int = 2
    measured_steps: int = 8
    max_batched_tokens: int = 512
    kv_dtype: str | None = None  # None: the model's dtype
    block_size: int = 16
    passes: int = 1
    time_budget_s: float = 300.0  # no new pass or batch size once the sweep has taken this long


@dataclass(frozen=True, slots=True)
class BatchPoint:
    """One batch size's figures."""

    batch_size: int
    prompt_tokens: int
    decode_step_ms: float  # median: the per-token latency
    decode_step_ms_min: float  # over the passes' medians (one pass: its fastest step)
    decode_step_ms_max: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    num_decode_steps: int
    num_passes: int = 1

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def run_batch(model: LlamaModel, tokenizer: Tokenizer, batch_size: int,
              settings: SweepSettings, *, seed: int = 0) -> tuple[BatchPoint, list[StepSample]]:
    """Prefill and decode ``batch_size`` sequences together; see the module docstring."""
    num_decode_steps = settings.warmup_steps + settings.measured_steps
    # Sequences whose prefill ends first decode while the rest prefill: they must last until
    # all of them decode together, then for the timed steps (the run stops there).
    num_prefill_steps = -(-batch_size * settings.prompt_tokens // settings.max_batched_tokens)
    max_tokens = num_prefill_steps + num_decode_steps + 2
    blocks_per_seq = -(-(settings.prompt_tokens + max_tokens) // settings.block_size)
    engine = LLMEngine(model, tokenizer, EngineConfig(
        model_name="bench", block_size=settings.block_size, kv_dtype=settings.kv_dtype,
        num_kv_blocks=batch_size * blocks_per_seq + 1, max_batch=batch_size,
        max_num_batched_tokens=settings.max_batched_tokens))
    clock = StepClock(engine)
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prompts = random_prompts(batch_size, settings.prompt_tokens,
                             vocab_size=model.config.vocab_size, seed=seed + batch_size)
    request_ids = [f"b{batch_size}-{index}" for index in range(batch_size)]
    for request_id, prompt in zip(request_ids, prompts, strict=True):
        engine.add_request(request_id, prompt, params)
    samples: list[StepSample] = []
    decode_s: list[float] = []
    while engine.has_work and len(decode_s) < num_decode_steps:
        _, sample = clock.step()
        if sample is None:
            continue
        samples.append(sample)
        if sample.is_pure_decode and sample.num_decode_seqs == batch_size:
            decode_s.append(sample.seconds)
    for request_id in request_ids:
        engine.abort(request_id)
    if not decode_s:
        raise RuntimeError(f"batch {batch_size}: no step decoded all sequences together")
    measured = decode_s[settings.warmup_steps:] or decode_s
    prefill = [s for s in samples if s.is_pure_prefill]
    prefill_tokens = sum(s.num_prefill_tokens for s in prefill)
    step_s = statistics.median(measured)
    return BatchPoint(
        batch_size=batch_size, prompt_tokens=settings.prompt_tokens,
        decode_step_ms=1000 * step_s, decode_step_ms_min=1000 * min(measured),
        decode_step_ms_max=1000 * max(measured),
        decode_tokens_per_s=batch_size / step_s,
        prefill_tokens_per_s=prefill_tokens / sum(s.seconds for s in prefill),
        num_decode_steps=len(measured),
    ), samples


def run_sweep(model: LlamaModel, tokenizer: Tokenizer, settings: SweepSettings, *,
              progress: Callable[[str], None] = print,
              ) -> tuple[list[BatchPoint], list[StepSample], str]:
    """Every batch size, ``passes`` times, until the time budget or device memory runs out;
    the combined points, every step sample, and why it stopped ("done", "time budget" or
    "out of memory")."""
    run_batch(model, tokenizer, 2, dataclasses.replace(settings, prompt_tokens=32), seed=99)
    by_batch: dict[int, list[BatchPoint]] = {}
    samples: list[StepSample] = []
    start = time.perf_counter()
    stopped = "done"
    for pass_index in range(settings.passes):
        for batch_size in settings.batch_sizes:
            if time.perf_counter() - start > settings.time_budget_s:
                stopped = "time budget"
                break
            if pass_index and batch_size not in by_batch:
                break  # it did not fit or was not reached in the first pass
            try:
                point, batch_samples = run_batch(model, tokenizer, batch_size, settings,
                                                 seed=pass_index)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                stopped = "out of memory"
                break
            by_batch.setdefault(batch_size, []).append(point)
            samples.extend(batch_samples)
            progress(f"  pass {pass_index + 1}, batch {batch_size:>3}: "
                     f"{point.decode_step_ms:8.1f} ms/token, "
                     f"{point.decode_tokens_per_s:8.1f} decode tokens/s, "
                     f"{point.prefill_tokens_per_s:8.1f} prefill tokens/s")
        if stopped != "done":
            break
    return [_combine(points) for points in by_batch.values()], samples, stopped


def _combine(points: list[BatchPoint]) -> BatchPoint:
    if len(points) == 1:
        return points[0]
    step_ms = statistics.median(p.decode_step_ms for p in points)
    return dataclasses.replace(
        points[0], decode_step_ms=step_ms,
        decode_step_ms_min=min(p.decode_step_ms for p in points),
        decode_step_ms_max=max(p.decode_step_ms for p in points),
        decode_tokens_per_s=1000 * points[0].batch_size / step_ms,
        prefill_tokens_per_s=statistics.median(p.prefill_tokens_per_s for p in points),
        num_decode_steps=sum(p.num_decode_steps for p in points), num_passes=len(points))


def best_under_limit(points: list[BatchPoint], limit_ms: float) -> BatchPoint | None:
    """The point with the highest decode throughput whose per-token latency is within
    ``limit_ms``; None if none is."""
    within = [p for p in points if p.decode_step_ms <= limit_ms]
    return max(within, key=lambda p: p.decode_tokens_per_s, default=None)
