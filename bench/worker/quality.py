"""int8 KV against 16-bit KV, end to end: perplexity and greedy-token agreement.

- **Perplexity** of the fixed text (``bench/data``), cut into ``segment_tokens`` windows;
  each window's first ``prefill_tokens`` are context, the rest are scored, fed back in
  ``chunk_tokens`` chunks (`teacher.teacher_forced`). Every KV dtype runs in lockstep, and
  each is also compared logit by logit with the model's own dtype (float32 on CPU).
- **Greedy agreement** over the 20 chat prompts x ``num_new_tokens``:
  *teacher-forced*: the baseline's greedy continuation is fed to both caches token by token
  (decode steps); at each position, do both pick the same next token? *free-running*: each
  generates on its own through the engine; tokens matched until the first divergence, and the
  share of sequences identical throughout. A control pair of two 16-bit formats (bfloat16 and
  float16 KV) shows how far free-running agreement falls without any int8.

The target (>= 95%) is judged teacher-forced: it counts each position's decision once, on the
same context for both. Free running turns the first near-tie (two logits a rounding apart)
into a different text for the rest of the sequence, so one flipped decision can cost up to
``num_new_tokens`` matches; it measures how often a long output changes at all, which the
control pair puts in proportion (16-bit formats differ by less, so they flip fewer near-ties).
The baseline teacher-forced against its own free-running output is the noise floor: batch
shapes differ between the two runs, which moves float32 results in the last bits.

Example::

    result = measure_quality(model, tokenizer, baseline="bfloat16")
    result["perplexity"]["int8_relative_change"], result["greedy"]["teacher_forced_agreement"]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from backends.tokenizer import Tokenizer
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.kv_cache import kv_dtype_name
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from bench.worker.prompts import chat_prompts, text_segments
from bench.worker.teacher import teacher_forced


def measure_quality(model: LlamaModel, tokenizer: Tokenizer, *, baseline: str = "bfloat16",
                    segment_tokens: int = 512, max_segments: int = 8, prefill_tokens: int = 64,
                    chunk_tokens: int = 64, num_prompts: int = 20,
                    num_new_tokens: int = 64) -> dict[str, Any]:
    """See the module docstring; ``baseline`` is the 16-bit KV dtype int8 is judged against."""
    reference = kv_dtype_name(model.dtype)
    return {
        "baseline_kv_dtype": baseline,
        "reference_kv_dtype": reference,
        "perplexity": _perplexity(model, tokenizer, baseline, reference, segment_tokens,
                                  max_segments, prefill_tokens, chunk_tokens),
        "greedy": _greedy(model, tokenizer, chat_prompts(tokenizer, num_prompts), baseline,
                          num_new_tokens),
    }


def _perplexity(model: LlamaModel, tokenizer: Tokenizer, baseline: str, reference: str,
                segment_tokens: int, max_segments: int, prefill_tokens: int,
                chunk_tokens: int) -> dict[str, Any]:
    segments = text_segments(tokenizer, segment_tokens=segment_tokens, max_segments=max_segments)
    kv_dtypes = list(dict.fromkeys([reference, baseline, "float16", "bfloat16", "int8"]))
    scores = teacher_forced(model, segments, num_prefill_tokens=prefill_tokens,
                            kv_dtypes=kv_dtypes, reference=reference, chunk_tokens=chunk_tokens)
    by_dtype = {name: {
        "perplexity": s.perplexity,
        "mean_abs_logit_error": s.mean_abs_error,
        "max_abs_logit_error": s.max_abs_error,
        "top1_agreement_with_reference": _share(s.argmax == scores[reference].argmax),
    } for name, s in scores.items()}
    int8, base = scores["int8"].perplexity, scores[baseline].perplexity
    return {
        "num_segments": len(segments), "segment_tokens": segment_tokens,
        "num_scored_tokens": int(scores["int8"].nll.numel()),
        "prefill_tokens": prefill_tokens, "chunk_tokens": chunk_tokens,
        "by_kv_dtype": by_dtype,
        "int8_relative_change": int8 / base - 1,
        "int8_top1_agreement_with_baseline": _share(
            scores["int8"].argmax == scores[baseline].argmax),
    }


def _greedy(model: LlamaModel, tokenizer: Tokenizer, prompts: list[list[int]], baseline: str,
            num_new_tokens: int) -> dict[str, Any]:
    control = "float16" if baseline != "float16" else "bfloat16"
    outputs = {name: _generate(model, tokenizer, prompts, name, num_new_tokens)
               for name in (baseline, "int8", control)}
    expected = outputs[baseline]
    rows = [prompt + list(tokens) for prompt, tokens in zip(prompts, expected, strict=True)]
    scores = teacher_forced(model, rows, num_prefill_tokens=[len(p) for p in prompts],
                            kv_dtypes=[baseline, "int8"], reference=baseline, chunk_tokens=1)
    target = torch.tensor([list(tokens) for tokens in expected])
    return {
        "num_prompts": len(prompts), "num_new_tokens": num_new_tokens,
        "teacher_forced_agreement": _share(scores["int8"].argmax == target),
        "teacher_forced_baseline_self_agreement": _share(scores[baseline].argmax == target),
        "teacher_forced_mean_abs_logit_error": scores["int8"].mean_abs_error,
        "free_running": _free_running(expected, outputs["int8"], num_new_tokens),
        "free_running_control": {"kv_dtype": control,
                                 **_free_running(expected, outputs[control], num_new_tokens)},
    }


def _generate(model: LlamaModel, tokenizer: Tokenizer, prompts: list[list[int]],
              kv_dtype: str, num_new_tokens: int) -> list[tuple[int, ...]]:
    blocks = sum(-(-(len(p) + num_new_tokens) // 16) for p in prompts) + 1
    engine = LLMEngine(model, tokenizer, EngineConfig(
        model_name="bench", kv_dtype=kv_dtype, num_kv_blocks=blocks, max_batch=len(prompts),
        max_num_batched_tokens=max(512, max(len(p) for p in prompts))))
    completions = engine.generate(prompts, SamplingParams(max_tokens=num_new_tokens,
                                                          ignore_eos=True))
    return [c.token_ids for c in completions]


def _free_running(expected: Sequence[Sequence[int]], got: Sequence[Sequence[int]],
                  num_new_tokens: int) -> dict[str, Any]:
    matched = [next((i for i, (a, b) in enumerate(zip(want, have, strict=True)) if a != b),
                    num_new_tokens) for want, have in zip(expected, got, strict=True)]
    return {"matched_tokens": sum(matched), "total_tokens": num_new_tokens * len(matched),
            "matched_share": sum(matched) / (num_new_tokens * len(matched)),
            "identical_sequences": sum(m == num_new_tokens for m in matched),
            "identical_share": sum(m == num_new_tokens for m in matched) / len(matched),
            "matched_per_prompt": matched}


def _share(matches: torch.Tensor) -> float:
    return float(matches.float().mean())

