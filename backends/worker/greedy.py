"""Greedy decoding with the contiguous KV cache: the reference the engine is checked against."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch

from backends.worker.attention import ContiguousKVCache
from backends.worker.model import LlamaModel


@torch.inference_mode()
def greedy(model: LlamaModel, prompt_ids: Sequence[int], num_tokens: int, *,
           stop_ids: Collection[int] = ()) -> list[int]:
    """Up to ``num_tokens`` argmax tokens after ``prompt_ids``; stops after a ``stop_ids`` token.

    Example::

        greedy(model, tokenizer.encode("The capital of France is"), 4)   # ids of " Paris..."
    """
    if not prompt_ids:
        raise ValueError("greedy needs at least one prompt token")
    cache = ContiguousKVCache(model.config, batch_size=1,
                              max_tokens=len(prompt_ids) + num_tokens,
                              device=model.device, dtype=model.dtype)
    input_ids = torch.tensor([list(prompt_ids)], device=model.device)
    positions = torch.arange(len(prompt_ids), device=model.device)[None]
    output: list[int] = []
    while len(output) < num_tokens:
        hidden = model(input_ids, positions, cache.view(positions))
        next_id = int(model.compute_logits(hidden[:, -1]).argmax(-1))
        output.append(next_id)
        if next_id in stop_ids:
            break
        input_ids = torch.tensor([[next_id]], device=model.device)
        positions = positions[:, -1:] + 1
    return output
