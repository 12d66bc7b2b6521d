"""Teacher-forced scoring through the paged KV cache, several KV dtypes in lockstep.

Each row is a fixed token sequence. Its first ``num_prefill_tokens`` go in as one prefill
chunk; the rest are fed back ``chunk_tokens`` at a time. With ``chunk_tokens=1`` every later
token is a decode step (one token per row per step), the path generation takes; larger chunks
are prefill chunks over the cached context, many times faster on long texts and, because int8
KV is quantized per token, the same numbers. At each step every KV dtype runs the same batch on
its own cache; the logits are compared with the ``reference`` dtype's at once (nothing
vocab-sized is kept), and the next-token negative log-likelihood and argmax are recorded.

Example::

    scores = teacher_forced(model, rows, num_prefill_tokens=64, chunk_tokens=64,
                            kv_dtypes=("float32", "bfloat16", "int8"), reference="float32")
    scores["int8"].perplexity                         # over the tokens after each prefill
    scores["int8"].mean_abs_error                     # mean |logit - reference logit|
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from backends.worker.kv_cache import KVCacheSpec, PagedKVCache
from backends.worker.model import LlamaModel
from backends.worker.paged_attention import PagedKVView, StepBatch, StepRow


@dataclass(slots=True)
class KVScores:
    """One KV dtype's predictions: ``nll`` and ``argmax`` are [rows, scored positions]."""

    kv_dtype: str
    nll: Tensor
    argmax: Tensor
    abs_error_sum: float = 0.0
    max_abs_error: float = 0.0
    num_logits: int = 0

    @property
    def mean_abs_error(self) -> float:
        """Mean |logit - reference logit| over every scored position and vocabulary entry."""
        return self.abs_error_sum / max(self.num_logits, 1)

    @property
    def perplexity(self) -> float:
        return float(torch.exp(self.nll.double().mean()))


@torch.inference_mode()
def teacher_forced(model: LlamaModel, rows: Sequence[Sequence[int]], *,
                   num_prefill_tokens: int | Sequence[int], kv_dtypes: Sequence[str],
                   reference: str, chunk_tokens: int = 1,
                   block_size: int = 16) -> dict[str, KVScores]:
    """Score every token of each row after its prefill; ``reference`` must be in
    ``kv_dtypes``. Rows may differ in prefill length but not in the number scored."""
    prefills = ([num_prefill_tokens] * len(rows) if isinstance(num_prefill_tokens, int)
                else list(num_prefill_tokens))
    num_scored = {len(row) - prefill for row, prefill in zip(rows, prefills, strict=True)}
    if len(num_scored) != 1 or min(num_scored) < 1 or min(prefills) < 1 or chunk_tokens < 1:
        raise ValueError("every row needs >= 1 prefill token and the same number (>= 1) after; "
                         "chunk_tokens must be >= 1")
    if reference not in kv_dtypes:
        raise ValueError(f"reference {reference!r} is not among {list(kv_dtypes)}")
    num_columns = num_scored.pop()
    device = model.device
    blocks_per_row = -(-max(len(row) for row in rows) // block_size)
    tables = [list(range(i * blocks_per_row, (i + 1) * blocks_per_row)) for i in range(len(rows))]
    caches = {name: PagedKVCache(
        KVCacheSpec.from_config(model.config, block_size=block_size, kv_dtype=name),
        len(rows) * blocks_per_row, device=device, compute_dtype=model.dtype)
        for name in kv_dtypes}
    order = [reference, *(name for name in kv_dtypes if name != reference)]
    scores = {name: KVScores(name, torch.empty(len(rows), num_columns),
                             torch.empty(len(rows), num_columns, dtype=torch.long))
              for name in kv_dtypes}
    # Column j predicts token prefill + j of each row; a chunk fed from offset `start` (tokens
    # prefill + start ...) fills the columns after it.
    targets = torch.tensor([[row[p + j] for j in range(num_columns)]
                            for row, p in zip(rows, prefills, strict=True)], device=device)
    steps = [(0, 1)] + [(start, min(chunk_tokens, num_columns - start))
                        for start in range(1, num_columns, chunk_tokens)]
    for first_column, num_tokens in steps:
        batch = _step_batch(rows, prefills, tables, first_column, num_tokens, block_size,
                            device)
        if first_column == 0:
            index = batch.last_token_index
        else:  # every token of every row's chunk
            index = torch.arange(len(rows) * num_tokens, device=device)
        reference_logits: Tensor | None = None
        for name in order:
            hidden = model(batch.input_ids, batch.positions, PagedKVView(caches[name], batch))
            logits = model.compute_logits(hidden[0, index]).view(len(rows), num_tokens, -1)
            columns = slice(first_column, first_column + num_tokens)
            _record(scores[name], columns, logits, targets[:, columns])
            if reference_logits is None:
                reference_logits = logits
            else:
                error = (logits - reference_logits).abs()
                scores[name].abs_error_sum += float(error.sum())
                scores[name].max_abs_error = max(scores[name].max_abs_error, float(error.max()))
                scores[name].num_logits += error.numel()
    return scores


def _step_batch(rows: Sequence[Sequence[int]], prefills: Sequence[int],
                tables: Sequence[Sequence[int]], first_column: int, num_tokens: int,
                block_size: int, device: torch.device) -> StepBatch:
    """Column 0: each row's prefill. Later: the ``num_tokens`` tokens from ``first_column`` on,
    as decode rows when it is one token each, else as prefill chunks."""
    if first_column == 0:
        return StepBatch.build([], [StepRow(row[:p], 0, table) for row, p, table
                                    in zip(rows, prefills, tables, strict=True)],
                               block_size=block_size, device=device)
    chunks = [StepRow(row[p - 1 + first_column:p - 1 + first_column + num_tokens],
                      p - 1 + first_column, table)
              for row, p, table in zip(rows, prefills, tables, strict=True)]
    if num_tokens == 1:
        return StepBatch.build(chunks, [], block_size=block_size, device=device)
    return StepBatch.build([], chunks, block_size=block_size, device=device)


def _record(scores: KVScores, columns: slice, logits: Tensor, targets: Tensor) -> None:
    """``logits`` [rows, tokens, vocab] and ``targets`` [rows, tokens] of one step."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    scores.nll[:, columns] = -log_probs.gather(2, targets[..., None])[..., 0].cpu()
    scores.argmax[:, columns] = logits.argmax(-1).cpu()
