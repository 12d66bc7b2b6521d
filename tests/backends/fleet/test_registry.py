"""The backend registry: membership changes, model lookup and health bookkeeping."""

from __future__ import annotations

import pytest

from backends.fleet.registry import Backend, BackendRegistry
from routing.types import BackendProfile


def _backend(name: str, models: tuple[str, ...] = ("m",)) -> Backend:
    return Backend(name=name, url=f"http://{name}:8000", models=frozenset(models))


def test_workers_join_and_leave_and_the_model_index_follows() -> None:
    registry = BackendRegistry([_backend("a", ("x",))])
    version = registry.version
    registry.add(_backend("b", ("x", "y")))
    assert registry.version > version
    assert [b.name for b in registry.for_model("x")] == ["a", "b"]
    assert registry.models() == ["x", "y"]
    assert registry.remove("b") is not None
    assert registry.for_model("y") == []
    assert not registry.serves("y")
    assert registry.remove("missing") is None


def test_a_name_is_registered_once() -> None:
    registry = BackendRegistry([_backend("a")])
    with pytest.raises(ValueError, match="already registered"):
        registry.add(_backend("a"))


def test_failures_take_a_backend_out_until_it_succeeds() -> None:
    a = _backend("a")
    registry = BackendRegistry([a, _backend("b")])
    a.mark_failure("connection refused")
    assert registry.num_healthy() == 1
    assert a.num_consecutive_failures == 1 and a.last_error == "connection refused"
    assert not a.state(now_s=0.0).is_healthy
    a.mark_success()
    assert registry.num_healthy() == 2 and a.num_consecutive_failures == 0


@pytest.mark.parametrize(
    ("observed_s", "now_s", "age_s"),
    [
        pytest.param(None, 10.0, float("inf"), id="never-observed-is-stale"),
        pytest.param(8.0, 10.0, 2.0, id="two-seconds-old"),
        pytest.param(12.0, 10.0, -2.0, id="observed-after-a-reference-time-is-negative"),
    ],
)
def test_state_reports_the_age_of_the_load_figures(
    observed_s: float | None, now_s: float, age_s: float
) -> None:
    backend = _backend("a")
    backend.load_observed_s = observed_s
    backend.num_waiting = 3
    state = backend.state(now_s)
    assert state.age_s == age_s and state.num_waiting == 3


def test_state_is_rebuilt_only_when_a_figure_or_the_time_changes() -> None:
    backend = _backend("a")
    backend.load_observed_s = 9.0
    first = backend.state(10.0)
    assert backend.state(10.0) is first, "nothing changed: the same state"
    backend.book_started(reserved_tokens=100, pending_prefill_tokens=50)
    changed = backend.state(10.0)
    assert changed is not first and changed.num_in_flight == 1
    backend.mark_failure("refused")
    assert not backend.state(10.0).is_healthy
    later = backend.state(11.5)
    assert later.age_s == 2.5 and not later.is_healthy
    backend.load_observed(11.0)
    assert backend.state(11.5).age_s == 0.5


def test_a_field_set_from_outside_is_seen_once_invalidated() -> None:
    """Compiled, ``Backend`` has no ``__setattr__`` hook: code that sets a field ``state()``
    reads calls ``invalidate()`` (as ``FleetSync`` and ``PeerLoad`` do)."""
    backend = _backend("a")
    backend.load_observed(9.0)
    assert backend.state(10.0).num_waiting == 0
    backend.num_waiting = 7
    backend.invalidate()
    assert backend.state(10.0).num_waiting == 7
    backend.book_started(reserved_tokens=100, pending_prefill_tokens=0)
    backend.book_ending()
    assert backend.state(10.0).num_ending == 1
    backend.book_finished(0, 0, had_first_token=True, was_ending=True)
    assert backend.state(10.0).num_ending == 0


