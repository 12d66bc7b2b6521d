"""A stream on its last step frees its batch slot for the next request: the gateway's books,
and a real gateway that sends a queued request to a one-slot engine while the stream in that
slot still has its last token to come (so the engine starts it as that token's step ends,
instead of idling a step between the two)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from backends.fleet.registry import Backend, BackendRegistry
from gateway.cli.localproc import ProcessGroup
from gateway.router import Router
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.profiles import profile_by_name
from routing.types import BackendProfile
from tests.fleet import Engine, Gateway, wait_until

MAX_TOKENS = 4
TOKEN_DELAY_MS = 300


def one_slot_router() -> tuple[Router, Backend]:
    worker = Backend(name="w0", url="http://127.0.0.1:9", models=frozenset({"m"}),
                     profile=BackendProfile(max_batch=1))
    router = Router(BackendRegistry([worker]), profile_by_name("least_load"),
                    ExactPrefixIndex(block_size=16), ApproxPrefixIndex(), {}, seed=1)
    return router, worker


def test_a_stream_on_its_last_step_counts_once_until_it_ends() -> None:
    router, worker = one_slot_router()
    worker.load_source = "books"
    plan = router.describe("m", {"messages": [{"role": "user", "content": "hi"}]}, "t")
    router.started(worker, plan)
    now_s = time.monotonic()
    assert worker.state(now_s).num_holding == 1
    router.nearly_done(worker, plan)
    router.nearly_done(worker, plan)  # a second call changes nothing
    assert worker.num_ending == 1 and worker.state(now_s + 1).num_holding == 0
    router.finished(worker, plan, had_first_token=True)
    assert worker.num_ending == 0 and worker.num_in_flight == 0
    assert worker.state(now_s + 2).num_holding == 0


def test_the_replicas_hook_hears_which_changes_raise_the_books() -> None:
    """``on_booked`` (``ApproxIndexSync.notify``): True for a dispatch, which the other
    replicas must hear at once; False for what only lowers the books."""
    router, worker = one_slot_router()
    heard: list[bool] = []
    router.on_booked = heard.append
    plan = router.describe("m", {"messages": [{"role": "user", "content": "hi"}]}, "t")
    router.started(worker, plan)
    router.first_token(worker, plan)
    router.nearly_done(worker, plan)
    router.finished(worker, plan, had_first_token=True)
    assert heard == [True, False, False, False]


def test_first_tokens_of_requests_sent_before_the_figures_count_as_started() -> None:
    router, worker = one_slot_router()
    before = router.describe("m", {"messages": [{"role": "user", "content": "a"}]}, "t")
    router.started(worker, before)
    worker.load_observed_s = time.monotonic()  # a scrape: it may have counted `before` waiting
    after = router.describe("m", {"messages": [{"role": "user", "content": "b"}]}, "t")
    router.started(worker, after)
    after.sent_s = worker.load_observed_s + 0.001  # sent after the scrape, whatever the clock
    router.first_token(worker, after)
    assert worker.num_started_since_load == 0
    router.first_token(worker, before)
    assert worker.num_started_since_load == 1


@pytest.fixture(scope="module", params=["books", "metrics"])
def one_slot(request: pytest.FixtureRequest, workdir: Path,
             redis_url: str) -> Iterator[tuple[Gateway, Engine]]:
    """A gateway with SLO admission over one engine declared to run one sequence at a time;
    its load from the gateway's books (no metrics) or from its scraped vLLM gauges."""
    with ProcessGroup() as group:
        extra = ("--no-metrics",) if request.param == "books" else ()
        engine = Engine(group, f"one-slot-{request.param}", extra=extra)
        backend = {**engine.backend_config(), "profile": {"max_batch": 1}}
        gateway = Gateway(group, workdir, redis_url, backends=[backend],
                          routing={"discover_workers": False})
        yield gateway, engine


def test_the_next_request_goes_while_the_last_token_is_on_its_way(
        one_slot: tuple[Gateway, Engine]) -> None:
    """Both requests at the one-slot engine at once: only a request sent before the stream in
    the slot ended (it holds its first token back, so it stays there a while) gets there."""
    gateway, engine = one_slot
    key = gateway.new_key()
    headers = {"Authorization": f"Bearer {key}", "x-switchyard-tier": "batch"}
    body = {"model": engine.models[0], "stream": True, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": "hold the slot"}],
            "mock": {"first_token_delay_ms": 10, "token_delay_ms": TOKEN_DELAY_MS}}
    engine.reset()
    with httpx.Client(base_url=gateway.url, timeout=30) as client, \
            ThreadPoolExecutor(max_workers=1) as pool, \
            client.stream("POST", "/v1/chat/completions", headers=headers, json=body) as first:
        assert first.status_code == 200
        assert wait_until(lambda: engine.stats()["in_flight"] == 1)
        # Queued in the gateway: the slot is taken. Slow to its first token once sent.
        second = pool.submit(httpx.post, gateway.url + "/v1/chat/completions", headers=headers,
                             timeout=30, json={**body, "stream": False, "max_tokens": 1,
                                               "mock": {"first_token_delay_ms": 1500}})
        num_events = 0
        events = first.iter_lines()
        for line in events:
            if line.startswith("data: "):
                num_events += 1
                if num_events == MAX_TOKENS:  # the role event, then all tokens but one
                    break
        # One token to come, TOKEN_DELAY_MS away: the queued request is sent now.
        assert wait_until(lambda: engine.stats()["in_flight"] == 2, timeout_s=5.0), (
            "the queued request was not sent while the stream's last token was due")
        rest = [line for line in events if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        last = json.loads(rest[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        answer = second.result(timeout=30)
        assert answer.status_code == 200, answer.text
    assert wait_until(lambda: engine.stats()["in_flight"] == 0)
