"""Read a GGUF file's key/value header with ``struct``: 50x faster than ``gguf.GGUFReader``.

GGUFReader builds a numpy view per string (about 3 s for SmolLM2's 98k vocab and merge
strings); this reads the same header in ~60 ms, which matters when every simulated worker
process loads the tokenizer. Tensor data is never read. A test checks it agrees with GGUFReader.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(path: str | os.PathLike[str], prefix: str = "") -> dict[str, Any]:
    """The key/value pairs of a GGUF v2/v3 header whose key starts with ``prefix``."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        magic, version, _num_tensors, num_kv = struct.unpack_from("<4sIQQ", data, 0)
        if magic != b"GGUF" or version < 2:
            raise ValueError(f"{path}: not a GGUF v2/v3 file")
        offset = 24

        def string() -> str:
            nonlocal offset
            (length,) = struct.unpack_from("<Q", data, offset)
            offset += 8 + length
            return data[offset - length:offset].decode("utf-8")

        def value(kind: int) -> Any:
            nonlocal offset
            if kind == _STRING:
                return string()
            if kind == _ARRAY:
                item_kind, count = struct.unpack_from("<IQ", data, offset)
                offset += 12
                if item_kind in _SCALARS and item_kind != 7:
                    fmt = _SCALARS[item_kind]
                    size = struct.calcsize(fmt)
                    items = list(struct.unpack_from(f"<{count}{fmt[1]}", data, offset))
                    offset += size * count
                    return items
                return [value(item_kind) for _ in range(count)]
            fmt = _SCALARS[kind]
            (scalar,) = struct.unpack_from(fmt, data, offset)
            offset += struct.calcsize(fmt)
            return scalar

        metadata: dict[str, Any] = {}
        for _ in range(num_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", data, offset)
            offset += 4
            item = value(kind)
            if key.startswith(prefix):
                metadata[key] = item
        return metadata
