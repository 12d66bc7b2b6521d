"""The paged KV cache: exact sizes, capacity planning, float and int8 storage."""

from __future__ import annotations

import pytest
import torch

from backends.worker.config import ModelConfig
from backends.worker.kv_cache import KVCacheSpec, PagedKVCache, kv_dtype_name, plan_num_blocks
from tests.backends.worker.checkpoints import TINY_CONFIG

SMOLLM2 = ModelConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
    num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5,
    max_position_embeddings=8192, tie_word_embeddings=True)


@pytest.mark.parametrize(
    ("kv_dtype", "bytes_per_token"),
    [
        pytest.param("float32", 2 * 30 * 3 * 64 * 4, id="float32"),
        pytest.param(torch.float16, 2 * 30 * 3 * 64 * 2, id="float16"),
        pytest.param("bfloat16", 2 * 30 * 3 * 64 * 2, id="bfloat16"),
        pytest.param("int8", 2 * 30 * 3 * (64 + 2), id="int8-with-scales"),
    ],
)
def test_bytes_per_token_is_exact(kv_dtype: str | torch.dtype, bytes_per_token: int) -> None:
    spec = KVCacheSpec.from_config(SMOLLM2, block_size=16, kv_dtype=kv_dtype)
    assert spec.bytes_per_token == bytes_per_token
    assert spec.bytes_per_block == bytes_per_token * 16


def test_allocated_bytes_match_the_spec() -> None:
    for kv_dtype in ("float16", "int8"):
        spec = KVCacheSpec.from_config(TINY_CONFIG, block_size=4, kv_dtype=kv_dtype)
        cache = PagedKVCache(spec, 10, device="cpu", compute_dtype=torch.float32)
        assert cache.num_bytes == 10 * spec.bytes_per_block


def test_gqa_stores_only_kv_heads() -> None:
    mha = ModelConfig(**{**{f: getattr(SMOLLM2, f) for f in SMOLLM2.__dataclass_fields__},
                         "num_kv_heads": 9})
    gqa_spec = KVCacheSpec.from_config(SMOLLM2, block_size=16, kv_dtype="float16")
    mha_spec = KVCacheSpec.from_config(mha, block_size=16, kv_dtype="float16")
    assert mha_spec.bytes_per_token / gqa_spec.bytes_per_token == 9 / 3


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"num_blocks": 7}, 7, id="num-blocks"),
        pytest.param({"kv_cache_gib": 1.0}, 2**30 // (23040 * 16), id="gib"),
    ],
)
def test_plan_num_blocks(kwargs: dict[str, float], expected: int) -> None:
    spec = KVCacheSpec.from_config(SMOLLM2, block_size=16, kv_dtype="float16")
    assert plan_num_blocks(spec, torch.device("cpu"), **kwargs) == expected  # type: ignore[arg-type]


def test_plan_num_blocks_from_free_memory() -> None:
    spec = KVCacheSpec.from_config(TINY_CONFIG, block_size=16, kv_dtype="float32")
    small = plan_num_blocks(spec, torch.device("cpu"), memory_fraction=0.001)
    large = plan_num_blocks(spec, torch.device("cpu"), memory_fraction=0.002)
    assert 0 < small < large


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"num_blocks": 0}, "num_blocks must be >= 1", id="no-blocks"),
        pytest.param({"num_blocks": 4, "kv_cache_gib": 1.0}, "not both", id="both"),
        pytest.param({"kv_cache_gib": -1.0}, "kv_cache_gib must be > 0", id="negative-gib"),
        pytest.param({"kv_cache_gib": 1e-9}, "does not hold one KV block", id="tiny-gib"),
        pytest.param({"memory_fraction": 1.5}, r"memory_fraction must be in \(0, 1\]",
                     id="fraction"),
    ],
)
def test_plan_num_blocks_rejects(kwargs: dict[str, float], message: str) -> None:
    spec = KVCacheSpec.from_config(SMOLLM2, block_size=16, kv_dtype="float16")
    with pytest.raises(ValueError, match=message):
        plan_num_blocks(spec, torch.device("cpu"), **kwargs)  # type: ignore[arg-type]


def test_unknown_kv_dtype() -> None:
    with pytest.raises(ValueError, match="kv_dtype must be one of float32, float16, bfloat16, "
                                         "int8, got 'fp8'"):
        kv_dtype_name("fp8")


def _cache(kv_dtype: str, num_blocks: int = 6, block_size: int = 4) -> PagedKVCache:
    spec = KVCacheSpec.from_config(TINY_CONFIG, block_size=block_size, kv_dtype=kv_dtype)
    return PagedKVCache(spec, num_blocks, device="cpu", compute_dtype=torch.float32)


