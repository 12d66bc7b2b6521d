"""KV capacity: exact bytes per token per KV dtype, and how many 2k-token sequences fit a
fixed memory budget; GQA against the same model with full multi-head KV.

Bytes come from the cache's own accounting (`KVCacheSpec`, checked against the bytes a
`PagedKVCache` actually allocates); sequences are counted by the engine's `BlockManager`,
admitting distinct ``sequence_tokens``-token prompts into ``plan_num_blocks(budget)`` blocks
until it refuses one.

Example::

    rows = measure_capacity(model.config, budget_gib=1.0)
    rows["int8"].num_sequences / rows["bfloat16"].num_sequences      # ~1.9
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

import torch

from backends.engine_core.block_manager import BlockManager
from backends.engine_core.sequence import Sequence
from backends.worker.config import ModelConfig
from backends.worker.kv_cache import KVCacheSpec, PagedKVCache, plan_num_blocks

KV_DTYPES = ("float32", "bfloat16", "float16", "int8")


@dataclass(frozen=True, slots=True)
class CapacityRow:
    kv_dtype: str
    num_kv_heads: int
    bytes_per_token: int
    bytes_per_block: int
    num_blocks: int  # in the budget
    num_sequences: int  # of sequence_tokens each, admitted by the block manager

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def capacity_row(config: ModelConfig, kv_dtype: str, *, budget_gib: float,
                 sequence_tokens: int, block_size: int = 16) -> CapacityRow:
    spec = KVCacheSpec.from_config(config, block_size=block_size, kv_dtype=kv_dtype)
    allocated = PagedKVCache(spec, 2, device="cpu", compute_dtype=torch.float32).num_bytes
    if allocated != 2 * spec.bytes_per_block:
        raise AssertionError(f"{kv_dtype}: the cache allocates {allocated} bytes for 2 blocks, "
                             f"its spec says {2 * spec.bytes_per_block}")
    num_blocks = plan_num_blocks(spec, torch.device("cpu"), kv_cache_gib=budget_gib)
    return CapacityRow(kv_dtype, config.num_kv_heads, spec.bytes_per_token, spec.bytes_per_block,
                       num_blocks, _admitted(num_blocks, block_size, sequence_tokens))


def _admitted(num_blocks: int, block_size: int, sequence_tokens: int) -> int:
    manager = BlockManager(num_blocks, block_size)
    count = 0
    while True:
        first = count * sequence_tokens  # distinct token ids: no prefix hits
        seq = Sequence(f"s{count}", tuple(range(first, first + sequence_tokens)), 1, 0.0,
                       model="bench", block_size=block_size)
        if not manager.can_allocate(seq):
            return count
        manager.allocate(seq)
        count += 1


def measure_capacity(config: ModelConfig, *, budget_gib: float = 1.0,
                     sequence_tokens: int = 2048) -> dict[str, object]:
    """Every KV dtype with the model's KV heads, and 16-bit with one KV head per query head."""
    rows = {name: capacity_row(config, name, budget_gib=budget_gib,
                               sequence_tokens=sequence_tokens) for name in KV_DTYPES}
    mha_config = dataclasses.replace(config, num_kv_heads=config.num_heads)
    mha = capacity_row(mha_config, "bfloat16", budget_gib=budget_gib,
                       sequence_tokens=sequence_tokens)
    sixteen = rows["bfloat16"]
    return {
        "budget_gib": budget_gib,
        "sequence_tokens": sequence_tokens,
        "rows": {name: row.to_json() for name, row in rows.items()},
        "mha_bfloat16": mha.to_json(),
        "int8_vs_16bit_bytes_ratio": sixteen.bytes_per_token / rows["int8"].bytes_per_token,
        "int8_vs_16bit_sequences_ratio": rows["int8"].num_sequences / sixteen.num_sequences,
        "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads,
        "gqa_expected_ratio": config.num_heads / config.num_kv_heads,
        "gqa_bytes_ratio": mha.bytes_per_token / sixteen.bytes_per_token,
        "gqa_sequences_ratio": sixteen.num_sequences / max(mha.num_sequences, 1),
    }
