"""The paged KV cache: fixed-size blocks of keys and values per layer, addressed by slot.

Layout: one keys and one values tensor ``[num_layers, num_blocks, block_size, num_kv_heads,
head_dim]``; slot ``s`` is token ``s % block_size`` of block ``s // block_size``. Only the KV
heads are stored, so grouped-query attention divides the cache by ``num_heads / num_kv_heads``.
The block manager (``backends.engine_core.block_manager``) decides which blocks a sequence
owns; this module only stores and reads them.

Storage dtypes: ``float32``, ``float16``, ``bfloat16``, or ``int8``. int8 is symmetric and
quantized per token and per KV head: each stored (token, head) vector of K and of V has its own
float16 scale, ``scale = absmax / 127`` over the head's ``head_dim`` channels, and stores
``round(x / scale)`` in [-127, 127]; reads return ``q * scale`` in the compute dtype. A token is
quantized once, when it is written, and never touched again, so a result does not depend on
how a block filled (prefill chunk or decode steps) or on who owned the block before.

Why per token, not per block: the earlier scheme kept one float32 scale per (block, head),
re-rounded a block's earlier tokens whenever a new token raised its absmax, and let one
outlier token coarsen the step of the whole block. Measured on SmolLM2-135M (CPU, float32
compute; the fixed text and 20 prompts x 64 tokens of ``bench.worker.bench``, docs/benchmarks.md),
per block -> per token:

- mean |logit - float32-KV logit| on the text 0.145 -> 0.088 (bfloat16 KV: 0.017), top-1
  agreement with float32 KV 96.7% -> 97.4%, perplexity against bfloat16 KV +0.14% -> +0.07%;
- greedy, teacher-forced on the bfloat16-KV continuation: agreement 97.1% -> 97.9%, mean logit
  error 0.20 -> 0.11; free-running: tokens before the first divergence 427 -> 706 of 1,280,
  identical sequences 1 -> 7 of 20 (bfloat16 vs float16 KV, for scale: 1,272 and 19).

It costs 2 bytes of scale per 64 values instead of ~0.25: 1.94x fewer bytes than 16-bit KV
instead of 1.99x, above the 1.9x the capacity target needs (44 vs 22 sequences of 2k tokens
per GiB for SmolLM2). An asymmetric (zero-point) or per-channel key scale would not fit that.

Bytes per token are exact: ``2 * num_layers * num_kv_heads * head_dim * dtype_bytes``, plus for
int8 the scales, ``2 * num_layers * num_kv_heads * 2``: ``2 * L * H * (head_dim + 2)`` in all.

Example::

    spec = KVCacheSpec.from_config(config, block_size=16, kv_dtype="int8")
    num_blocks = plan_num_blocks(spec, torch.device("cpu"), kv_cache_gib=0.5)
    cache = PagedKVCache(spec, num_blocks, device="cpu", compute_dtype=torch.float32)
    write = cache.prepare_write(slots)          # once per step
    cache.write(layer_index, write, k, v)       # k, v: [num_tokens, num_kv_heads, head_dim]
    keys, values = cache.gather(layer_index, block_ids)   # [..., block_size, heads, head_dim]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

from backends.worker.config import ModelConfig

KV_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int8": torch.int8,
}
INT8_MAX = 127.0
SCALE_DTYPE = torch.float16  # one int8 scale per (token, KV head) of K and of V
SCALE_BYTES = 2
# The smallest positive float16 (a subnormal): an all-zero vector still gets a usable scale.
MIN_SCALE = 2.0**-24
DEFAULT_CUDA_MEMORY_FRACTION = 0.9  # of the free device memory once the model is loaded
DEFAULT_CPU_MEMORY_FRACTION = 0.1  # of the available RAM: the CPU is shared with the host


def kv_dtype_name(kv_dtype: str | torch.dtype) -> str:
    """The storage dtype's name; ValueError for one the cache does not store."""
    for name, dtype in KV_DTYPES.items():
        if kv_dtype in (name, dtype):
            return name
    raise ValueError(f"kv_dtype must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}")


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    """The shape and storage dtype of a paged KV cache, and its exact size.

    Example::

        spec = KVCacheSpec.from_config(smollm2_config, block_size=16, kv_dtype="float16")
        spec.bytes_per_token    # 2 * 30 layers * 3 KV heads * 64 * 2 bytes = 23040
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    kv_dtype: str

    def __post_init__(self) -> None:
        kv_dtype_name(self.kv_dtype)
        if min(self.num_layers, self.num_kv_heads, self.head_dim, self.block_size) < 1:
            raise ValueError("num_layers, num_kv_heads, head_dim and block_size must be >= 1")

    @classmethod
    def from_config(cls, config: ModelConfig, *, block_size: int,
                    kv_dtype: str | torch.dtype) -> KVCacheSpec:
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, block_size,
                   kv_dtype_name(kv_dtype))

    @property
    def dtype(self) -> torch.dtype:
        return KV_DTYPES[self.kv_dtype]

    @property
    def is_quantized(self) -> bool:
        return self.kv_dtype == "int8"

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token in every layer, int8 scales included."""
        vectors = 2 * self.num_layers * self.num_kv_heads  # one K and one V per layer and head
        scale_bytes = SCALE_BYTES if self.is_quantized else 0
        return vectors * (self.head_dim * self.dtype.itemsize + scale_bytes)

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size

    def num_blocks_for_bytes(self, num_bytes: float) -> int:
        return int(num_bytes // self.bytes_per_block)


def available_memory_bytes(device: torch.device) -> int:
    """Free device memory on CUDA; the kernel's MemAvailable (all free RAM) on CPU."""
    if device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(device)
        return int(free_bytes)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_num_blocks(
    spec: KVCacheSpec,
    device: torch.device,
    *,
    num_blocks: int | None = None,
    kv_cache_gib: float | None = None,
    memory_fraction: float | None = None,
) -> int:
    """How many blocks to allocate: ``num_blocks`` if given, else what ``kv_cache_gib`` holds,
    else ``memory_fraction`` of the available memory (default 0.9 of free CUDA memory, 0.1 of
    available RAM). ValueError if that is not even one block."""
    if num_blocks is not None and kv_cache_gib is not None:
        raise ValueError("give the KV cache size as num_blocks or kv_cache_gib, not both")
    if num_blocks is not None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        return num_blocks
    if kv_cache_gib is not None:
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be > 0, got {kv_cache_gib}")
        budget_bytes = kv_cache_gib * 2**30
        source = f"kv_cache_gib={kv_cache_gib}"
    else:
        default = (DEFAULT_CUDA_MEMORY_FRACTION if device.type == "cuda"
                   else DEFAULT_CPU_MEMORY_FRACTION)
        fraction = default if memory_fraction is None else memory_fraction
        if not 0 < fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {fraction}")
        available = available_memory_bytes(device)
        budget_bytes = fraction * available
        source = f"{fraction} of the {available / 2**30:.2f} GiB available on {device}"
    blocks = spec.num_blocks_for_bytes(budget_bytes)
    if blocks < 1:
        raise ValueError(f"{source} does not hold one KV block ({spec.bytes_per_block} bytes); "
                         "give a larger kv_cache_gib or num_blocks")
    return blocks


@dataclass(frozen=True, slots=True)
class WritePlan:
    """Where one step's new tokens go, shared by every layer's write."""

    slots: Tensor  # [num_tokens] flat slot per new token


class PagedKVCache:
    """The blocks themselves; see the module docstring for the layout and the int8 scheme.

    Example::

        cache = PagedKVCache(spec, num_blocks=256, device="cpu", compute_dtype=torch.float32)
        cache.num_bytes == 256 * spec.bytes_per_block
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, *, device: torch.device | str,
                 compute_dtype: torch.dtype) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        self.compute_dtype = compute_dtype
        shape = (spec.num_layers, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        # Zeroed, never empty: padding reads stale blocks under a mask, and a NaN left there
        # would survive the mask (0 * NaN).
        self.keys = torch.zeros(shape, dtype=spec.dtype, device=self.device)
        self.values = torch.zeros(shape, dtype=spec.dtype, device=self.device)
        scale_shape = shape[:-1] if spec.is_quantized else (0,)
        self.key_scales = torch.zeros(scale_shape, dtype=SCALE_DTYPE, device=self.device)
        self.value_scales = torch.zeros(scale_shape, dtype=SCALE_DTYPE, device=self.device)

    @property
    def num_bytes(self) -> int:
        tensors = (self.keys, self.values, self.key_scales, self.value_scales)
        return sum(t.numel() * t.element_size() for t in tensors)

    def prepare_write(self, slots: Tensor) -> WritePlan:
        """The step's write plan, made once; every layer's `write` reuses it."""
        return WritePlan(slots)

    def write(self, layer_index: int, plan: WritePlan, k: Tensor, v: Tensor) -> None:
        """Store the step's new keys and values ([num_tokens, num_kv_heads, head_dim])."""
        if self.spec.is_quantized:
            self._write_int8(self.keys[layer_index], self.key_scales[layer_index], plan, k)
            self._write_int8(self.values[layer_index], self.value_scales[layer_index], plan, v)
            return
        heads, dim, dtype = self.spec.num_kv_heads, self.spec.head_dim, self.spec.dtype
        self.keys[layer_index].view(-1, heads, dim).index_copy_(0, plan.slots, k.to(dtype))
        self.values[layer_index].view(-1, heads, dim).index_copy_(0, plan.slots, v.to(dtype))

    def gather(self, layer_index: int, block_ids: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``block_ids`` (any shape ``S``) as ``[*S, block_size,
        num_kv_heads, head_dim]`` in the compute dtype."""
        keys = self.keys[layer_index][block_ids]
        values = self.values[layer_index][block_ids]
        if not self.spec.is_quantized:
            return keys.to(self.compute_dtype), values.to(self.compute_dtype)
        key_scales = self.key_scales[layer_index][block_ids][..., None]
        value_scales = self.value_scales[layer_index][block_ids][..., None]
        # float32 product, one rounding to the compute dtype (bfloat16 would round the scale).
        return ((keys.float() * key_scales.float()).to(self.compute_dtype),
                (values.float() * value_scales.float()).to(self.compute_dtype))

    def _write_int8(self, data: Tensor, scales: Tensor, plan: WritePlan, x: Tensor) -> None:
        x = x.float()
        # Quantize with the float16-rounded scale, so that q * scale is what the reader sees.
        token_scales = (x.abs().amax(dim=-1) / INT8_MAX).clamp_min_(MIN_SCALE).to(SCALE_DTYPE)
        quantized = torch.round(x / token_scales.float()[..., None])
        quantized = quantized.clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        heads, dim = self.spec.num_kv_heads, self.spec.head_dim
        data.view(-1, heads, dim).index_copy_(0, plan.slots, quantized)
        scales.view(-1, heads).index_copy_(0, plan.slots, token_scales)
