"""bench.common.pinning: every thread of a process, and of its children, onto the cores asked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.common.pinning import CorePlan, pin, pin_threads

# A parent that starts a thread and a child process, then waits: three tasks to pin.
_FAMILY = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def family() -> Iterator[tuple[int, int]]:
    parent = subprocess.Popen([sys.executable, "-c", _FAMILY], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{parent.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        yield parent.pid, child
    finally:
        os.kill(child, 9)
        parent.kill()
        parent.wait()


def _affinities(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


def test_every_thread_and_child_is_pinned(family: tuple[int, int]) -> None:
    parent, child = family
    first = frozenset(sorted(os.sched_getaffinity(0))[:1])
    assert len(os.listdir(f"/proc/{parent}/task")) >= 2
    pin(parent, first)
    assert _affinities(parent) == {first}
    assert _affinities(child) == {first}


def test_pin_threads_leaves_the_children_where_they_are(family: tuple[int, int]) -> None:
    parent, child = family
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two cores to tell a pinned thread from one left alone")
    first, everything = frozenset(cpus[:1]), frozenset(cpus)
    pin(parent, everything)
    pin_threads(parent, first)
    assert _affinities(parent) == {first}
    assert _affinities(child) == {everything}


def test_the_driver_goes_beside_the_engines_and_back(family: tuple[int, int]) -> None:
    parent, child = family
    plan = CorePlan.split()
    if plan is None:
        pytest.skip("needs two cores")
    before = frozenset(os.sched_getaffinity(0))
    try:
        plan.pin_driver([parent])
        assert frozenset(os.sched_getaffinity(0)) == plan.engines
        assert _affinities(parent) == {plan.engines} and _affinities(child) == {plan.engines}
        plan.unpin_driver([parent])
        assert frozenset(os.sched_getaffinity(0)) == plan.rest
        assert _affinities(child) == {plan.rest}
    finally:
        pin_threads(os.getpid(), before)


def test_a_plan_splits_the_cores_this_process_may_use() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    plan = CorePlan.split()
    if len(cpus) < 2:
        assert plan is None
        return
    assert plan is not None
    assert plan.engines == {cpus[0]}
    assert plan.rest == set(cpus[1:])
    assert plan.describe() == {"engines": cpus[:1], "rest": cpus[1:]}


def test_keep_self_moves_this_process_and_gives_back_its_set() -> None:
    plan = CorePlan.split()
    if plan is None:
        assert len(os.sched_getaffinity(0)) == 1
        return
    before = frozenset(os.sched_getaffinity(0))
    try:
        assert plan.keep_self() == before
        assert frozenset(os.sched_getaffinity(0)) == plan.rest
    finally:
        pin(os.getpid(), before)
    assert frozenset(os.sched_getaffinity(0)) == before


def test_a_process_that_is_gone_is_left_alone() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    pin(ended.pid, frozenset(sorted(os.sched_getaffinity(0))[:1]))  # must not raise
    assert not os.path.exists(f"/proc/{ended.pid}")
