"""The engine's correctness on a device: ``bench/worker/gpu_check.sh`` runs it on CUDA.

On SmolLM2, on the given device (the tests check the same on CPU):

1. **greedy vs reference**: the engine (paged KV, batched, prefill chunked at 64 tokens, one
   prompt long enough to take several chunks) against `backends.worker.greedy` (a contiguous
   KV cache, one sequence at a time), 24 tokens per prompt;
2. **paged vs no cache**: each prompt plus the reference continuation, fed through the paged
   cache token by token (`teacher.teacher_forced`), against one no-cache forward pass over the
   whole sequence: next-token log-likelihoods and argmaxes.

In float32 (TF32 off) both must agree: identical greedy tokens, |delta log-likelihood| <= 1e-3,
argmax equal at >= 99% of positions (exact ties may flip). bfloat16 and int8 KV (bfloat16
compute) are reported only: in 16 bits the batch shape changes rounding, and a near-tie then
changes a greedy sequence.

    python -m bench.worker.engine_check --device cuda --out results/
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backends.tokenizer import Tokenizer
from backends.worker.engine import EngineConfig, LLMEngine
from backends.worker.greedy import greedy
from backends.worker.kv_cache import kv_dtype_name
from backends.worker.loading import load_model_and_tokenizer, resolve_device
from backends.worker.model import LlamaModel
from backends.worker.sampling import SamplingParams
from bench.worker.prompts import chat_prompts, text_segments
from bench.worker.teacher import teacher_forced

NUM_TOKENS = 24
MAX_NLL_ERROR = 1e-3
MIN_ARGMAX_AGREEMENT = 0.99


def _prompts(tokenizer: Tokenizer) -> list[list[int]]:
    long_text = text_segments(tokenizer, segment_tokens=200, max_segments=1)[0]
    return [tokenizer.encode("The capital of France is"), *chat_prompts(tokenizer, 3), long_text]


def check(model: LlamaModel, tokenizer: Tokenizer, kv_dtype: str | None = None) -> dict[str, Any]:
    prompts = _prompts(tokenizer)
    engine = LLMEngine(model, tokenizer, EngineConfig(
        model_name="check", kv_dtype=kv_dtype, num_kv_blocks=128, max_num_batched_tokens=64))
    completions = engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))
    expected = [greedy(model, prompt, NUM_TOKENS) for prompt in prompts]
    matched = [next((i for i, (a, b) in enumerate(zip(want, c.token_ids, strict=True)) if a != b),
                    NUM_TOKENS) for want, c in zip(expected, completions, strict=True)]
    rows = [prompt + want for prompt, want in zip(prompts, expected, strict=True)]
    name = kv_dtype or kv_dtype_name(model.dtype)
    nll_errors, agreements = [], []
    for prompt, row in zip(prompts, rows, strict=True):  # one row each: lengths differ
        paged = teacher_forced(model, [row], num_prefill_tokens=len(prompt), kv_dtypes=[name],
                               reference=name)[name]
        no_cache_nll, no_cache_argmax = _no_cache(model, row, len(prompt))
        nll_errors.append(float((paged.nll[0] - no_cache_nll).abs().max()))
        agreements.append(float((paged.argmax[0] == no_cache_argmax).float().mean()))
    return {"kv_dtype": name, "compute_dtype": kv_dtype_name(model.dtype),
            "num_prompt_tokens": [len(p) for p in prompts],
            "greedy_tokens_matched": matched,
            "greedy_identical": all(m == NUM_TOKENS for m in matched),
            "paged_vs_no_cache_max_nll_error": max(nll_errors),
            "paged_vs_no_cache_argmax_agreement": min(agreements),
            "blocks_leaked": engine.block_manager.num_used_blocks}


@torch.inference_mode()
def _no_cache(model: LlamaModel, row: Sequence[int], num_prefill: int,
              ) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([list(row)], device=model.device)
    logits = model.compute_logits(model(ids, torch.arange(len(row), device=model.device)[None]))
    logits = logits[0, num_prefill - 1:-1]
    targets = ids[0, num_prefill:]
    nll = -torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    return nll.cpu(), logits.argmax(-1).cpu()


def run(device: str, model_path: Path | None) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 must mean float32
    torch.backends.cudnn.allow_tf32 = False
    fp32_model, tokenizer = load_model_and_tokenizer(model_path, device=device,
                                                     dtype=torch.float32)
    fp32 = check(fp32_model, tokenizer)
    del fp32_model
    bf16_model, _ = load_model_and_tokenizer(model_path, device=device, dtype=torch.bfloat16)
    reported = [check(bf16_model, tokenizer), check(bf16_model, tokenizer, "int8")]
    passed = (fp32["greedy_identical"] and fp32["blocks_leaked"] == 0
              and fp32["paged_vs_no_cache_max_nll_error"] <= MAX_NLL_ERROR
              and fp32["paged_vs_no_cache_argmax_agreement"] >= MIN_ARGMAX_AGREEMENT)
    return {"device": device, "float32": fp32, "reported_only": reported, "passed": passed}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default SmolLM2)")
    parser.add_argument("--out", type=Path, required=True, help="folder for engine_check.json")
    args = parser.parse_args(argv)
    result = run(str(resolve_device(args.device)), args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print("engine check:", "PASSED" if result["passed"] else "FAILED")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
