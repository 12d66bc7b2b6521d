"""What one shared-stream entry costs a gateway replica's CPU: the writer that sends it and a
reader that wakes for it, through redis-py and through the plain RESP connections
(`backends.resp`) the replicas' loops now use.

Two processes per client, each an ``ApproxIndexSync`` on a private ``redis-server`` (uvloop, as
the gateway runs): the **writer** records one new routing decision every ``--interval-ms`` (each
its own prompt, so each goes out as its own entry, as a replica's changes do at light load: a
flush per change), and the **reader** merges what it reads. Each process measures its own CPU
(user + system) from its first entry to its last (the reader: from the poll, every 100 ms,
that first sees an entry to the one that sees the last); per entry, that is what a replica pays to
send one change and what every other replica pays to hear it. One run measures both clients
one after the other on the same Redis; the figure to quote is the ratio.

    .venv/bin/python -m bench.replicas.sync_cost                # 3 rounds of 2,000 entries
    .venv/bin/python -m bench.replicas.sync_cost --entries 300 --rounds 1   # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

from backends.fleet.approx_sync import APPROX_STREAM, ApproxIndexSync
from bench.common.stats import median
from gateway.cli.localproc import ProcessGroup, start_redis
from routing.index_approx import ApproxPrefixIndex

CLIENTS = ("redis-py", "plain")
SEND_TIMEOUT_S = 10.0  # how long the writer waits for its last entries to reach the stream


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _writer(url: str, client: str, entries: int, interval_s: float) -> dict[str, float]:
    redis = aioredis.Redis.from_url(url)
    index = ApproxPrefixIndex(ttl_s=600)
    sync = ApproxIndexSync(redis, index, "bench-writer", ttl_s=600, flush_interval_s=0.1,
                           is_plain_resp=client == "plain")
    task = asyncio.create_task(sync.run())
    await asyncio.sleep(0.5)  # the reader is reading
    started_s, cpu_before = time.monotonic(), _cpu_s()
    due = time.monotonic()
    for number in range(entries):
        sync.record((number + 1, number + 2), "w0", time.time())
        due += interval_s
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    await asyncio.sleep(interval_s)  # the last one sent
    cpu_s, elapsed_s = _cpu_s() - cpu_before, time.monotonic() - started_s
    # On a busy machine the last flush may still be on its way: stopping the sync now would
    # cancel it, and the reader would wait out its timeout for an entry that never came.
    deadline_s = time.monotonic() + SEND_TIMEOUT_S
    while await redis.xlen(APPROX_STREAM) < entries and time.monotonic() < deadline_s:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await _stop(task)
    await redis.aclose()
    return {"entries": entries, "cpu_s": cpu_s, "elapsed_s": elapsed_s,
            "unsent": sync.num_unsent}


POLL_S = 0.1  # how often the reader looks at its count: about 1 % of what it measures


async def _reader(url: str, client: str, entries: int, timeout_s: float) -> dict[str, float]:
    """Merge the writer's entries into a real index (compiled, the index takes no stand-in);
    CPU from the poll that first sees an entry to the one that sees the last, per entry
    merged in between (two hashes a claim)."""
    redis = aioredis.Redis.from_url(url)
    sync = ApproxIndexSync(redis, ApproxPrefixIndex(ttl_s=600), "bench-reader", ttl_s=600,
                           flush_interval_s=0.1, is_plain_resp=client == "plain")
    await sync.catch_up()
    task = asyncio.create_task(sync.run())
    print("ready", flush=True)
    deadline_s = time.monotonic() + timeout_s
    # Polled: the sync (compiled with mypyc) takes no stand-in index that could signal.
    while sync.num_merged == 0 and time.monotonic() < deadline_s:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    first_merged, first_cpu_s, started_s = sync.num_merged, _cpu_s(), time.monotonic()
    while sync.num_merged < 2 * entries and time.monotonic() < deadline_s:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)
    cpu_s, elapsed_s = _cpu_s() - first_cpu_s, time.monotonic() - started_s
    await _stop(task)
    await redis.aclose()
    return {"entries": (sync.num_merged - first_merged) // 2, "cpu_s": cpu_s,
            "elapsed_s": elapsed_s, "entries_read": sync.num_merged // 2}


def _child(argv: list[str]) -> int:
    role, url, client, entries, extra = argv[0], argv[1], argv[2], int(argv[3]), float(argv[4])
    run = _writer(url, client, entries, extra) if role == "writer" else \
        _reader(url, client, entries, extra)
    print(json.dumps(uvloop.run(run)), flush=True)
    return 0


def measure(url: str, client: str, entries: int, interval_s: float) -> dict[str, Any]:
    """One writer and one reader process through ``client``; CPU-µs per entry of each."""
    timeout_s = entries * interval_s + 30
    command = [sys.executable, "-m", "bench.replicas.sync_cost", "--child"]
    reader = subprocess.Popen([*command, "reader", url, client, str(entries), str(timeout_s)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None
        if reader.stdout.readline().strip() != "ready":
            raise RuntimeError("the reader did not start")
        writer = subprocess.run([*command, "writer", url, client, str(entries),
                                 str(interval_s)], capture_output=True, text=True,
                                timeout=timeout_s, check=True)
        read = json.loads(reader.communicate(timeout=timeout_s)[0].splitlines()[-1])
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    wrote = json.loads(writer.stdout.splitlines()[-1])
    return {"client": client,
            "writer_us_per_entry": wrote["cpu_s"] / wrote["entries"] * 1e6,
            "reader_us_per_entry": read["cpu_s"] / max(read["entries"], 1) * 1e6,
            "reader_entries": read["entries_read"], "writer": wrote, "reader": read}


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--child"]:
        return _child(args_list[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.replicas.sync_cost",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=2000, help="entries per measurement")
    parser.add_argument("--interval-ms", type=float, default=5.0,
                        help="between the writer's decisions (each its own entry)")
    parser.add_argument("--rounds", type=int, default=3, help="each client, alternating")
    parser.add_argument("--out", type=Path, help="JSON path")
    args = parser.parse_args(args_list)
    if args.entries < 1 or args.rounds < 1 or args.interval_ms <= 0:
        print("--entries and --rounds take whole numbers of at least 1, --interval-ms a "
              "positive number", file=sys.stderr)
        return 2
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir, ProcessGroup(log_dir=Path(workdir)) as group:
        url = start_redis(group, Path(workdir))
        for number in range(args.rounds):
            for client in CLIENTS:
                asyncio.run(_clear(url))
                run = measure(url, client, args.entries, args.interval_ms / 1000)
                run["round"] = number + 1
                runs.append(run)
                print(f"  round {number + 1} {client:8} writer {run['writer_us_per_entry']:6.0f} "
                      f"reader {run['reader_us_per_entry']:6.0f} CPU-µs per entry",
                      file=sys.stderr)
    summary = {client: {side: median([r[f"{side}_us_per_entry"] for r in runs
                                      if r["client"] == client])
                        for side in ("writer", "reader")} for client in CLIENTS}
    ratios = {side: summary["plain"][side] / summary["redis-py"][side]
              for side in ("writer", "reader")}
    print("| client | writer CPU-µs per entry | reader CPU-µs per entry |")
    print("| --- | ---: | ---: |")
    for client in CLIENTS:
        print(f"| {client} | {summary[client]['writer']:.0f} | {summary[client]['reader']:.0f} |")
    print(f"| plain / redis-py | {ratios['writer']:.2f} | {ratios['reader']:.2f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": runs, "median": summary, "ratio": ratios,
                                        "entries": args.entries,
                                        "interval_ms": args.interval_ms}, indent=1))
    return 0


async def _clear(url: str) -> None:
    redis = aioredis.Redis.from_url(url)
    await redis.delete(APPROX_STREAM)
    await redis.aclose()


if __name__ == "__main__":
    sys.exit(main())
