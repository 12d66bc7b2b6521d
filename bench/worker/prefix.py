"""Prefix caching: time to first token of a long prompt with its prefix cached vs uncached.

Each repeat takes a fresh random prompt of ``prompt_tokens`` (no block of it cached), measures
its TTFT (the engine idle otherwise: no queueing, only the prefill steps and the first
sample), then at once two cached cases: the same prompt again (every full block but the one
holding the last token is reused), and the same prompt with its last ``suffix_tokens``
replaced (a shared document or system prompt with a new question). Medians over the repeats.

Example::

    result = measure_prefix(model, tokenizer, prompt_tokens=1024, repeats=5)
    result.uncached_ttft_ms / result.cached_ttft_ms      # the speed-up (target >= 5)
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from backends.tokenizer import Tokenizer
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from bench.worker.steps import random_prompts


@dataclass(frozen=True, slots=True)
class PrefixResult:
    prompt_tokens: int
    suffix_tokens: int
    repeats: int
    uncached_ttft_ms: float
    cached_ttft_ms: float  # the same prompt again
    shared_prefix_ttft_ms: float  # same prefix, new suffix
    cached_tokens: int  # prompt tokens the repeat took from the cache
    shared_prefix_cached_tokens: int
    uncached_ttft_ms_all: tuple[float, ...]
    cached_ttft_ms_all: tuple[float, ...]
    shared_prefix_ttft_ms_all: tuple[float, ...]

    @property
    def speedup(self) -> float:
        return self.uncached_ttft_ms / self.cached_ttft_ms

    @property
    def shared_prefix_speedup(self) -> float:
        return self.uncached_ttft_ms / self.shared_prefix_ttft_ms

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "speedup": self.speedup,
                "shared_prefix_speedup": self.shared_prefix_speedup}


def measure_prefix(model: LlamaModel, tokenizer: Tokenizer, *, prompt_tokens: int = 1024,
                   suffix_tokens: int = 24, repeats: int = 5, max_batched_tokens: int = 512,
                   kv_dtype: str | None = None, seed: int = 7) -> PrefixResult:
    """See the module docstring."""
    blocks_per_prompt = -(-(prompt_tokens + 1) // 16)
    engine = LLMEngine(model, tokenizer, EngineConfig(
        model_name="bench", kv_dtype=kv_dtype, num_kv_blocks=3 * blocks_per_prompt * repeats + 4,
        max_batch=4, max_num_batched_tokens=max_batched_tokens))
    prompts = random_prompts(repeats + 1, prompt_tokens, vocab_size=model.config.vocab_size,
                             seed=seed)
    _ttft_ms(engine, "warm-up", prompts[-1])  # first-call costs stay out of the figures
    uncached, cached, shared = [], [], []
    cached_tokens = shared_tokens = 0
    for index, prompt in enumerate(prompts[:repeats]):
        uncached.append(_ttft_ms(engine, f"uncached-{index}", prompt)[0])
        ms, cached_tokens = _ttft_ms(engine, f"cached-{index}", prompt)
        cached.append(ms)
        new_suffix = random_prompts(1, suffix_tokens, vocab_size=model.config.vocab_size,
                                    seed=seed * 1000 + index)[0]
        ms, shared_tokens = _ttft_ms(engine, f"shared-{index}",
                                     prompt[:prompt_tokens - suffix_tokens] + new_suffix)
        shared.append(ms)
    return PrefixResult(
        prompt_tokens=prompt_tokens, suffix_tokens=suffix_tokens, repeats=repeats,
        uncached_ttft_ms=statistics.median(uncached), cached_ttft_ms=statistics.median(cached),
        shared_prefix_ttft_ms=statistics.median(shared), cached_tokens=cached_tokens,
        shared_prefix_cached_tokens=shared_tokens, uncached_ttft_ms_all=tuple(uncached),
        cached_ttft_ms_all=tuple(cached), shared_prefix_ttft_ms_all=tuple(shared))


def _ttft_ms(engine: LLMEngine, request_id: str, prompt: list[int]) -> tuple[float, int]:
    """Milliseconds from adding the request to its first token, and its cached tokens."""
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, ignore_eos=True))
    while True:
        for output in engine.step():
            if output.request_id == request_id and output.is_first:
                elapsed_ms = 1000 * (time.perf_counter() - start)
                while engine.has_work:  # max_tokens=1: this step finished it
                    engine.step()
                return elapsed_ms, output.num_cached_tokens