def _write(cache: PagedKVCache, slots: list[int], k: torch.Tensor, v: torch.Tensor) -> None:
    plan = cache.prepare_write(torch.tensor(slots))
    for layer in range(cache.spec.num_layers):
        cache.write(layer, plan, k, v)


def _tokens(num_tokens: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    shape = (num_tokens, TINY_CONFIG.num_kv_heads, TINY_CONFIG.head_dim)
    return torch.randn(shape, generator=generator) * scale


def test_float_write_then_gather_is_exact() -> None:
    cache = _cache("float32")
    k, v = _tokens(6, 0), _tokens(6, 1)
    _write(cache, [8, 9, 10, 11, 20, 21], k, v)  # block 2 whole, block 5 half
    keys, values = cache.gather(1, torch.tensor([2, 5]))
    assert torch.equal(keys.reshape(-1, *keys.shape[2:])[:6], k)
    assert torch.equal(values.reshape(-1, *values.shape[2:])[:6], v)


def _half_steps(x: torch.Tensor) -> torch.Tensor:
    """Half of each (token, head) vector's quantization step, as [tokens, heads, 1], with room
    for the float16 rounding of the scale."""
    return (x.abs().amax(dim=-1, keepdim=True) / 127 / 2) * (1 + 2**-10) + 1e-7


def test_int8_round_trip_error_is_within_half_a_step() -> None:
    cache = _cache("int8")
    k, v = _tokens(4, 0), _tokens(4, 1)
    _write(cache, [4, 5, 6, 7], k, v)
    keys, values = cache.gather(0, torch.tensor([1]))
    for original, restored in ((k, keys[0]), (v, values[0])):
        assert ((original - restored).abs() <= _half_steps(original)).all()


def test_int8_scale_is_per_token_and_head() -> None:
    cache = _cache("int8")
    k = _tokens(4, 0)
    k[1, 0] *= 1000.0  # an outlier in one token's first head
    _write(cache, [4, 5, 6, 7], k, k)
    assert cache.key_scales.dtype == torch.float16
    assert cache.key_scales.shape == (*cache.keys.shape[:-1],)
    keys, _ = cache.gather(0, torch.tensor([1]))
    # The outlier coarsens only its own vector: every other keeps its own fine step.
    assert ((k - keys[0]).abs() <= _half_steps(k)).all()
    assert (k[[0, 2, 3]] - keys[0, [0, 2, 3]]).abs().max() < 0.05


def test_int8_earlier_tokens_are_never_rewritten() -> None:
    cache = _cache("int8")
    small, large = _tokens(2, 0, scale=0.1), _tokens(2, 1, scale=10.0)
    _write(cache, [4, 5], small, small)
    before = (cache.keys[:, 1].clone(), cache.key_scales[:, 1].clone())
    _write(cache, [6, 7], large, large)  # 100 times larger, same block
    assert torch.equal(cache.keys[:, 1, :2], before[0][:, :2])
    assert torch.equal(cache.key_scales[:, 1, :2], before[1][:, :2])
    keys, _ = cache.gather(0, torch.tensor([1]))
    whole = torch.cat([small, large])
    assert ((whole - keys[0]).abs() <= _half_steps(whole)).all()


def test_int8_one_chunk_or_token_by_token_store_the_same_bits() -> None:
    k, v = _tokens(6, 0), _tokens(6, 1)
    slots = [8, 9, 10, 11, 12, 13]
    at_once, one_by_one = _cache("int8"), _cache("int8")
    _write(at_once, slots, k, v)
    for index, slot in enumerate(slots):
        _write(one_by_one, [slot], k[index:index + 1], v[index:index + 1])
    for name in ("keys", "values", "key_scales", "value_scales"):
        assert torch.equal(getattr(at_once, name), getattr(one_by_one, name)), name


def test_int8_zero_vector_round_trips() -> None:
    cache = _cache("int8")
    zeros = torch.zeros(1, TINY_CONFIG.num_kv_heads, TINY_CONFIG.head_dim)
    _write(cache, [4], zeros, zeros)
    keys, values = cache.gather(0, torch.tensor([1]))
    assert torch.equal(keys[0, 0], zeros[0]) and torch.equal(values[0, 0], zeros[0])


def test_int8_fresh_block_forgets_the_previous_owners_values() -> None:
    cache = _cache("int8")
    _write(cache, [4, 5, 6, 7], _tokens(4, 0, scale=100.0), _tokens(4, 1, scale=100.0))
    small = _tokens(3, 2, scale=0.01)
    _write(cache, [4, 5, 6], small, small)  # a new owner writes from offset 0
    keys, _ = cache.gather(0, torch.tensor([1]))
    assert ((small - keys[0, :3]).abs() <= _half_steps(small)).all()
