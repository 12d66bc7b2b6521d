"""A generated run against a real gateway: 10,000 requests drawn from its OpenAPI document.

A real ``switchyard serve`` with Redis, in front of a real simulated engine, all on loopback.
Requests come from ``tests.fuzz.http_cases`` (every documented operation, valid and broken
bodies, wrong credentials, content types, encodings, methods and paths) and
``tests.fuzz.wire`` (raw bytes no client would send); hypothesis draws them with a fixed seed,
and they go out concurrently over aiohttp. Every reply must pass ``tests.fuzz.checks``: no 5xx
the gateway caused, every error OpenAI-shaped. A failure already understood is counted under
its name in ``tests.fuzz.known_bugs`` (and reproduced in ``test_known_bugs.py``); any other
fails the test, with its reproducer and the gateway's log.
"""

from __future__ import annotations

import asyncio
import collections
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gateway.openapi import document
from tests.fuzz.checks import Checker
from tests.fuzz.conftest import Fleet
from tests.fuzz.http_cases import (
    CASES_PER_BATCH,
    Case,
    Credentials,
    budget,
    operation_cases,
)
from tests.fuzz.known_bugs import KNOWN_BUGS
from tests.fuzz.wire import Reply, raw_cases, send

NUM_INPUTS = 10_000
CONCURRENCY = 16  # enough to keep both processes busy, too few to overload one engine


def generate(batches: st.SearchStrategy[list[Case]], count: int) -> list[Case]:
    """``count`` cases, the same ones every run (a fixed seed, no example database)."""
    cases: list[Case] = []

    @settings(max_examples=-(-count // CASES_PER_BATCH), derandomize=True, database=None,
              deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(batches)
    def collect(batch: list[Case]) -> None:
        cases.extend(batch)

    collect()
    return cases[:count]


def all_cases(doc: dict[str, Any], creds: Credentials, total: int) -> list[Case]:
    strategies = operation_cases(doc, creds)
    strategies["raw"] = st.lists(raw_cases(creds), min_size=CASES_PER_BATCH,
                                 max_size=CASES_PER_BATCH)
    counts = budget(sorted(strategies), total)
    cases = [case for name, count in counts.items()
             for case in generate(strategies[name], count)]
    random.Random(0).shuffle(cases)  # operations interleaved, as clients send them
    return cases


async def send_all(url: str, cases: list[Case]) -> list[tuple[Case, Reply | None, str]]:
    """Every case's reply (``None``: closed without one) and the client's error, if any."""
    host, port = url.removeprefix("http://").split(":")
    queue: asyncio.Queue[Case] = asyncio.Queue()
    for case in cases:
        queue.put_nowait(case)
    results: list[tuple[Case, Reply | None, str]] = []
    # A connection per request: a reply (or a dropped connection) belongs to its own request,
    # not to whichever request used the connection before it.
    connector = aiohttp.TCPConnector(limit=CONCURRENCY, force_close=True)
    async with aiohttp.ClientSession(
            connector=connector,
            skip_auto_headers=("Content-Type", "User-Agent", "Accept-Encoding")) as session:

        async def worker() -> None:
            while not queue.empty():
                case = queue.get_nowait()
                try:
                    results.append((case, await send(session, host, int(port), case), ""))
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    results.append((case, None, f"{type(exc).__name__}: {exc}"))

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return results


def _report(failures: list[tuple[Case, Reply | None, list[str]]], workdir: Path) -> str:
    """The first failures with their reproducers; all of them go to a file beside the logs."""
    kinds = collections.Counter(problem for _, _, problems in failures for problem in problems)
    every = workdir / "failures.txt"
    every.write_text("".join(
        f"{case.operation}: {problems}\n  {case.reproducer()}\n  -> "
        f"{f'{reply.status} {reply.headers} {reply.body[:400]!r}' if reply else 'no reply'}\n"
        for case, reply, problems in failures))
    lines = [f"{len(failures)} replies failed the checks (all in {every}): "
             f"{dict(kinds.most_common(10))}"]
    for case, reply, problems in failures[:8]:
        answer = f"{reply.status} {reply.body[:300]!r}" if reply else "no reply"
        lines += [f"- {case.operation}: {problems}", f"  {case.reproducer()}",
                  f"  -> {answer}"]
    logs = sorted(workdir.glob("gateway-*.log"))
    if logs:
        lines += ["gateway log tail:", *logs[0].read_text().splitlines()[-30:]]
    return "\n".join(lines)


def test_generated_requests_get_no_gateway_5xx_and_only_openai_errors(fleet: Fleet) -> None:
    doc = httpx.get(fleet.gateway.url + "/openapi.json", timeout=10).json()
    assert doc == document()
    creds = fleet.credentials
    started_s = time.perf_counter()
    cases = all_cases(doc, creds, NUM_INPUTS)
    generated_s = time.perf_counter()
    results = asyncio.run(send_all(fleet.gateway.url, cases))
    sent_s = time.perf_counter()
    checker = Checker(doc)
    failures = []
    statuses: collections.Counter[int] = collections.Counter()
    known: collections.Counter[str] = collections.Counter()
    for case, reply, client_error in results:
        statuses[reply.status if reply else 0] += 1
        problems = checker.problems(case, reply)
        if client_error:
            problems.append(client_error)
        bug = next((bug for bug in KNOWN_BUGS if bug.matches(case, reply)), None)
        if problems and bug is not None:
            known[bug.name] += 1
        elif problems:
            failures.append((case, reply, problems))
    print(f"{len(results)} requests: generated in {generated_s - started_s:.1f} s, sent in "
          f"{sent_s - generated_s:.1f} s; statuses (0: no reply) {sorted(statuses.items())}; "
          f"known bugs {dict(known)}")
    assert len(cases) == NUM_INPUTS
    assert not failures, _report(failures, fleet.workdir)
    # The run got through to the engine, streams included, not only down the error paths.
    completions = [r for c, r, _ in results if c.operation.startswith("POST /v1/")]
    answered = [r for r in completions if r and r.status == 200]
    streamed = [r for r in answered if r.headers["content-type"].startswith("text/event-stream")]
    assert len(answered) > len(completions) // 8
    assert len(streamed) >= 20  # and streams among them
