from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from backends.worker.errors import ModelFormatError
from backends.worker.gguf_file import read_dequantized
from backends.worker.load_gguf import hf_name, load_gguf, unpermute_qk
from backends.worker.model import LlamaModel
from tests.backends.worker.checkpoints import (
    TINY_CONFIG,
    as_torch,
    converter_permute,
    random_hf_weights,
    write_gguf,
)
from tests.backends.worker.reference import reference_logits, to_float64

IDS = [1, 5, 9, 33, 2, 70, 70, 12]


def _logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor([ids]), torch.arange(len(ids))[None]))[0]


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [
    pytest.param(4, 4, 8, id="q-or-mha"),
    pytest.param(8, 2, 16, id="k-under-gqa"),
    pytest.param(9, 3, 64, id="smollm2-k"),
])
def test_unpermute_inverts_the_converters_permute(num_heads: int, num_kv_heads: int,
                                                  head_dim: int) -> None:
    weight = np.arange(num_kv_heads * head_dim * 6, dtype=np.float32).reshape(-1, 6)
    permuted = converter_permute(weight, num_heads, num_kv_heads)
    assert not np.array_equal(permuted, weight)
    np.testing.assert_array_equal(unpermute_qk(permuted, num_kv_heads), weight)
    # Row 2i of a permuted head is HF row i, row 2i + 1 is HF row i + head_dim / 2.
    np.testing.assert_array_equal(permuted[1], weight[head_dim // 2])


@pytest.mark.parametrize(("gguf", "hf"), [
    pytest.param("token_embd.weight", "embed_tokens.weight", id="embeddings"),
    pytest.param("output.weight", "lm_head.weight", id="output"),
    pytest.param("output_norm.weight", "norm.weight", id="final-norm"),
    pytest.param("blk.12.attn_k.weight", "layers.12.self_attn.k_proj.weight", id="attn-k"),
    pytest.param("blk.0.ffn_down.weight", "layers.0.mlp.down_proj.weight", id="ffn-down"),
    pytest.param("blk.3.ffn_norm.weight", "layers.3.post_attention_layernorm.weight",
                 id="ffn-norm"),
])
def test_hf_name(gguf: str, hf: str) -> None:
    assert hf_name(gguf) == hf


def test_hf_name_rejects_unknown_tensors() -> None:
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_qkv\.weight"):
        hf_name("blk.0.attn_qkv.weight")


@pytest.mark.parametrize("tied", [pytest.param(False, id="untied"), pytest.param(True, id="tied")])
def test_gguf_model_equals_the_model_built_from_hf_weights(tmp_path: Path, tied: bool) -> None:
    config = dataclasses.replace(TINY_CONFIG, tie_word_embeddings=tied)
    weights = random_hf_weights(config)
    model = load_gguf(write_gguf(tmp_path / "tiny.gguf", config, weights))
    assert model.config == config
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied
    direct = LlamaModel.from_weights(config, as_torch(weights))
    assert torch.equal(_logits(model, IDS), _logits(direct, IDS))


def test_matches_the_reference_on_the_files_own_layout(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, random_hf_weights(TINY_CONFIG))
    expected = reference_logits(to_float64(dict(read_dequantized(path))), TINY_CONFIG, IDS)
    torch.testing.assert_close(_logits(load_gguf(path), IDS).double(), expected,
                               rtol=0, atol=1e-4)


def test_loads_quantized_tensors(tmp_path: Path) -> None:
    qtypes = {"token_embd.weight": gguf.GGMLQuantizationType.Q8_0,
              "blk.0.attn_q.weight": gguf.GGMLQuantizationType.Q4_1,
              "blk.1.attn_k.weight": gguf.GGMLQuantizationType.F16}
    weights = random_hf_weights(TINY_CONFIG)
    path = write_gguf(tmp_path / "tiny-q.gguf", TINY_CONFIG, weights, qtypes)
    model = load_gguf(path)
    raw = dict(read_dequantized(path))
    assert torch.equal(model.embed_tokens.weight, torch.from_numpy(raw["token_embd.weight"]))
    exact = torch.from_numpy(weights["model.layers.0.self_attn.q_proj.weight"])
    q4 = model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q4, exact)  # quantized...
    torch.testing.assert_close(q4, exact, rtol=0, atol=0.15)  # ...but rows back in HF order
    torch.testing.assert_close(_logits(model, IDS).double(),
                               reference_logits(to_float64(raw), TINY_CONFIG, IDS),
                               rtol=0, atol=1e-4)


def test_loads_bf16_on_request(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny.gguf", TINY_CONFIG, random_hf_weights(TINY_CONFIG))
    model = load_gguf(path, dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    assert _logits(model, IDS).dtype == torch.float32
    torch.testing.assert_close(_logits(model, IDS), _logits(load_gguf(path), IDS),
                               rtol=0, atol=0.1)


def test_rejects_llama3_rope_factors(tmp_path: Path) -> None:
    weights = random_hf_weights(TINY_CONFIG)
    path = tmp_path / "rope.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("rope_freqs.weight", np.ones(TINY_CONFIG.head_dim // 2, np.float32))
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFormatError, match="RoPE factors"):
        load_gguf(path)

