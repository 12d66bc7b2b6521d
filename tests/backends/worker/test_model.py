from __future__ import annotations

import pytest
import torch

from backends.worker.model import LlamaModel, RMSNorm, apply_rope, default_dtype
from tests.backends.worker.checkpoints import TINY_CONFIG, as_torch, random_hf_weights


@pytest.mark.parametrize(("device", "dtype"), [
    pytest.param("cpu", torch.float32, id="cpu"),
    pytest.param("cuda", torch.bfloat16, id="cuda"),
    pytest.param(torch.device("cuda", 1), torch.bfloat16, id="cuda-1"),
])
def test_default_dtype(device: str | torch.device, dtype: torch.dtype) -> None:
    assert default_dtype(device) == dtype


def _rope(x: torch.Tensor, position: int, model: LlamaModel) -> torch.Tensor:
    cos, sin = model.rotary(torch.tensor([[position]]))
    return apply_rope(x, cos, sin)


def test_rope_scores_depend_only_on_relative_position() -> None:
    model = LlamaModel.from_weights(TINY_CONFIG, as_torch(random_hf_weights(TINY_CONFIG)))
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 1, 1, 1, TINY_CONFIG.head_dim, generator=generator)
    assert torch.equal(_rope(q, 0, model), q)
    torch.testing.assert_close(_rope(q, 9, model).norm(), q.norm())
    near = (_rope(q, 7, model) * _rope(k, 4, model)).sum()
    far = (_rope(q, 103, model) * _rope(k, 100, model)).sum()
    torch.testing.assert_close(near, far, rtol=0, atol=1e-4)


def test_rms_norm() -> None:
    norm = RMSNorm(4, eps=0.0, dtype=torch.float32)
    norm.weight.data = torch.tensor([1.0, 2.0, 1.0, 1.0])
    out = norm(torch.tensor([[3.0, 3.0, -3.0, 3.0]]))
    assert torch.equal(out, torch.tensor([[1.0, 2.0, -1.0, 1.0]]))


def test_adopts_weights_without_copying() -> None:
    weights = as_torch(random_hf_weights(TINY_CONFIG))
    model = LlamaModel.from_weights(TINY_CONFIG, weights)
    assert model.norm.weight.data_ptr() == weights["norm.weight"].data_ptr()
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training


@torch.inference_mode()
def test_batch_rows_are_independent() -> None:
    model = LlamaModel.from_weights(TINY_CONFIG, as_torch(random_hf_weights(TINY_CONFIG)))
    rows = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]]
    positions = torch.arange(5)[None]
    together = model(torch.tensor(rows), positions.expand(2, 5))
    for i, row in enumerate(rows):
        torch.testing.assert_close(together[i], model(torch.tensor([row]), positions)[0],
                                   rtol=0, atol=1e-5)
