"""A GGUF file's tensors, found with ``struct`` and dequantized with ``gguf.quants``.

``gguf.GGUFReader`` also gives the tensors, but first spends ~3 s building a numpy view of every
vocabulary and merge string of SmolLM2's header; walking past them with ``struct`` takes ~50 ms.
A test checks this module against GGUFReader.

Example::

    info = read_tensor_infos(path)[8]
    info.name, info.shape, info.tensor_type.name   # ('blk.0.attn_q.weight', (576, 576), 'Q4_1')
    weights = dict(read_dequantized(path))          # name -> float32 array
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize, quant_shape_to_byte_shape

from backends.worker.errors import ModelFormatError

_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
_DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where one tensor lies in the file; ``shape`` is numpy's order (outermost first)."""

    name: str
    shape: tuple[int, ...]
    tensor_type: GGMLQuantizationType
    offset_bytes: int
    num_bytes: int


def read_tensor_infos(path: str | os.PathLike[str]) -> list[TensorInfo]:
    """The tensor directory of a GGUF v2/v3 file, without reading any tensor data."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _parse(data, str(path))


def read_dequantized(path: str | os.PathLike[str]) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, float32 array)`` for every tensor, in file order; each array is a fresh,
    writable copy in numpy's order (for a weight: [out_features, in_features])."""
    infos = read_tensor_infos(path)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for info in infos:
            raw = np.frombuffer(data, dtype=np.uint8, count=info.num_bytes,
                                offset=info.offset_bytes)
            raw = raw.reshape(quant_shape_to_byte_shape(info.shape, info.tensor_type))
            array = dequantize(raw, info.tensor_type)
            if array.dtype != np.float32 or np.may_share_memory(array, raw):
                array = array.astype(np.float32)
            del raw  # the mmap cannot close while a view of it lives
            yield info.name, array.reshape(info.shape)


def _parse(data: mmap.mmap, path: str) -> list[TensorInfo]:
    magic, version, num_tensors, num_kv = struct.unpack_from("<4sIQQ", data, 0)
    if magic != b"GGUF" or version < 2:
        raise ModelFormatError(f"{path}: not a GGUF v2/v3 file")
    offset = 24

    def string() -> str:
        nonlocal offset
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 8 + length
        return data[offset - length:offset].decode("utf-8")

    def skip(kind: int) -> None:
        nonlocal offset
        if kind == _STRING:
            offset += 8 + struct.unpack_from("<Q", data, offset)[0]
        elif kind == _ARRAY:
            item_kind, count = struct.unpack_from("<IQ", data, offset)
            offset += 12
            if item_kind in _SCALAR_SIZES:
                offset += _SCALAR_SIZES[item_kind] * count
            else:
                for _ in range(count):
                    skip(item_kind)
        else:
            offset += _SCALAR_SIZES[kind]

    alignment = _DEFAULT_ALIGNMENT
    for _ in range(num_kv):
        key = string()
        (kind,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if key == "general.alignment" and kind == _UINT32:
            (alignment,) = struct.unpack_from("<I", data, offset)
        skip(kind)

    entries = []
    for _ in range(num_tensors):
        name = string()
        (num_dims,) = struct.unpack_from("<I", data, offset)
        dims = struct.unpack_from(f"<{num_dims}Q", data, offset + 4)
        type_id, relative_offset = struct.unpack_from("<IQ", data, offset + 4 + 8 * num_dims)
        offset += 4 + 8 * num_dims + 12
        entries.append((name, tuple(reversed(dims)), GGMLQuantizationType(type_id),
                        relative_offset))
    data_start = -(-offset // alignment) * alignment

    infos = []
    for name, shape, tensor_type, relative_offset in entries:
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        num_bytes = int(np.prod(shape)) // block_size * type_size
        if data_start + relative_offset + num_bytes > len(data):
            raise ModelFormatError(f"{path}: tensor {name} runs past the end of the file")
        infos.append(TensorInfo(name, shape, tensor_type, data_start + relative_offset,
                                num_bytes))
    return infos
