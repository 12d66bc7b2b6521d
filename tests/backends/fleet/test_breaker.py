"""Outlier ejection: failures in a row, an error rate, a latency outlier; a half-open probe
that closes or re-ejects for longer; never more than max_ejected_share of a model's backends."""

from __future__ import annotations

from backends.fleet.breaker import Breaker, BreakerConfig
from backends.fleet.registry import Backend, BackendDown, BackendRegistry


def fleet(num: int = 4, **config: float) -> BackendRegistry:
    backends = [Backend(f"b{i}", f"http://127.0.0.1:{19000 + i}", frozenset({"m"}))
                for i in range(num)]
    return BackendRegistry(backends, breaker=BreakerConfig(**config))  # type: ignore[arg-type]


def test_failures_in_a_row_eject_and_a_success_between_resets_the_count() -> None:
    registry = fleet(consecutive_failures=3)
    backend = registry.backends[0]
    for _ in range(2):
        assert not registry.request_failed(backend, "http_500", 1.0)
    registry.request_succeeded(backend, 1.0)
    assert not registry.request_failed(backend, "http_500", 1.0)
    assert not registry.request_failed(backend, "http_500", 1.0)
    assert registry.request_failed(backend, "http_500", 1.0)
    assert not backend.state(1.1).is_healthy and "3 failures in a row" in backend.breaker.reason
    assert all(b.state(1.1).is_healthy for b in registry.backends[1:])


def test_error_rate_over_the_window_ejects() -> None:
    registry = fleet(consecutive_failures=100, error_rate=0.5, min_requests=10, window_s=5)
    backend = registry.backends[0]
    ejected = []
    for index in range(10):  # alternate: never two failures in a row, half of them failed
        if index % 2:
            ejected.append(registry.request_failed(backend, "timeout", 1.0 + index * 0.1))
        else:
            registry.request_succeeded(backend, 1.0 + index * 0.1)
    assert ejected == [False] * 4 + [True]
    # Old results leave the window: the same share spread over more than window_s does not.
    registry = fleet(consecutive_failures=100, error_rate=0.5, min_requests=10, window_s=5)
    backend = registry.backends[0]
    for index in range(40):
        if index % 2:
            assert not registry.request_failed(backend, "timeout", index * 1.0)
        else:
            registry.request_succeeded(backend, index * 1.0)


def test_half_open_lets_one_probe_through_then_closes_or_ejects_for_longer() -> None:
    registry = fleet(consecutive_failures=1, ejection_s=5, max_ejection_s=12)
    backend = registry.backends[0]
    assert registry.request_failed(backend, "connect", 0.0)
    assert not backend.admits(4.9)
    assert backend.admits(5.0) and backend.breaker.state == "half_open"
    backend.book_started(10, 10)  # the probe goes out: nobody else until it is judged
    assert not backend.admits(5.1)
    assert registry.request_failed(backend, "http_500", 5.2)  # probe failed: 10 s this time
    assert not backend.admits(15.1) and backend.admits(15.2)
    backend.book_started(10, 10)
    assert registry.request_failed(backend, "http_500", 15.3)  # capped at max_ejection_s
    assert backend.breaker.opened_until_s == 15.3 + 12
    assert backend.admits(27.3)
    backend.book_started(10, 10)
    registry.request_succeeded(backend, 27.4)
    assert backend.breaker.state == "closed" and backend.admits(27.5)
    assert backend.breaker.num_ejections == 0 and backend.breaker.num_ejections_total == 3


def test_a_probe_that_ends_without_a_verdict_lets_the_next_one_probe() -> None:
    registry = fleet(consecutive_failures=1)
    backend = registry.backends[0]
    registry.request_failed(backend, "connect", 0.0)
    assert backend.admits(10.0)
    backend.book_started(1, 1)
    assert not backend.admits(10.1)
    backend.book_finished(1, 1, had_first_token=False, was_ending=False)  # the client left
    assert backend.admits(10.2)


def test_never_more_than_the_share_of_a_models_backends_is_ejected() -> None:
    registry = fleet(4, consecutive_failures=1, max_ejected_share=0.5)
    results = [registry.request_failed(b, "connect", 1.0) for b in registry.backends]
    assert results == [True, True, False, False]
    assert sum(b.state(1.0).is_healthy for b in registry.backends) == 2
    single = fleet(1, consecutive_failures=1)
    assert not single.request_failed(single.backends[0], "connect", 1.0)  # the only one stays


def test_latency_outlier_is_ejected_against_the_others() -> None:
    registry = fleet(3, min_requests=5, latency_samples=5, latency_factor=10, latency_min_s=1)
    slow, *fast = registry.backends
    for step in range(5):
        for backend in fast:
            registry.request_succeeded(backend, float(step), 0.05)
        registry.request_succeeded(slow, float(step), 0.4)  # 8x: slow, not an outlier
    assert slow.breaker.state == "closed"
    for step in range(5):
        registry.request_succeeded(slow, 10.0 + step, 3.0)
    assert slow.breaker.state == "open" and "latency outlier" in slow.breaker.reason
    # Below latency_min_s nothing is an outlier, however many times slower.
    registry = fleet(2, min_requests=3, latency_samples=3, latency_min_s=1)
    for step in range(3):
        registry.request_succeeded(registry.backends[1], float(step), 0.001)
        registry.request_succeeded(registry.backends[0], float(step), 0.5)
    assert registry.backends[0].breaker.state == "closed"


def test_disabled_breaker_never_ejects() -> None:
    registry = BackendRegistry([Backend("a", "http://x", frozenset({"m"})),
                                Backend("b", "http://y", frozenset({"m"}))],
                               breaker=BreakerConfig(enabled=False, consecutive_failures=1))
    assert not registry.request_failed(registry.backends[0], "connect", 0.0)
    assert registry.backends[0].admits(0.0)


def test_a_backend_marked_down_fails_the_requests_waiting_for_its_first_byte() -> None:
    class Waiting:
        error: BaseException | None = None

        def interrupt(self, error: BaseException) -> None:
            self.error = error

    registry = fleet(2)
    backend = registry.backends[0]
    waiting = [Waiting(), Waiting()]
    backend.awaiting_head.update(waiting)
    backend.mark_failure("health probe failed: TimeoutError")
    assert all(isinstance(w.error, BackendDown) and "marked down" in str(w.error)
               for w in waiting)
    assert not backend.awaiting_head
    late = Waiting()
    registry.backends[1].awaiting_head.add(late)
    registry.remove("b1")  # a worker that left the fleet
    assert isinstance(late.error, BackendDown)


def test_breaker_window_is_bounded_whatever_the_rate() -> None:
    breaker = Breaker(BreakerConfig(consecutive_failures=10**9, min_requests=10**9))
    for index in range(30_000):
        breaker.succeeded(1.0 + index * 1e-6)
    assert len(breaker._results) <= 10_000
