"""``python -m bench.soak.traced_gateway serve --config ...``: the gateway under tracemalloc.

For the soak's ``--tracemalloc`` and ``--mallinfo`` diagnoses only: starts tracemalloc
(``SOAK_TRACEMALLOC_FRAMES`` frames a trace, default 8; 0: no tracemalloc, only
``mallinfo2()``), then runs ``python -m gateway`` with the same arguments. A daemon
thread watches ``SOAK_TRACEMALLOC_DIR`` for ``LABEL.request`` files (written by
`bench.soak.allocations.request_snapshot`): the first label's snapshot is kept as the
baseline; each later one is compared with it and the top growing allocation sites, by line and
by traceback, are written to ``LABEL.json``, with glibc's ``mallinfo2()`` (heap bytes in use
and free but kept) so that memory the process holds but no live object uses shows too. The
snapshot is taken while the gateway runs (it holds the GIL for a second or so), so its
requests wait meanwhile.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

_NUM_TOP = 25


_MALLINFO_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                    "uordblks", "fordblks", "keepcost")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO_FIELDS]


def mallinfo() -> dict[str, int]:
    """glibc's heap figures: ``arena`` (brk heap), ``hblkhd`` (mmapped blocks), ``uordblks``
    (in use), ``fordblks`` (free, still mapped); empty where there is no ``mallinfo2``."""
    try:
        call = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return {}
    call.restype = _MallInfo2
    info = call()
    return {name: int(getattr(info, name)) for name in _MALLINFO_FIELDS}


def _stat_json(stat: tracemalloc.StatisticDiff) -> dict[str, Any]:
    frames = [f"{frame.filename}:{frame.lineno}" for frame in stat.traceback]
    return {"site": frames[0] if frames else "?", "traceback": frames,
            "size_diff_bytes": stat.size_diff, "size_bytes": stat.size,
            "count_diff": stat.count_diff, "count": stat.count}


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(False, tracemalloc.__file__),))


def _compare(baseline: tracemalloc.Snapshot, label: str, started: float) -> dict[str, Any]:
    snapshot = _snapshot()
    current, peak = tracemalloc.get_traced_memory()
    return {
        "label": label, "t_s": time.monotonic() - started,
        "traced_bytes": current, "traced_peak_bytes": peak, "mallinfo": mallinfo(),
        "by_line": [_stat_json(s) for s in snapshot.compare_to(baseline, "lineno")[:_NUM_TOP]],
        "by_traceback": [_stat_json(s)
                         for s in snapshot.compare_to(baseline, "traceback")[:_NUM_TOP]],
    }


def _watch(directory: Path) -> None:
    started = time.monotonic()
    baseline: tracemalloc.Snapshot | None = None
    while True:
        for request in sorted(directory.glob("*.request")):
            label = request.stem
            if not tracemalloc.is_tracing():
                document: dict[str, Any] = {"label": label, "t_s": time.monotonic() - started,
                                            "mallinfo": mallinfo()}
            elif baseline is None:
                baseline = _snapshot()
                current, _ = tracemalloc.get_traced_memory()
                document = {"label": label, "t_s": time.monotonic() - started,
                                            "traced_bytes": current, "mallinfo": mallinfo(),
                                            "is_baseline": True}
            else:
                document = _compare(baseline, label, started)
            (directory / f"{label}.json").write_bytes(orjson.dumps(document))
            request.unlink()
        time.sleep(0.2)


def main() -> None:
    directory = Path(os.environ["SOAK_TRACEMALLOC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    num_frames = int(os.environ.get("SOAK_TRACEMALLOC_FRAMES", "8"))
    if num_frames > 0:
        tracemalloc.start(num_frames)
    threading.Thread(target=_watch, args=(directory,), name="soak-tracemalloc",
                     daemon=True).start()
    sys.argv = ["gateway", *sys.argv[1:]]
    runpy.run_module("gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
