"""Check the model on an accelerator against float32 on CPU; ``bench/worker/gpu_check.sh`` runs it.

On each prompt it compares, with the CPU float32 model as truth (the tests check that one
against the plain reference): greedy tokens, and the logits at every position of the prompt
plus the CPU's greedy continuation (teacher-forced), for the device in float32 and in bfloat16.

    python -m backends.worker.device_check --device cuda --out results/

Pass: float32 on the device gives the CPU's greedy tokens and logits within 1e-2; bfloat16
agrees on the top-1 token at >= 90% of positions with a mean absolute logit error <= 0.3 (on
CPU, bfloat16 SmolLM2 gives ~0.14 and >= 94%). bfloat16 greedy agreement is reported only: one
near-tie flips the rest of a sequence.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from backends.tokenizer import default_model_path, load_tokenizer_from_gguf
from backends.worker.greedy import greedy
from backends.worker.load_gguf import load_gguf
from backends.worker.model import LlamaModel

NUM_TOKENS = 16
MAX_FP32_ERROR = 1e-2
MAX_BF16_MEAN_ERROR = 0.3
MIN_BF16_TOP1_AGREEMENT = 0.9
PROMPTS: list[Any] = [
    "The capital of France is",
    "def fibonacci(n):",
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Name a primary colour."}],
]


@torch.inference_mode()
def _logits(model: LlamaModel, ids: Sequence[int]) -> torch.Tensor:
    input_ids = torch.tensor([list(ids)], device=model.device)
    positions = torch.arange(len(ids), device=model.device)[None]
    return model.compute_logits(model(input_ids, positions))[0].cpu()


def _compare(truth: LlamaModel, candidate: LlamaModel,
             prompts: list[list[int]]) -> dict[str, Any]:
    rows, errors, top1 = [], [], []
    for prompt_ids in prompts:
        expected = greedy(truth, prompt_ids, NUM_TOKENS)
        start = time.perf_counter()
        tokens = greedy(candidate, prompt_ids, NUM_TOKENS)
        greedy_s = time.perf_counter() - start
        agreed = next((i for i, (a, b) in enumerate(zip(expected, tokens, strict=True))
                       if a != b), NUM_TOKENS)
        ids = prompt_ids + expected
        want, got = _logits(truth, ids), _logits(candidate, ids)
        errors.append((want - got).abs())
        top1.append(want.argmax(-1) == got.argmax(-1))
        rows.append({"num_prompt_tokens": len(prompt_ids), "greedy_tokens_agreed": agreed,
                     "max_abs_logit_error": errors[-1].max().item(),
                     "greedy_tokens_per_s": NUM_TOKENS / greedy_s})
    all_errors, all_top1 = torch.cat([e.flatten() for e in errors]), torch.cat(top1)
    return {"prompts": rows,
            "greedy_identical": all(r["greedy_tokens_agreed"] == NUM_TOKENS for r in rows),
            "max_abs_logit_error": all_errors.max().item(),
            "mean_abs_logit_error": all_errors.mean().item(),
            "top1_agreement": all_top1.float().mean().item()}


def run(device: str, model_path: Path) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 must mean float32
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = load_tokenizer_from_gguf(model_path)
    prompts = [tokenizer.encode(p) if isinstance(p, str) else tokenizer.encode_chat(p)
               for p in PROMPTS]
    start = time.perf_counter()
    truth = load_gguf(model_path, device="cpu", dtype=torch.float32)
    load_s = time.perf_counter() - start
    fp32 = _compare(truth, load_gguf(model_path, device=device, dtype=torch.float32), prompts)
    bf16 = _compare(truth, load_gguf(model_path, device=device, dtype=torch.bfloat16), prompts)
    passed = (fp32["greedy_identical"] and fp32["max_abs_logit_error"] <= MAX_FP32_ERROR
              and bf16["mean_abs_logit_error"] <= MAX_BF16_MEAN_ERROR
              and bf16["top1_agreement"] >= MIN_BF16_TOP1_AGREEMENT)
    return {"device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else device,
            "torch": torch.__version__, "model": model_path.name, "cpu_load_s": load_s,
            "float32": fp32, "bfloat16": bf16, "passed": passed}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default SmolLM2)")
    parser.add_argument("--out", type=Path, required=True, help="folder for device_check.json")
    args = parser.parse_args(argv)
    result = run(args.device, args.model or default_model_path())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "device_check.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print("device check:", "PASSED" if result["passed"] else "FAILED")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
