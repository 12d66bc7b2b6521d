"""Redis CPU per quota acquire + settle pair: merged per tenant, and one command per op.

A private ``redis-server`` (no persistence) runs the quota store's ``OPS_SCRIPT``
(admission/quota/lua.py) for ``--pairs`` requests with all three limits set, high enough never
to refuse: per write, a batch of acquires, then a write of their settles, as the store's
transports send them. Each batch shape is run twice: merged (one tenant's ops of a write are
one ``EVALSHA``, as ``admission/quota/pipe.merge_calls`` sends them) and one command per op
(the same script, nothing merged). The figure is the server's CPU (/proc/PID/stat, user +
system) per pair; the client is redis-py's pipeline, whose CPU is not counted.

    .venv/bin/python -m bench.admission.redis_cpu            # ~1 minute
    .venv/bin/python -m bench.admission.redis_cpu --pairs 2000 --json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence

import redis

from admission.quota.lua import OPS_SCRIPT
from admission.quota.store import ops_keys
from bench.common.procstat import cpu_seconds
from gateway.cli.localproc import free_port, redis_server_path

LIMITS = (10_000_000, 1_000_000_000, 1_000)  # requests/min, tokens/min, concurrency
HEADER = (60_000, 1_000, "bench-replica")  # lease TTL (ms), concurrency hint (ms), replica
SHAPES = ((1, 1), (4, 1), (32, 1), (32, 8), (32, 32))  # (ops per write, tenants in it)


def run_shape(client: redis.Redis, pid: int, num_pairs: int, batch: int, num_tenants: int,
              merged: bool) -> float:
    """Redis CPU-µs per acquire + settle pair for one batch shape."""
    rpm, tpm, conc = LIMITS
    tenants = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(num_tenants)]
    held = dict.fromkeys(tenants, 0)  # the replica's leases per tenant, as the store counts
    seq = 0
    before = cpu_seconds(pid)
    for start in range(0, num_pairs, batch):
        for kind in ("A", "S"):
            commands: dict[str | int, list[str | int]] = {}
            for offset in range(min(batch, num_pairs - start)):
                tenant = tenants[(start + offset) % num_tenants]
                seq += 1
                op: Sequence[str | int]
                if kind == "A":
                    op = (kind, rpm, tpm, conc, 500, seq, held[tenant], held[tenant] + 1,
                          0, 0, 0, 0, 0)  # no credit back, no block
                    held[tenant] += 1
                else:
                    held[tenant] -= 1
                    op = (kind, tpm, 500, 300, seq, held[tenant])
                group: str | int = tenant if merged else offset
                commands.setdefault(group, [tenant, *HEADER]).extend(op)
            pipe = client.pipeline(transaction=False)
            for owner, *args in commands.values():
                pipe.evalsha(OPS_SCRIPT.sha, 3, *ops_keys(str(owner)), *args)
            pipe.execute()
    return (cpu_seconds(pid) - before) / num_pairs * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admission.redis_cpu",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=20_000, help="per shape and mode")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    port = free_port()
    server = subprocess.Popen([redis_server_path(), "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.script_load(OPS_SCRIPT.text)
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        figures = []
        for batch, num_tenants in SHAPES:
            row: dict[str, float] = {"ops_per_write": batch, "tenants": num_tenants}
            for merged in (True, False):
                row["merged" if merged else "one_per_op"] = run_shape(
                    client, server.pid, args.pairs, batch, num_tenants, merged)
            figures.append(row)
        client.close()
    finally:
        server.terminate()
        server.wait(10)
    if args.json:
        print(json.dumps({"pairs": args.pairs, "figures": figures}, indent=1))
        return 0
    print("Redis CPU-µs per acquire + settle pair")
    print(f"{'ops per write':>14} {'tenants':>8} {'merged':>8} {'one per op':>11}")
    for row in figures:
        print(f"{row['ops_per_write']:>14.0f} {row['tenants']:>8.0f} {row['merged']:>8.1f} "
              f"{row['one_per_op']:>11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
