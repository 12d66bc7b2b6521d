"""Attention over the paged KV cache for one engine step: `PagedKVView` (a `KVCacheView`).

A step runs every scheduled token in one flat row, ``[1, num_tokens]``: first one token per
decoding sequence, then each prefill chunk's tokens in turn. The view writes the new keys and
values into their slots, then attends in groups, one ``scaled_dot_product_attention`` each:

- all decodes together, their block tables padded to the longest ([num_decodes, max_blocks]);
  a key is visible when its position is below the sequence's length;
- each prefill chunk alone, over its whole context (cached prefix + the chunk), causal within
  the chunk: token ``t`` at position ``p`` sees keys at positions ``<= p``.

Reading back through the cache, rather than attending to the fresh K/V directly, makes a
chunked prefill, a prefix hit and a one-shot prefill see the very same (possibly int8) keys.

Example::

    batch = StepBatch.build(rows, block_size=16, device=device)   # the runner builds rows
    view = PagedKVView(cache, batch)
    hidden = model(batch.input_ids, batch.positions, view)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from backends.worker.kv_cache import PagedKVCache, WritePlan


@dataclass(frozen=True, slots=True)
class StepRow:
    """One sequence's tokens in a step: ``token_ids`` at positions ``start_position`` onwards,
    attending to everything before them; ``block_table`` covers all of it."""

    token_ids: Sequence[int]
    start_position: int
    block_table: Sequence[int]

    @property
    def num_context_tokens(self) -> int:
        return self.start_position + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class PrefillGroup:
    first_token: int  # index into the flat row
    num_tokens: int
    num_context_tokens: int
    block_ids: Tensor  # [num_blocks covering the context]
    mask: Tensor | None  # [1, 1, num_tokens, num_context_tokens]; None: plain causal


@dataclass(frozen=True, slots=True)
class StepBatch:
    """The flat inputs of one step and the index tensors attention needs in every layer."""

    input_ids: Tensor  # [1, num_tokens]
    positions: Tensor  # [1, num_tokens]
    slots: Tensor  # [num_tokens]
    last_token_index: Tensor  # [num_rows] each row's last token in the flat row
    num_decodes: int
    decode_block_tables: Tensor  # [num_decodes, max_blocks]
    decode_mask: Tensor  # [num_decodes, 1, 1, max_blocks * block_size]
    prefills: tuple[PrefillGroup, ...]

    @classmethod
    def build(cls, decodes: Sequence[StepRow], prefills: Sequence[StepRow], *,
              block_size: int, device: torch.device) -> StepBatch:
        """Decode rows (one token each) first, then prefill rows, in that order."""
        if any(len(row.token_ids) != 1 for row in decodes):
            raise ValueError("a decode row has exactly one token")
        rows = [*decodes, *prefills]
        if not rows or any(not row.token_ids for row in rows):
            raise ValueError("a step needs at least one row, each with at least one token")
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last_index: list[int] = []
        for row in rows:
            for position in range(row.start_position, row.num_context_tokens):
                slots.append(row.block_table[position // block_size] * block_size
                             + position % block_size)
            positions.extend(range(row.start_position, row.num_context_tokens))
            token_ids.extend(row.token_ids)
            last_index.append(len(token_ids) - 1)

        def tensor(values: list[int] | list[list[int]]) -> Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        max_blocks = max((-(-row.num_context_tokens // block_size) for row in decodes),
                         default=0)
        tables = [list(row.block_table[:max_blocks]) for row in decodes]
        tables = [table + [0] * (max_blocks - len(table)) for table in tables]
        key_positions = torch.arange(max_blocks * block_size, device=device)
        lengths = tensor([row.num_context_tokens for row in decodes])
        decode_mask = (key_positions[None, :] < lengths[:, None])[:, None, None, :]

        groups = []
        first = len(decodes)
        for row in prefills:
            num_tokens, num_context = len(row.token_ids), row.num_context_tokens
            mask = None
            if num_context > num_tokens:
                query_positions = torch.arange(row.start_position, num_context, device=device)
                mask = (torch.arange(num_context, device=device)[None, :]
                        <= query_positions[:, None])[None, None]
            num_blocks = -(-num_context // block_size)
            groups.append(PrefillGroup(first, num_tokens, num_context,
                                       tensor(list(row.block_table[:num_blocks])), mask))
            first += num_tokens
        return cls(
            input_ids=tensor([token_ids]), positions=tensor([positions]), slots=tensor(slots),
            last_token_index=tensor(last_index), num_decodes=len(decodes),
            decode_block_tables=tensor(tables).view(len(decodes), max_blocks),
            decode_mask=decode_mask, prefills=tuple(groups),
        )

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])


class PagedKVView:
    """`KVCacheView` of a `PagedKVCache` for one `StepBatch`; see the module docstring."""

    def __init__(self, cache: PagedKVCache, batch: StepBatch) -> None:
        self._cache = cache
        self._batch = batch
        self._write: WritePlan = cache.prepare_write(batch.slots)

    def attend(self, layer_index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``q`` [1, num_heads, num_tokens, head_dim]; ``k``, ``v`` [1, num_kv_heads, ...]."""
        cache, batch = self._cache, self._batch
        cache.write(layer_index, self._write, k[0].transpose(0, 1), v[0].transpose(0, 1))
        outputs = []
        if batch.num_decodes:
            num_decodes = batch.num_decodes
            queries = q[0, :, :num_decodes].transpose(0, 1)[:, :, None]  # [B, H, 1, D]
            keys, values = cache.gather(layer_index, batch.decode_block_tables)
            out = F.scaled_dot_product_attention(
                queries, _heads_first(keys, num_decodes), _heads_first(values, num_decodes),
                attn_mask=batch.decode_mask, enable_gqa=True)
            outputs.append(out[:, :, 0].transpose(0, 1)[None])  # [1, H, B, D]
        for group in batch.prefills:
            queries = q[:, :, group.first_token:group.first_token + group.num_tokens]
            keys, values = cache.gather(layer_index, group.block_ids)
            keys = _heads_first(keys, 1)[:, :, :group.num_context_tokens]
            values = _heads_first(values, 1)[:, :, :group.num_context_tokens]
            outputs.append(F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=group.mask, is_causal=group.mask is None,
                enable_gqa=True))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


def _heads_first(blocks: Tensor, batch_size: int) -> Tensor:
    """[batch?, num_blocks, block_size, heads, dim] -> [batch, heads, num_blocks * block_size,
    dim]."""
    return blocks.reshape(batch_size, -1, *blocks.shape[-2:]).transpose(1, 2)
