"""Teacher-forced scoring: decode steps and prefill chunks give the same scores, and a KV dtype
scored against itself has no error."""

from __future__ import annotations

import pytest
import torch

from bench.worker.models import tiny_random_model
from bench.worker.teacher import teacher_forced


@pytest.fixture(scope="module")
def rows() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return torch.randint(100, 49152, (3, 40), generator=generator).tolist()


@pytest.mark.parametrize("kv_dtype", [pytest.param(name, id=name)
                                      for name in ("float32", "int8")])
def test_chunked_scores_equal_token_by_token(rows: list[list[int]], kv_dtype: str) -> None:
    """int8 KV is quantized per token, so how the tokens were written cannot matter."""
    model = tiny_random_model(device="cpu")
    by_token, by_chunk = (
        teacher_forced(model, rows, num_prefill_tokens=8, kv_dtypes=[kv_dtype],
                       reference=kv_dtype, chunk_tokens=chunk, block_size=4)[kv_dtype]
        for chunk in (1, 7))
    assert by_token.nll.shape == (3, 32)
    torch.testing.assert_close(by_chunk.nll, by_token.nll, rtol=0, atol=1e-4)
    assert torch.equal(by_chunk.argmax, by_token.argmax)


def test_scores_against_the_reference(rows: list[list[int]]) -> None:
    model = tiny_random_model(device="cpu")
    scores = teacher_forced(model, rows, num_prefill_tokens=[8, 8, 8],
                            kv_dtypes=["float32", "int8"], reference="float32", chunk_tokens=5)
    assert scores["float32"].num_logits == 0 and scores["float32"].mean_abs_error == 0
    assert scores["int8"].num_logits == 3 * 32 * 49152
    assert 0 < scores["int8"].mean_abs_error < 0.05
    assert scores["int8"].perplexity == pytest.approx(scores["float32"].perplexity, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"num_prefill_tokens": [8, 9, 8]}, "same number", id="ragged"),
        pytest.param({"num_prefill_tokens": 40}, "same number", id="nothing-scored"),
        pytest.param({"num_prefill_tokens": 8, "reference": "int8"}, "reference", id="reference"),
    ],
)
def test_rejects(rows: list[list[int]], kwargs: dict[str, object], message: str) -> None:
    settings: dict[str, object] = {"kv_dtypes": ["float32"], "reference": "float32", **kwargs}
    with pytest.raises(ValueError, match=message):
        teacher_forced(tiny_random_model(device="cpu"), rows, **settings)  # type: ignore[arg-type]
