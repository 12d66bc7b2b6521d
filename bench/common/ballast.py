"""CPU ballast: a process that keeps a set share of one core busy, in small slices.

A control for benchmarks on shared cores: run the reference set-up with the extra CPU the
compared one used, and what is left of the gap is not the CPU. The load comes in slices of
``period_s * cores`` every ``period_s`` (2 ms), about as fine-grained as a gateway's work, so it
delays other processes on its core by about as much as the same CPU spread over many short
callbacks would. Bounded in time (``--seconds``), so a forgotten ballast ends on its own.

Example::

    with Ballast(0.25, max_s=120) as ballast:   # a child process on this process's cores
        ...                                     # drive the reference run
    ballast.cores                                # the share it used (per /proc)

    python -m bench.common.ballast --cores 0.25 --seconds 60
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from types import TracebackType

from bench.common.pinning import pin
from bench.common.procstat import cpu_seconds

PERIOD_S = 0.002


def burn(cores: float, seconds: float, period_s: float = PERIOD_S) -> None:
    """Busy for ``cores * period_s`` of every ``period_s`` until ``seconds`` have passed."""
    if not 0 < cores <= 1:
        raise ValueError(f"cores must be in (0, 1], got {cores}")
    slice_s = period_s * cores
    end = time.monotonic() + seconds
    due = time.monotonic()
    while (now := time.monotonic()) < end:
        spin_until = time.perf_counter() + slice_s
        while time.perf_counter() < spin_until:
            pass
        due += period_s
        if due > now:
            time.sleep(max(0.0, due - time.monotonic()))
        else:
            due = now  # fell behind (the core was busy): start again from now, no catch-up burst


class Ballast:
    """``burn`` in a child process for the ``with`` block; ``cores``: what it used."""

    def __init__(self, cores: float, *, max_s: float, cpus: frozenset[int] | None = None) -> None:
        if not 0 < cores <= 1:
            raise ValueError(f"ballast cores must be in (0, 1], got {cores}")
        self.target = cores
        self.max_s = max_s
        self.cpus = cpus  # the cores it may run on; None: this process's
        self.cores: float | None = None
        self.cpu_s = 0.0  # CPU seconds it used
        self._child: subprocess.Popen[bytes] | None = None
        self._started = (0.0, 0.0)

    def __enter__(self) -> Ballast:
        self._child = subprocess.Popen([sys.executable, "-m", "bench.common.ballast",
                                        "--cores", str(self.target), "--seconds",
                                        str(self.max_s)])
        if self.cpus is not None:
            pin(self._child.pid, self.cpus)
        self._started = (time.monotonic(), cpu_seconds(self._child.pid))
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        child = self._child
        assert child is not None
        if child.poll() is None:
            elapsed_s = time.monotonic() - self._started[0]
            self.cpu_s = cpu_seconds(child.pid) - self._started[1]
            self.cores = self.cpu_s / max(elapsed_s, 1e-9)
            child.kill()
        child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.common.ballast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", type=float, required=True, help="share of one core, (0, 1]")
    parser.add_argument("--seconds", type=float, required=True, help="how long, at most")
    args = parser.parse_args(argv)
    try:
        burn(args.cores, args.seconds)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
