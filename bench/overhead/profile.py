"""Where the gateway's CPU goes under one benchmark load: py-spy samples, summed by function.

Needs permission to ptrace the gateway (root, or CAP_SYS_PTRACE)::

    python -m bench.overhead.profile --load nonstream --duration 8
    python -m bench.overhead.profile --load rate --native   # with C frames (uvloop, syscalls)

Prints the top functions by own samples ("self") and by samples anywhere on the stack
("inclusive"), as shares of all samples taken while the gateway was on the CPU, then the
inclusive share of each stage of a request (``STAGES``: a sample counts for a stage when a
frame of one of its files is on the stack, except that SLO admission's leave out routing's
decision, which admission calls: ``EXCLUDED``). A stage's share times the bench's CPU-µs per
request is its µs per request. Needs py-spy: a dev dependency (``pip install -e .[dev]``).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path

from bench.overhead.fleet import CHAT_PATH, bench_fleet

LOADS = {
    "nonstream": ["--mode", "closed", "--concurrency", "32", "--max-tokens", "16"],
    "rate": ["--mode", "open", "--rate", "200", "--max-tokens", "16"],
    "stream": ["--mode", "closed", "--concurrency", "32", "--stream", "--max-tokens", "64"],
    "paced": ["--mode", "closed", "--concurrency", "32", "--stream", "--max-tokens", "64",
              "--token-delay-ms", "2"],
}
# Stages of a request, by the files their code is in (substrings of the frames' paths): a
# sample counts for a stage when one of its frames is on the stack, or, for a stage marked
# "own", when the innermost frame is (aiohttp's server calls the handler: on every stack).
STAGES = (
    ("auth", ("gateway/auth.py",), False),
    ("body parsing and validation", ("gateway/validation.py",), False),
    ("quota", ("admission/quota/", "gateway/admit.py"), False),
    ("SLO admission", ("admission/waiting_room.py", "admission/policy.py",
                       "admission/predictor.py", "admission/finishes.py"), False),
    ("routing", ("gateway/router.py", "routing/"), False),
    ("upstream client", ("backends/fleet/",), False),
    ("telemetry (metrics, traces, logs)", ("gateway/observe/", "opentelemetry/",
                                           "prometheus_client/"), False),
    ("usage accounting", ("gateway/usage.py",), False),
    ("aiohttp, own frames", ("aiohttp/",), True),
    ("asyncio and uvloop, own frames", ("asyncio/", "uvloop/"), True),
)
# A stage's samples leave out those of another stage it calls: SLO admission asks routing for
# its decision (one decision for both), which the routing stage counts.
EXCLUDED = {"SLO admission": ("gateway/router.py", "routing/")}
_FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def _short(frame: str) -> str:
    match = _FRAME_RE.match(frame)
    if not match:
        return frame
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = Path(path).name if path.startswith("/") and "/work/" not in path else path
        path = path.split("/main/", 1)[-1]
    return f"{match['func']} ({path})"


def _stacks(raw: str) -> Iterator[tuple[list[str], int]]:
    """Each stack of py-spy's raw (collapsed) output, outermost frame first, with its count."""
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [f for f in stack.split(";") if f]
        if frames:
            yield frames, int(count_text)


def stage_shares(raw: str) -> dict[str, float]:
    """Each stage's inclusive share (0..1) of py-spy's raw stacks (``STAGES``)."""
    stages: Counter[str] = Counter()
    total = 0
    for frames, count in _stacks(raw):
        total += count
        for stage, files, is_own in STAGES:
            looked_at = frames[-1:] if is_own else frames
            if any(name in frame for frame in looked_at for name in files) and not any(
                    name in frame for frame in frames for name in EXCLUDED.get(stage, ())):
                stages[stage] += count
    return {stage: stages[stage] / total if total else 0.0 for stage, _, _ in STAGES}


def record(url: str, pid: int, api_key: str, model: str, load: Sequence[str], *,
           duration_s: float, rate: int = 250, native: bool = False) -> str:
    """py-spy's raw stacks of process ``pid`` for ``duration_s`` while ``bench.common.loadgen``
    drives ``load`` at ``url``'s chat endpoint."""
    with tempfile.TemporaryDirectory(prefix="sy-prof-") as tmp:
        loadgen = subprocess.Popen([
            sys.executable, "-m", "bench.common.loadgen", "--url", url + CHAT_PATH,
            "--key", api_key, "--model", model, "--warmup", "100",
            "--duration", str(duration_s + 3), *load,
        ], stdout=subprocess.DEVNULL)
        raw_path = Path(tmp) / "stacks.txt"
        spy = [_py_spy(), "record", "--pid", str(pid), "--format", "raw",
               "--output", str(raw_path), "--duration", str(max(1, int(duration_s))),
               "--rate", str(rate), "--nonblocking"]
        if native:
            spy.append("--native")
        try:
            subprocess.run(spy, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=duration_s + 60)
        finally:
            loadgen.wait(timeout=duration_s + 60)
        return raw_path.read_text()


def summarise(raw: str, top: int) -> str:
    """Top functions by self and inclusive share of py-spy's raw (collapsed) stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for raw_frames, count in _stacks(raw):
        frames = [_short(f) for f in raw_frames]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [f"{total} samples"]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"-- top {top} by {title} --")
        for frame, count in counter.most_common(top):
            lines.append(f"{100 * count / max(total, 1):6.1f}%  {frame}")
    lines.append("-- stages, inclusive (a stage nested in another counts in both) --")
    for stage, share in stage_shares(raw).items():
        lines.append(f"{100 * share:6.1f}%  {stage}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overhead.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", choices=sorted(LOADS), default="nonstream")
    parser.add_argument("--endpoint", choices=("gateway", "gateway64", "floor"),
                        default="gateway",
                        help="profile the gateway or the bare pass-through proxy")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds sampled")
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--native", action="store_true", help="include C frames")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--raw-out", type=Path, help="also keep py-spy's collapsed stacks here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sy-prof-") as tmp, bench_fleet(Path(tmp)) as fleet:
        url, pid = fleet.proxy(args.endpoint)
        raw = record(url, pid, fleet.api_key, fleet.model, LOADS[args.load],
                     duration_s=args.duration, rate=args.rate, native=args.native)
    if args.raw_out:
        args.raw_out.write_text(raw)
    print(f"{args.endpoint} profile, load {args.load!r}:")
    print(summarise(raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
