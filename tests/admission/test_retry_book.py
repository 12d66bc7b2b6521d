"""Retry-After as a booking: a refused request back in time goes to the front of its tier."""

from __future__ import annotations

import asyncio
import time

import pytest

from admission.retry_book import RetryBook, retry_key
from admission.tiers import Tier, tier_table
from admission.waiting_room import AdmissionRefused, Admitted, SloAdmission
from backends.fleet.registry import Backend, BackendRegistry
from gateway.admit import overloaded
from gateway.router import Router
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.profiles import profile_by_name
from routing.types import BackendProfile
from tests.admission.one_worker import cancel_waiting, principal

KEY_A = retry_key("acme", b'{"model": "m"}')


def test_a_key_is_the_tenant_and_the_body() -> None:
    assert retry_key("acme", b"x") == retry_key("acme", b"x")
    assert retry_key("acme", b"x") != retry_key("other", b"x")
    assert retry_key("acme", b"x") != retry_key("acme", b"y")


@pytest.mark.parametrize(("back_after_s", "redeemed", "kept"), [
    pytest.param(2.0, True, False, id="on-time"),
    pytest.param(1.6, True, False, id="a-little-early"),
    pytest.param(0.5, False, True, id="too-early-keeps-the-ticket"),
    pytest.param(2.0 + 3.5, False, False, id="past-its-grace"),
])
def test_redeem_window(back_after_s: float, redeemed: bool, kept: bool) -> None:
    book = RetryBook(early_s=0.5, grace_s=3.0)
    assert book.issue(KEY_A, "standard", 100.0, 2.0, rate_per_s=10.0) == 2
    assert (book.redeem(KEY_A, 100.0 + back_after_s) is not None) == redeemed
    assert (len(book) == 1) == kept


def test_a_full_second_pushes_the_next_ticket_later() -> None:
    book = RetryBook(share=0.5)
    waits = [book.issue(retry_key("t", bytes([i])), "standard", 100.2, 1.0, rate_per_s=4.0)
             for i in range(5)]
    assert waits == [1, 1, 2, 2, 3]  # 0.5 * 4 = 2 returns a second
    other_tier = book.issue(retry_key("t", b"i"), "interactive", 100.2, 1.0, rate_per_s=4.0)
    assert other_tier == 1  # each tier books its own seconds


def test_the_book_is_bounded_and_forgets_what_expired() -> None:
    book = RetryBook(max_tickets=3, grace_s=1.0)
    for i in range(5):
        book.issue(retry_key("t", bytes([i])), "standard", 100.0, 1.0, rate_per_s=100.0)
    assert len(book) == 3
    assert book.redeem(retry_key("t", bytes([0])), 101.0) is None  # the oldest went first
    book.issue(retry_key("t", b"late"), "standard", 200.0, 1.0, rate_per_s=100.0)
    assert len(book) == 1


def test_reissuing_a_key_replaces_its_ticket() -> None:
    book = RetryBook()
    book.issue(KEY_A, "standard", 100.0, 1.0, rate_per_s=10.0)
    assert book.issue(KEY_A, "standard", 100.0, 5.0, rate_per_s=10.0) == 5
    assert len(book) == 1
    assert book.redeem(KEY_A, 101.0) is None  # early for the new ticket
    assert book.redeem(KEY_A, 105.0) is not None


TIERS = tier_table([Tier("interactive", priority=0, ttft_slo_s=0.5, on_overload="reject"),
                    Tier("standard", priority=1, ttft_slo_s=2.0, max_queue_wait_s=0.05)])


def busy_slo() -> tuple[SloAdmission, Backend]:
    worker = Backend(name="w0", url="http://127.0.0.1:9", models=frozenset({"m"}),
                     profile=BackendProfile(max_batch=4))
    router = Router(BackendRegistry([worker]), profile_by_name("least_load"),
                    ExactPrefixIndex(block_size=16), ApproxPrefixIndex(), {}, seed=1)
    worker.load_observed_s = time.monotonic()
    worker.num_running, worker.num_finished_since_load = 4, 0
    worker.invalidate()
    return SloAdmission(TIERS.values(), router), worker


def admit(admission: SloAdmission, body: bytes, request_id: str) -> asyncio.Task[Admitted]:
    plan = admission.fleet.describe("m", {"messages": [{"role": "user", "content": "hi"}]},
                                     "t")
    return asyncio.create_task(admission.admit(TIERS["standard"], principal().tenant, plan,
                                               request_id, body=body))


async def test_a_refused_request_back_in_time_goes_ahead_of_fresh_ones() -> None:
    admission, worker = busy_slo()
    first = admit(admission, b"first", "r1")
    await asyncio.sleep(0.08)  # past the 50 ms queue wait
    assert admission.dispatch(time.monotonic()) == 0
    with pytest.raises(AdmissionRefused) as refused:
        await first
    assert refused.value.code == "deadline"
    answer = overloaded(refused.value)  # what the gateway sends
    retry_after_s = int(answer.headers["Retry-After"])
    assert answer.status == 503 and retry_after_s == refused.value.retry_after_s >= 1
    assert answer.headers["retry-after-ms"] == str(retry_after_s * 1000)
    await asyncio.sleep(retry_after_s - 0.4)  # back a little early, within early_s
    # A fresh request queued before the retry: fair order alone would serve it first.
    fresh = admit(admission, b"fresh", "r2")
    await asyncio.sleep(0)
    retry = admit(admission, b"first", "r1-retry")
    await asyncio.sleep(0)
    assert "r2" in admission.queue and "r1-retry" in admission.queue
    worker.load_observed_s, worker.num_running = time.monotonic(), 3
    worker.invalidate()
    assert admission.dispatch(time.monotonic()) == 1
    await asyncio.sleep(0)
    assert retry.done() and not fresh.done()
    await retry
    assert admission.retries.num_redeemed == 1
    await cancel_waiting(fresh)


async def test_another_tenants_copy_of_the_body_redeems_nothing() -> None:
    admission, _ = busy_slo()
    admission.retries.issue(retry_key("someone-else", b"same"), "standard", time.monotonic(),
                            1.0, rate_per_s=10.0)
    await asyncio.sleep(1.0)
    task = admit(admission, b"same", "r1")
    await asyncio.sleep(0)
    assert admission.retries.num_redeemed == 0 and len(admission.retries) == 1
    await cancel_waiting(task)
