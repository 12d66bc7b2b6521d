"""The model runner: one scheduler `StepPlan` in, one forward pass, logits out.

The only part of the engine that touches the model and the KV cache (with the sampler, the
only torch). It lays the plan out as a flat `StepBatch` (decodes, then prefill chunks), runs
the model over the paged cache, and projects to the vocabulary only the last token of each
sequence that emits a token this step: every decode, and each chunk that ends its prefill.

Example::

    runner = ModelRunner(model, cache)
    plan = scheduler.schedule(now_s)
    step = runner.run(plan, scheduler)
    step.seq_ids, step.logits.shape      # ["req-0", "req-1"], (2, vocab_size)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from backends.engine_core.scheduler import Scheduler, StepPlan
from backends.engine_core.sequence import Sequence
from backends.worker.kv_cache import PagedKVCache
from backends.worker.model import LlamaModel
from backends.worker.paged_attention import PagedKVView, StepBatch, StepRow


@dataclass(frozen=True, slots=True)
class StepLogits:
    """Next-token logits ([len(seq_ids), vocab], float32) of the sequences that emit."""

    seq_ids: list[str]
    logits: Tensor


class ModelRunner:
    """Runs plans on ``model`` over ``cache``; see the module docstring."""

    def __init__(self, model: LlamaModel, cache: PagedKVCache) -> None:
        if cache.spec.num_layers != model.config.num_layers or (
                cache.spec.num_kv_heads, cache.spec.head_dim) != (
                model.config.num_kv_heads, model.config.head_dim):
            raise ValueError("the KV cache was not shaped for this model")
        self.model = model
        self.cache = cache
        self.block_size = cache.spec.block_size

    def build_batch(self, plan: StepPlan, scheduler: Scheduler) -> tuple[StepBatch, list[str]]:
        """The step's flat batch and, per row, the id of the sequence it belongs to."""
        decodes: list[StepRow] = []
        prefills: list[StepRow] = []
        row_ids: list[str] = []
        for seq_id in plan.decode_ids:
            seq = _get(scheduler, seq_id)
            decodes.append(StepRow((seq.last_token_id,), seq.num_tokens - 1, seq.block_table))
            row_ids.append(seq_id)
        for chunk in plan.prefills:
            seq = _get(scheduler, chunk.seq_id)
            start = chunk.num_context_tokens - chunk.num_tokens
            if chunk.num_context_tokens > seq.num_prompt_tokens and (
                    len(seq.output_token_ids) != seq.num_output_tokens):
                raise ValueError(f"sequence {chunk.seq_id!r} recomputes output tokens whose "
                                 "ids were not recorded")
            token_ids = seq.token_ids[start:chunk.num_context_tokens]
            prefills.append(StepRow(token_ids, start, seq.block_table))
            row_ids.append(chunk.seq_id)
        batch = StepBatch.build(decodes, prefills, block_size=self.block_size,
                                device=self.model.device)
        return batch, row_ids

    @torch.inference_mode()
    def run(self, plan: StepPlan, scheduler: Scheduler) -> StepLogits:
        """Run ``plan`` (not yet completed) and return the emitting sequences' logits."""
        batch, row_ids = self.build_batch(plan, scheduler)
        emitting = set(scheduler.emitting_ids(plan))
        hidden = self.model(batch.input_ids, batch.positions, PagedKVView(self.cache, batch))
        rows = [index for index, seq_id in enumerate(row_ids) if seq_id in emitting]
        if not rows:
            return StepLogits([], hidden.new_zeros((0, self.model.config.vocab_size)).float())
        index = batch.last_token_index[torch.tensor(rows, device=hidden.device)]
        logits = self.model.compute_logits(hidden[0, index])
        return StepLogits([row_ids[i] for i in rows], logits)


def _get(scheduler: Scheduler, seq_id: str) -> Sequence:
    seq = scheduler.get(seq_id)
    if seq is None:
        raise ValueError(f"the plan names sequence {seq_id!r}, which the scheduler no longer "
                         "holds; run a plan before aborting its sequences")
    return seq
