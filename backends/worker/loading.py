"""Load a model and its tokenizer from a path, offline: a GGUF file or a Hugging Face directory.

Example::

    model, tokenizer = load_model_and_tokenizer()                  # the bundled SmolLM2 GGUF
    model, tokenizer = load_model_and_tokenizer("models/llama", device="auto")
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from backends.tokenizer import (
    ModelTokenizer,
    default_model_path,
    load_default_tokenizer,
    load_tokenizer_from_gguf,
    load_tokenizer_from_json,
)
from backends.worker.errors import ModelFormatError
from backends.worker.load_gguf import load_gguf
from backends.worker.load_hf import load_hf
from backends.worker.model import LlamaModel


def resolve_device(device: torch.device | str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; ValueError for CUDA that is absent."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asked for, but this PyTorch sees no CUDA "
                         "device; use --device cpu or auto")
    return resolved


def load_model_and_tokenizer(
    path: str | os.PathLike[str] | None = None, *, device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[LlamaModel, ModelTokenizer]:
    """The model on ``device`` (``dtype`` default: `default_dtype`) and its tokenizer: from the
    GGUF metadata for a ``.gguf`` file, from ``tokenizer.json`` in a Hugging Face directory."""
    resolved = resolve_device(device)
    if path is None:
        model_path = default_model_path()
        return load_gguf(model_path, device=resolved, dtype=dtype), load_default_tokenizer()
    model_path = Path(path)
    if model_path.is_dir():
        tokenizer_json = model_path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise ModelFormatError(f"{model_path}: a Hugging Face model directory needs "
                                   "tokenizer.json beside config.json")
        return (load_hf(model_path, device=resolved, dtype=dtype),
                load_tokenizer_from_json(tokenizer_json))
    if model_path.suffix == ".gguf" and model_path.is_file():
        return (load_gguf(model_path, device=resolved, dtype=dtype),
                load_tokenizer_from_gguf(model_path))
    raise ModelFormatError(f"{model_path}: not a .gguf file or a Hugging Face model directory")
