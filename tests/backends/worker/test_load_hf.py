from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from backends.worker.errors import ModelFormatError
from backends.worker.load_gguf import load_gguf
from backends.worker.load_hf import load_hf
from backends.worker.model import LlamaModel
from tests.backends.worker.checkpoints import (
    TINY_CONFIG,
    random_hf_weights,
    write_gguf,
    write_hf_dir,
)

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


def _logits(model: LlamaModel) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor([IDS]), torch.arange(len(IDS))[None]))[0]


@pytest.mark.parametrize("tied", [pytest.param(False, id="untied"), pytest.param(True, id="tied")])
def test_hf_and_gguf_loaders_give_identical_logits(tmp_path: Path, tied: bool) -> None:
    config = dataclasses.replace(TINY_CONFIG, tie_word_embeddings=tied)
    weights = random_hf_weights(config, seed=7)
    from_hf = load_hf(write_hf_dir(tmp_path / "hf", config, weights))
    from_gguf = load_gguf(write_gguf(tmp_path / "tiny.gguf", config, weights))
    assert from_hf.config == from_gguf.config == config
    assert torch.equal(_logits(from_hf), _logits(from_gguf))


def test_tied_checkpoint_may_still_carry_lm_head(tmp_path: Path) -> None:
    config = dataclasses.replace(TINY_CONFIG, tie_word_embeddings=True)
    weights = random_hf_weights(config)
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].copy()
    model = load_hf(write_hf_dir(tmp_path, config, weights))
    assert model.lm_head.weight is model.embed_tokens.weight


def test_bf16_checkpoint_is_upcast_to_the_compute_dtype(tmp_path: Path) -> None:
    weights = random_hf_weights(TINY_CONFIG)
    write_hf_dir(tmp_path, TINY_CONFIG, {}, num_shards=0)
    save_file({name: torch.from_numpy(w).bfloat16() for name, w in weights.items()},
              str(tmp_path / "model.safetensors"))
    model = load_hf(tmp_path)
    assert model.dtype == torch.float32
    expected = torch.from_numpy(weights["model.norm.weight"]).bfloat16().float()
    assert torch.equal(model.norm.weight, expected)


@pytest.mark.parametrize(("drop", "extra", "message"), [
    pytest.param("model.layers.1.mlp.up_proj.weight", None, "lacks 1 tensors", id="missing"),
    pytest.param("lm_head.weight", None, "lacks 1 tensors", id="untied-without-lm-head"),
    pytest.param(None, "model.layers.0.self_attn.q_norm.weight", "unknown tensors",
                 id="unknown"),
    pytest.param(None, "model.layers.0.self_attn.rotary_emb.inv_freq", None,
                 id="old-inv-freq-ignored"),
])
def test_checks_the_tensor_set(tmp_path: Path, drop: str | None, extra: str | None,
                               message: str | None) -> None:
    weights = random_hf_weights(TINY_CONFIG)
    if drop:
        del weights[drop]
    if extra:
        weights[extra] = np.ones(8, np.float32)
    write_hf_dir(tmp_path, TINY_CONFIG, weights)
    if message is None:
        load_hf(tmp_path)
        return
    with pytest.raises(ModelFormatError, match=message):
        load_hf(tmp_path)


def test_rejects_a_misshapen_tensor(tmp_path: Path) -> None:
    weights = random_hf_weights(TINY_CONFIG)
    weights["model.norm.weight"] = np.ones(TINY_CONFIG.hidden_size + 1, np.float32)
    with pytest.raises(ModelFormatError, match=r"norm\.weight: shape \(65,\)"):
        load_hf(write_hf_dir(tmp_path, TINY_CONFIG, weights))


def test_rejects_a_directory_without_weights(tmp_path: Path) -> None:
    write_hf_dir(tmp_path, TINY_CONFIG, {}, num_shards=0)
    with pytest.raises(ModelFormatError, match=r"no \*\.safetensors"):
        load_hf(tmp_path)
