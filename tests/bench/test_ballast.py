"""bench.common.ballast: a child that burns about the share of a core asked, and ends."""

from __future__ import annotations

import os
import time

import pytest

from bench.common.ballast import Ballast, burn, main


def test_a_ballast_burns_about_what_it_was_asked_and_stops() -> None:
    with Ballast(0.3, max_s=30) as ballast:
        time.sleep(1.5)
    assert ballast.cores is not None
    # Loose bounds: a loaded machine may give it less than asked; it never takes a whole core.
    assert 0.1 < ballast.cores < 0.6
    assert ballast.cpu_s == pytest.approx(ballast.cores * 1.5, rel=0.2)
    child = ballast._child
    assert child is not None and child.returncode is not None


def test_a_ballast_runs_on_the_cores_it_was_given() -> None:
    one = frozenset(sorted(os.sched_getaffinity(0))[-1:])
    with Ballast(0.1, max_s=30, cpus=one) as ballast:
        child = ballast._child
        assert child is not None
        assert frozenset(os.sched_getaffinity(child.pid)) == one
    assert ballast.cores is not None


def test_burn_ends_by_its_deadline() -> None:
    started = time.monotonic()
    burn(0.2, 0.2)
    assert 0.19 < time.monotonic() - started < 2.0


@pytest.mark.parametrize("cores", [0.0, -0.1, 1.5])
def test_a_share_outside_one_core_is_refused(cores: float) -> None:
    with pytest.raises(ValueError, match="cores must be in"):
        Ballast(cores, max_s=1)
    with pytest.raises(ValueError, match="cores must be in"):
        burn(cores, 0.1)
    assert main(["--cores", str(cores), "--seconds", "0.1"]) == 2
