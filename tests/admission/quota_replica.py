"""One gateway replica for tests/admission/test_quota.py: wait for "go", then fire acquires.

``python -m tests.admission.quota_replica REDIS_URL TENANT RPM NUM_ATTEMPTS GO_KEY`` prints one
JSON line: how many of its attempts were admitted, why the others were refused, and the
server time at its first and after its last attempt.
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


if __name__ == "__main__":
    url, tenant, rpm_text, attempts_text, go = sys.argv[1:6]
    asyncio.run(main(url, tenant, int(rpm_text), int(attempts_text), go))
