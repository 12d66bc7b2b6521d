"""One gateway replica for tests/admission/test_quota.py: wait for "go", then fire acquires.

``python -m tests.admission.quota_replica REDIS_URL TENANT RPM NUM_ATTEMPTS GO_KEY`` prints one
JSON line: how many of its attempts were admitted, why the others were refused, and the
server time at its first and after its last attempt.

``... TENANT MAX_CONCURRENT NUM_ATTEMPTS GO_KEY concurrency``: the attempts are made at once and
held; once every replica has reported (``GO_KEY:held``), the admitted ones are settled
(``GO_KEY:settled``), and the same burst made again after a second "go" (``GO_KEY:2``). It
prints the admitted count of each.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections import Counter

import orjson
import redis.asyncio as aioredis

from admission.quota.store import QuotaLimits, QuotaStore


async def main(redis_url: str, tenant_id: str, rpm: int, num_attempts: int, go_key: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    store = QuotaStore(redis, timeout_s=5.0)
    await redis.ping()  # connected before the start line, so all replicas start together
    await redis.incr(go_key + ":ready")
    await redis.blpop([go_key], timeout=30)
    outcomes: Counter[str] = Counter()
    limits = QuotaLimits(requests_per_minute=rpm)
    started_s, started_us = await redis.time()
    for _ in range(num_attempts):
        decision = await store.acquire(tenant_id, limits, tokens=0, request_id=uuid.uuid4().hex)
        outcomes[decision.refused_by or "admitted"] += 1
    ended_s, ended_us = await redis.time()
    report = {**outcomes, "counters": store.counters(),
              "started_us": started_s * 1_000_000 + started_us,
              "ended_us": ended_s * 1_000_000 + ended_us}
    sys.stdout.write(orjson.dumps(report).decode() + "\n")
    await redis.aclose()


async def concurrency(redis_url: str, tenant_id: str, max_concurrent: int, num_attempts: int,
                      go_key: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    store = QuotaStore(redis, timeout_s=5.0)
    limits = QuotaLimits(max_concurrent=max_concurrent)
    await redis.ping()
    await redis.incr(go_key + ":ready")
    admitted_counts = []
    for round_key in (go_key, go_key + ":2"):
        await redis.blpop([round_key], timeout=30)
        ids = [uuid.uuid4().hex for _ in range(num_attempts)]
        decisions = await asyncio.gather(*[
            store.acquire(tenant_id, limits, tokens=0, request_id=request_id)
            for request_id in ids])
        admitted = [request_id for request_id, decision in zip(ids, decisions, strict=True)
                    if decision.is_allowed]
        admitted_counts.append(len(admitted))
        await redis.incr(go_key + ":held")
        while int(await redis.get(go_key + ":held") or 0) < 3 * len(admitted_counts):
            await asyncio.sleep(0.01)
        await asyncio.gather(*[store.settle(tenant_id, limits, reserved_tokens=0,
                                            actual_tokens=0, request_id=request_id)
                               for request_id in admitted])
        await redis.incr(go_key + ":settled")
    sys.stdout.write(orjson.dumps({"admitted": admitted_counts,
                                   "counters": store.counters()}).decode() + "\n")
    await store.aclose()
    await redis.aclose()


if __name__ == "__main__":
    url, tenant, limit_text, attempts_text, go = sys.argv[1:6]
    if sys.argv[6:] == ["concurrency"]:
        asyncio.run(concurrency(url, tenant, int(limit_text), int(attempts_text), go))
    else:
        asyncio.run(main(url, tenant, int(limit_text), int(attempts_text), go))
