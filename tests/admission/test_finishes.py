"""Streams seen ending after a worker's heartbeat free their slots in admission's snapshot."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from admission.finishes import RecentFinishes
from admission.tiers import DEFAULT_TIERS, tier_table
from admission.waiting_room import Admitted, SloAdmission
from backends.fleet.registry import Backend
from routing.types import BackendProfile, BackendState, FleetSnapshot, PrefixMatch
from tests.admission.one_worker import one_worker_slo, principal

TIERS = tier_table(DEFAULT_TIERS)
NOW_S = 1000.0


def backend(name: str = "w0", **fields: Any) -> BackendState:
    return BackendState(name=name, models=frozenset({"m"}),
                        profile=BackendProfile(max_batch=4), **fields)


@pytest.mark.parametrize(("ends_s", "state", "reported", "expected_running"), [
    pytest.param([NOW_S - 0.1], backend(age_s=0.3, num_running=4), 4, 3,
                 id="an-end-after-the-heartbeat-frees-a-slot"),
    pytest.param([NOW_S - 0.4], backend(age_s=0.3, num_running=4), 4, 4,
                 id="an-end-before-the-heartbeat-is-already-in-it"),
    pytest.param([NOW_S - 0.29], backend(age_s=0.3, num_running=4), 4, 4,
                 id="an-end-just-after-it-may-be-in-it-too"),
    pytest.param([NOW_S - 0.2, NOW_S - 0.1, NOW_S - 0.05], backend(age_s=0.3, num_running=4),
                 4, 1, id="three-ends"),
    pytest.param([NOW_S - 0.1], backend(age_s=0.3, num_running=2), 4, 2,
                 id="never-raises-what-the-registry-already-subtracted"),
    pytest.param([NOW_S - 0.1] * 6, backend(age_s=0.3, num_running=4), 4, 0,
                 id="never-below-zero"),
    pytest.param([NOW_S - 0.1], backend(name="w1", age_s=0.3, num_running=4), 4, 4,
                 id="ends-on-another-backend-do-not-count"),
])
def test_correct(ends_s: list[float], state: BackendState, reported: int,
                 expected_running: int) -> None:
    finishes = RecentFinishes()
    for end_s in ends_s:
        finishes.record("w0", end_s)
    snapshot = FleetSnapshot(now_s=NOW_S, backends=(state,), prefix=PrefixMatch(), max_age_s=5.0)
    corrected = finishes.correct(snapshot, {state.name: reported}.get)
    assert corrected.backends[0].num_running == expected_running
    assert corrected.backends[0].name == state.name


def test_old_ends_are_forgotten() -> None:
    finishes = RecentFinishes(keep_s=5.0)
    finishes.record("w0", NOW_S - 11.0)
    finishes.record("w0", NOW_S)
    assert finishes.num_after("w0", NOW_S - 20.0) == 1
    assert finishes.num_after("w0", NOW_S) == 0
    assert finishes.num_after("w0", NOW_S - 0.001) == 1


def test_counts_ends_after_a_time_among_many() -> None:
    finishes = RecentFinishes(keep_s=5.0)
    for i in range(10_000):  # 1,000 ends a second for 10 s
        finishes.record("w0", NOW_S - 10.0 + i / 1000)
    assert finishes.num_after("w0", NOW_S - 0.5005) == 500
    assert finishes.num_after("w0", NOW_S - 1.0005) == 1000
    assert len(finishes._ends["w0"]) <= 10_000  # trimmed: at most 2 * keep_s kept


@pytest.fixture
def slo() -> tuple[SloAdmission, Backend]:
    return one_worker_slo()


async def stream_ends_on(slo: SloAdmission, backend: str) -> None:
    """What the proxy does for one stream: first token, then the end."""
    admitted = Admitted("t")
    slo.observe_first_token(admitted, backend, None, 0, 0.1)
    slo.finished(admitted, 100)


@pytest.mark.parametrize(("heartbeat_after_end", "admitted_at_once"), [
    pytest.param(False, True, id="heartbeat-older-than-the-end-slot-is-free"),
    pytest.param(True, False, id="heartbeat-newer-than-the-end-still-full"),
])
async def test_a_slot_freed_after_the_heartbeat_is_seen(
        slo: tuple[SloAdmission, Backend], heartbeat_after_end: bool,
        admitted_at_once: bool) -> None:
    """The registry re-read an older heartbeat (full, nothing finished since): admission still
    sees the slot of the stream that ended after that heartbeat was made."""
    admission, worker = slo
    worker.load_observed_s = time.monotonic() - 0.2
    worker.num_running, worker.num_finished_since_load = 4, 0
    await asyncio.create_task(stream_ends_on(admission, "w0"))
    if heartbeat_after_end:
        worker.load_observed_s = time.monotonic() + 0.05  # made after the end: it says 4
    plan = admission.fleet.describe("m", {"messages": [{"role": "user", "content": "hi"}]},
                                     "t")
    admitted = asyncio.create_task(admission.admit(TIERS["interactive"], principal().tenant, plan,
                                                   "int-1"))
    await asyncio.sleep(0.02)
    assert admitted.done() == admitted_at_once
    if admitted_at_once:
        snapshot = (await admitted).snapshot
        assert snapshot is not None and snapshot.backends[0].num_running == 3
    else:
        assert "int-1" in admission.queue
        admitted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await admitted


async def test_an_end_without_a_first_token_records_nothing(
        slo: tuple[SloAdmission, Backend]) -> None:
    admission, _ = slo

    async def ends_without_stream() -> None:
        admission.finished(Admitted("t"), 100)

    await asyncio.create_task(ends_without_stream())
    assert admission.finishes.num_after("w0", 0.0) == 0
    await asyncio.create_task(stream_ends_on(admission, "w0"))
    assert admission.finishes.num_after("w0", 0.0) == 1


def test_a_correction_is_worked_out_per_change_not_per_request() -> None:
    """The same state object and no new end: the cached correction (the same object) is
    used; a new end or a new state (a heartbeat) works it out again, with the right count."""
    finishes = RecentFinishes()
    finishes.record("w0", NOW_S - 0.1)
    state = backend(age_s=0.3, num_running=4)
    snapshot = FleetSnapshot(now_s=NOW_S, backends=(state,), prefix=PrefixMatch(), max_age_s=5.0)
    reported = {"w0": 4}.get
    first = finishes.correct(snapshot, reported).backends[0]
    assert first.num_running == 3 and finishes.num_worked_out == 1
    again = finishes.correct(FleetSnapshot(now_s=NOW_S, backends=(state,)), reported)
    assert again.backends[0] is first and finishes.num_worked_out == 1
    finishes.record("w0", NOW_S - 0.05)
    assert finishes.correct(snapshot, reported).backends[0].num_running == 2
    assert finishes.num_worked_out == 2
    newer = backend(age_s=0.01, num_running=4)  # a heartbeat after both ends
    assert finishes.correct(FleetSnapshot(now_s=NOW_S, backends=(newer,)), reported
                            ).backends[0] is newer
    assert finishes.num_worked_out == 3
