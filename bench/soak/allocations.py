"""Ask a traced gateway (`bench.soak.traced_gateway`) for a snapshot, and read its answer.

Example::

    request_snapshot(directory, "t060")       # the baseline
    ...
    diff = request_snapshot(directory, "t300")
    top_sites(diff)               # [("gateway/router.py:97", 31.5, 2_900), ...]: MiB, blocks
    heap_figures(diff)            # {"traced_mib": 180.2, "malloc_free_kept_mib": 41.0, ...}
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

_BYTES_PER_MIB = 1024 * 1024


def request_snapshot(directory: Path, label: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Write ``LABEL.request`` and wait for the gateway's ``LABEL.json``; what it says."""
    answer = directory / f"{label}.json"
    (directory / f"{label}.request").touch()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if answer.exists():
            try:
                return dict(orjson.loads(answer.read_bytes()))
            except orjson.JSONDecodeError:
                pass  # still being written
        time.sleep(0.2)
    return {"label": label, "error": f"no snapshot within {timeout_s} s"}


def heap_figures(answer: dict[str, Any]) -> dict[str, float]:
    """MiB traced by tracemalloc, and glibc's heap: in use, free but kept, mmapped blocks."""
    info = answer.get("mallinfo") or {}
    figures: dict[str, float] = {}
    if "traced_bytes" in answer:
        figures["traced_mib"] = answer["traced_bytes"] / _BYTES_PER_MIB
    for name, field in (("malloc_in_use_mib", "uordblks"), ("malloc_free_kept_mib", "fordblks"),
                        ("malloc_mmapped_mib", "hblkhd"), ("malloc_brk_heap_mib", "arena")):
        if field in info:
            figures[name] = info[field] / _BYTES_PER_MIB
    return figures


def _short(site: str, roots: tuple[str, ...]) -> str:
    for root in roots:
        if site.startswith(root):
            return site[len(root):].lstrip("/")
    return site


def top_sites(diff: dict[str, Any], num_sites: int = 10, key: str = "by_line",
              roots: tuple[str, ...] = ()) -> list[tuple[str, float, int]]:
    """The ``num_sites`` allocation sites that grew most: (file:line, MiB grown, blocks grown)."""
    return [(_short(s["site"], roots), s["size_diff_bytes"] / _BYTES_PER_MIB, s["count_diff"])
            for s in diff.get(key, [])[:num_sites]]
