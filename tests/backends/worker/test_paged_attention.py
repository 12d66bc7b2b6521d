"""Attention over the paged cache equals the model's no-cache forward pass."""

from __future__ import annotations

import pytest
import torch

from backends.worker.kv_cache import KVCacheSpec, PagedKVCache
from backends.worker.model import LlamaModel
from backends.worker.paged_attention import PagedKVView, StepBatch, StepRow
from tests.backends.worker.checkpoints import TINY_CONFIG, tiny_model
from tests.backends.worker.engine_support import prompt

BLOCK = 4


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return tiny_model()


def _cache(kv_dtype: str = "float32", num_blocks: int = 32) -> PagedKVCache:
    spec = KVCacheSpec.from_config(TINY_CONFIG, block_size=BLOCK, kv_dtype=kv_dtype)
    return PagedKVCache(spec, num_blocks, device="cpu", compute_dtype=torch.float32)


@torch.inference_mode()
def _uncached(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Hidden states [len(ids), hidden] of a whole sequence, no cache."""
    return model(torch.tensor([ids]), torch.arange(len(ids))[None])[0]


@torch.inference_mode()
def _run(model: LlamaModel, cache: PagedKVCache, decodes: list[StepRow],
         prefills: list[StepRow]) -> torch.Tensor:
    batch = StepBatch.build(decodes, prefills, block_size=BLOCK, device=torch.device("cpu"))
    return model(batch.input_ids, batch.positions, PagedKVView(cache, batch))[0]


def test_one_shot_prefill_on_scattered_blocks(model: LlamaModel) -> None:
    ids = prompt(0, 11)
    table = [9, 2, 17]  # any blocks, in any order
    hidden = _run(model, _cache(), [], [StepRow(ids, 0, table)])
    torch.testing.assert_close(hidden, _uncached(model, ids), rtol=1e-5, atol=1e-5)


def test_mixed_step_of_chunks_and_decodes(model: LlamaModel) -> None:
    """Step 1 prefills a's first chunk and all of b and c; step 2 runs a's second chunk with
    one decode token each for b and c (different context lengths)."""
    cache = _cache()
    a, b, c = prompt(1, 14), prompt(2, 6), prompt(3, 9)
    tables = {"a": [3, 0, 7, 12], "b": [5, 1], "c": [30, 31, 4]}
    _run(model, cache, [], [StepRow(a[:5], 0, tables["a"]), StepRow(b, 0, tables["b"]),
                            StepRow(c, 0, tables["c"])])
    b_next, c_next = 40, 41
    hidden = _run(model, cache,
                  [StepRow([b_next], len(b), tables["b"]), StepRow([c_next], len(c), tables["c"])],
                  [StepRow(a[5:], 5, tables["a"])])
    expected = torch.cat([_uncached(model, [*b, b_next])[-1:], _uncached(model, [*c, c_next])[-1:],
                          _uncached(model, a)[5:]])
    torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("kv_dtype", "tolerance"), [
    pytest.param("bfloat16", 0.02, id="bfloat16"),  # measured max error 0.007
    pytest.param("float16", 0.005, id="float16"),  # 0.0015
    pytest.param("int8", 0.05, id="int8"),  # 0.023 (per-token scales; per-block gave 0.036)
])
def test_low_precision_kv_stays_close(model: LlamaModel, kv_dtype: str,
                                      tolerance: float) -> None:
    ids = prompt(4, 13)
    cache = _cache(kv_dtype)
    table = [6, 2, 9, 1]
    _run(model, cache, [], [StepRow(ids[:7], 0, table)])
    hidden = _run(model, cache, [], [StepRow(ids[7:12], 7, table)])
    last = _run(model, cache, [StepRow([ids[12]], 12, table)], [])
    exact = _uncached(model, ids)
    torch.testing.assert_close(hidden, exact[7:12], rtol=0, atol=tolerance)
    torch.testing.assert_close(last[0], exact[12], rtol=0, atol=tolerance)


def test_batch_layout() -> None:
    batch = StepBatch.build([StepRow([7], 5, [2, 3])], [StepRow([1, 2, 3], 2, [4, 5])],
                            block_size=BLOCK, device=torch.device("cpu"))
    assert batch.input_ids.tolist() == [[7, 1, 2, 3]]
    assert batch.positions.tolist() == [[5, 2, 3, 4]]
    assert batch.slots.tolist() == [3 * BLOCK + 1, 4 * BLOCK + 2, 4 * BLOCK + 3, 5 * BLOCK + 0]
    assert batch.last_token_index.tolist() == [0, 3]
    assert batch.decode_mask[0, 0, 0].tolist() == [True] * 6 + [False] * 2


@pytest.mark.parametrize(
    ("decodes", "prefills", "message"),
    [
        pytest.param([], [], "at least one row", id="empty"),
        pytest.param([StepRow([1, 2], 0, [0])], [], "exactly one token", id="long-decode"),
    ],
)
def test_batch_rejects(decodes: list[StepRow], prefills: list[StepRow], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepBatch.build(decodes, prefills, block_size=BLOCK, device=torch.device("cpu"))
