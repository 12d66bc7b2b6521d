"""Load a Hugging Face Llama directory (config.json + *.safetensors) into `LlamaModel`.

Example::

    model = load_hf("models/SmolLM2-135M-Instruct", device="cuda")
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors import safe_open

from backends.worker.config import ModelConfig
from backends.worker.errors import ModelFormatError
from backends.worker.model import LlamaModel

# Buffers some older checkpoints saved; the model recomputes them.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_safetensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in the directory, named as the model names
    its parameters (the ``model.`` prefix dropped)."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{path}: no *.safetensors files found")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                weights[name.removeprefix("model.")] = shard.get_tensor(name)
    return weights


def load_hf(path: str | os.PathLike[str], *, device: torch.device | str = "cpu",
            dtype: torch.dtype | None = None) -> LlamaModel:
    """A `LlamaModel` on ``device`` from a Hugging Face directory (``dtype``: `default_dtype`)."""
    config = ModelConfig.from_hf_dir(path)
    return LlamaModel.from_weights(config, read_safetensors(path), device=device, dtype=dtype)
