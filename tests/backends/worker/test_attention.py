from __future__ import annotations

import pytest
import torch

from backends.worker.attention import ContiguousKVCache, attention
from tests.backends.worker.checkpoints import TINY_CONFIG, tiny_model

IDS = [5, 17, 3, 88, 41, 9, 60, 2, 33]


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return tiny_model()


def _cache(batch_size: int = 1, max_tokens: int = 16) -> ContiguousKVCache:
    return ContiguousKVCache(TINY_CONFIG, batch_size=batch_size, max_tokens=max_tokens,
                             device="cpu", dtype=torch.float32)


@torch.inference_mode()
def test_cached_steps_equal_one_uncached_pass(model) -> None:  # type: ignore[no-untyped-def]
    expected = model(torch.tensor([IDS]), torch.arange(len(IDS))[None])
    cache = _cache()
    outputs = []
    for start, stop in [(0, 4), (4, 5), (5, 8), (8, 9)]:  # prefill, decode, chunk, decode
        positions = torch.arange(start, stop)[None]
        outputs.append(model(torch.tensor([IDS[start:stop]]), positions, cache.view(positions)))
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, rtol=0, atol=1e-5)


@torch.inference_mode()
def test_rows_at_different_positions_share_a_step(model) -> None:  # type: ignore[no-untyped-def]
    rows = [IDS[:6], IDS[3:7]]
    expected = [model(torch.tensor([row]), torch.arange(len(row))[None])[0] for row in rows]
    cache = _cache(batch_size=2)
    first = torch.arange(4)[None].expand(2, 4)
    # Row 1 has two real tokens and two padding ones, whose slots the next step rewrites.
    model(torch.tensor([rows[0][:4], [*rows[1][:2], 0, 0]]), first, cache.view(first))
    second = torch.tensor([[4, 5], [2, 3]])
    out = model(torch.tensor([rows[0][4:], rows[1][2:]]), second, cache.view(second))
    torch.testing.assert_close(out[0], expected[0][4:], rtol=0, atol=1e-5)
    torch.testing.assert_close(out[1], expected[1][2:], rtol=0, atol=1e-5)


def test_stores_only_the_kv_heads() -> None:
    cache = _cache(batch_size=3, max_tokens=20)
    assert cache.keys.shape == (TINY_CONFIG.num_layers, 3, TINY_CONFIG.num_kv_heads, 20,
                                TINY_CONFIG.head_dim)
    assert cache.values.shape == cache.keys.shape


@pytest.mark.parametrize(("positions", "message"), [
    pytest.param([[15, 16]], r"\[0, 16\)", id="past-capacity"),
    pytest.param([[-1, 0]], r"\[0, 16\)", id="negative"),
    pytest.param([[0], [1]], "holds 1 rows", id="batch-mismatch"),
])
def test_view_rejects_bad_positions(positions: list[list[int]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _cache().view(torch.tensor(positions))


def test_grouped_query_heads_share_kv_heads_in_order() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, 5, 8, generator=generator)
    k = torch.randn(1, 2, 5, 8, generator=generator)
    v = torch.randn(1, 2, 5, 8, generator=generator)
    out = attention(q, k, v, 0, None)
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    for head in range(6):  # query heads 0-2 read KV head 0, heads 3-5 KV head 1
        scores = (q[0, head] @ k[0, head // 3].T / 8**0.5).masked_fill(future, -torch.inf)
        expected = torch.softmax(scores, dim=-1) @ v[0, head // 3]
        torch.testing.assert_close(out[0, head], expected, rtol=0, atol=1e-5)
