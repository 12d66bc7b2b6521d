"""SamplingParams validation and the sampler: greedy, top-k, top-p, seeds."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from backends.worker.sampling import Sampler, SamplingParams

VOCAB = 50


def _logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"temperature": -0.1}, "temperature must be a finite number >= 0",
                     id="negative-temperature"),
        pytest.param({"temperature": float("nan")}, "temperature must be a finite",
                     id="nan-temperature"),
        pytest.param({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0", id="top-p-zero"),
        pytest.param({"top_p": 1.5}, r"top_p must be in \(0, 1\]", id="top-p-big"),
        pytest.param({"top_k": -2}, "top_k must be an integer >= 1, or 0 / -1 to disable",
                     id="top-k"),
        pytest.param({"top_k": 2.5}, "top_k must be an integer", id="top-k-float"),
        pytest.param({"seed": "7"}, "seed must be an integer, got '7'", id="seed"),
        pytest.param({"max_tokens": 0}, "max_tokens must be an integer >= 1, got 0",
                     id="max-tokens"),
        pytest.param({"max_tokens": True}, "max_tokens must be an integer", id="max-tokens-bool"),
        pytest.param({"stop": "x"}, "stop must be a tuple of strings", id="stop-str"),
        pytest.param({"stop": ("",)}, "each stop string must be a non-empty string",
                     id="stop-empty"),
        pytest.param({"stop": tuple("abcdefghijklmnopq")}, "at most 16 stop strings",
                     id="stop-many"),
        pytest.param({"stop_token_ids": (-1,)}, "stop_token_ids must be non-negative integers",
                     id="stop-ids"),
    ],
)
def test_invalid_params_raise_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_lists_become_tuples() -> None:
    params = SamplingParams(stop=["a"], stop_token_ids=[3])  # type: ignore[arg-type]
    assert (params.stop, params.stop_token_ids) == (("a",), (3,))


def test_greedy_is_argmax() -> None:
    logits = _logits(4)
    sampler = Sampler(torch.device("cpu"), seed=0)
    assert sampler.sample(logits, [SamplingParams()] * 4, [None] * 4) == \
        logits.argmax(-1).tolist()


def test_top_k_one_equals_greedy_at_any_temperature() -> None:
    logits = _logits(8, seed=1)
    sampler = Sampler(torch.device("cpu"), seed=0)
    params = [SamplingParams(temperature=5.0, top_k=1)] * 8
    assert sampler.sample(logits, params, [None] * 8) == logits.argmax(-1).tolist()


def test_tiny_top_p_equals_greedy() -> None:
    logits = _logits(8, seed=2)
    sampler = Sampler(torch.device("cpu"), seed=0)
    params = [SamplingParams(temperature=1.0, top_p=1e-6)] * 8
    assert sampler.sample(logits, params, [None] * 8) == logits.argmax(-1).tolist()


def test_top_k_keeps_only_the_k_most_likely() -> None:
    logits = _logits(1, seed=3).expand(200, VOCAB)
    top3 = set(logits[0].topk(3).indices.tolist())
    sampler = Sampler(torch.device("cpu"), seed=0)
    drawn = sampler.sample(logits, [SamplingParams(temperature=10.0, top_k=3)] * 200,
                           [None] * 200)
    assert set(drawn) == top3


def test_seeded_request_is_reproducible_whatever_its_batch_mates() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    params = SamplingParams(temperature=1.0, seed=1234)

    def draw(batch_mates: int, mate_seed: int) -> list[int]:
        generator = sampler.new_generator(params.seed)
        mates = [SamplingParams(temperature=1.0)] * batch_mates
        drawn = []
        for step in range(20):
            logits = torch.cat([_logits(batch_mates, seed=mate_seed + step),
                                _logits(1, seed=100 + step)])
            row = sampler.sample(logits, [*mates, params], [None] * batch_mates + [generator])
            drawn.append(row[-1])
        return drawn

    alone = draw(0, 0)
    assert draw(3, 7) == alone
    assert draw(5, 99) == alone
    assert len(set(alone)) > 3  # it really samples


def test_unseeded_requests_differ() -> None:
    logits = _logits(1).expand(64, VOCAB)
    sampler = Sampler(torch.device("cpu"), seed=0)
    drawn = sampler.sample(logits, [SamplingParams(temperature=5.0)] * 64, [None] * 64)
    assert len(set(drawn)) > 3


def test_mismatched_rows_are_an_error() -> None:
    with pytest.raises(ValueError, match="2 logits rows, 1 params and 1 generators"):
        Sampler(torch.device("cpu")).sample(_logits(2), [SamplingParams()], [None])