@pytest.mark.parametrize(
    ("running", "waiting", "started", "finished", "expected"),
    [
        pytest.param(4, 1, 0, 0, (4, 1), id="as-reported"),
        pytest.param(4, 1, 1, 0, (5, 0), id="the-one-it-counted-waiting-has-started"),
        pytest.param(4, 1, 1, 1, (4, 0), id="started-and-another-finished"),
        pytest.param(4, 0, 2, 0, (4, 0), id="started-ones-it-never-counted-waiting-change-nothing"),
        pytest.param(2, 3, 1, 4, (0, 1), id="finishes-past-the-running-leave-the-waiting"),
    ],
)
def test_requests_started_since_the_figures_leave_its_queue(
        running: int, waiting: int, started: int, finished: int,
        expected: tuple[int, int]) -> None:
    backend = _backend("a")
    backend.load_observed_s = 9.0
    backend.num_running, backend.num_waiting = running, waiting
    backend.num_started_since_load, backend.num_finished_since_load = started, finished
    state = backend.state(10.0)
    assert (state.num_running, state.num_waiting) == expected
    assert state.num_running + state.num_waiting == max(0, running + waiting - finished)


@pytest.mark.parametrize(
    ("in_flight", "ending", "expected"),
    [
        pytest.param(5, 0, (4, 1, 5), id="one-queued-in-the-engine"),
        pytest.param(5, 1, (4, 0, 4), id="sent-into-the-slot-a-last-step-frees"),
        pytest.param(4, 1, (4, 0, 3), id="a-stream-on-its-last-step-leaves-a-slot"),
        pytest.param(6, 1, (4, 1, 5), id="one-beyond-that-slot-waits"),
    ],
)
def test_books_count_streams_on_their_last_step(in_flight: int, ending: int,
                                                expected: tuple[int, int, int]) -> None:
    """An engine without load metrics (its load is the gateway's books), 4 slots."""
    backend = Backend(name="a", url="http://a:8000", models=frozenset({"m"}),
                      profile=BackendProfile(max_batch=4))
    backend.load_source = "books"
    backend.num_in_flight, backend.num_ending = in_flight, ending
    state = backend.state(10.0)
    assert (state.num_running, state.num_waiting, state.num_holding) == expected


def test_the_books_follow_a_request_from_start_to_finish() -> None:
    """One request's life in the record's books, as the gateway's router and the virtual-time
    simulator's both keep them (``book_*``), against the engine's last figures."""
    backend = Backend(name="w", url="http://127.0.0.1:9", models=frozenset({"m"}),
                      profile=BackendProfile(max_batch=4))
    backend.load_source = "heartbeat"
    backend.num_running, backend.num_waiting = 1, 1
    backend.book_started(reserved_tokens=300, pending_prefill_tokens=100)
    assert (backend.num_in_flight, backend.num_in_flight_tokens,
            backend.num_in_flight_prompt_tokens) == (1, 300, 100)
    backend.load_observed(10.0)  # the engine's figures, taken after it was sent: waiting there
    backend.book_first_token(pending_prefill_tokens=100, sent_s=9.5)
    assert backend.num_in_flight_prompt_tokens == 0
    assert backend.num_running_reported == 2  # it runs now
    backend.book_ending()
    assert backend.state(10.0).num_holding == 1
    backend.book_finished(300, 100, had_first_token=True, was_ending=True)
    assert (backend.num_in_flight, backend.num_in_flight_tokens, backend.num_ending,
            backend.num_finished_since_load) == (0, 0, 0, 1)
    backend.load_observed(10.0, is_new=False)  # the same figures read again: the books stay
    assert (backend.num_finished_since_load, backend.num_started_since_load) == (1, 1)
    backend.load_observed(11.0)  # new figures count it themselves
    assert (backend.num_finished_since_load, backend.num_started_since_load) == (0, 0)


def test_a_request_that_never_got_a_first_token_returns_its_prefill() -> None:
    backend = Backend(name="w", url="http://127.0.0.1:9", models=frozenset({"m"}))
    backend.load_observed(5.0)
    backend.book_started(reserved_tokens=50, pending_prefill_tokens=40)
    backend.book_first_token(pending_prefill_tokens=0, sent_s=6.0)  # sent after the figures
    assert backend.num_started_since_load == 0
    backend.book_finished(50, 40, had_first_token=False, was_ending=False)
    assert (backend.num_in_flight, backend.num_in_flight_prompt_tokens) == (0, 0)
