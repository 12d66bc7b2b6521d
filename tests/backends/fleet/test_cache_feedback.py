"""A backend's expected against reported cached tokens, and when affinity counts as broken."""

from __future__ import annotations

import pytest

from backends.fleet.cache_feedback import WINDOW, CacheFeedback
from gateway.router import reported_cache_usage


def test_totals_and_ratios() -> None:
    feedback = CacheFeedback()
    feedback.add(1000, 800, 600)
    feedback.add(1000, 0, 0)
    assert feedback.num_responses == 2
    assert feedback.hit_ratios() == (0.4, 0.3)


@pytest.mark.parametrize(
    ("reported", "broken"),
    [
        pytest.param(0, True, id="nothing-reported"),
        pytest.param(40, True, id="under-5-percent-of-expected"),
        pytest.param(200, False, id="some-hits"),
    ],
)
def test_broken_after_a_window_of_misses(reported: int, broken: bool) -> None:
    feedback = CacheFeedback()
    for _ in range(WINDOW - 1):
        feedback.add(1000, 900, reported)
        assert not feedback.is_broken()  # not before a whole window
    feedback.add(1000, 900, reported)
    assert feedback.is_broken() is broken


def test_responses_without_an_expectation_do_not_count() -> None:
    feedback = CacheFeedback()
    for _ in range(3 * WINDOW):
        feedback.add(1000, 0, 0)
    assert not feedback.is_broken()


@pytest.mark.parametrize(
    ("tail", "usage"),
    [
        pytest.param(b'"usage":{"prompt_tokens":2012,"total_tokens":2014,"completion_tokens":2,'
                     b'"prompt_tokens_details":{"cached_tokens":1984}}}', (2012, 1984),
                     id="body"),
        pytest.param(b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":3,'
                     b'"prompt_tokens_details":{"cached_tokens":0}}}\n\ndata: [DONE]\n\n',
                     (10, 0), id="stream-usage-event"),
        pytest.param(b'"usage":{"prompt_tokens":10,"prompt_tokens_details":null}', None,
                     id="engine-does-not-say"),
        pytest.param(b'data: [DONE]\n\n', None, id="stream-without-usage"),
    ],
)
def test_reported_cache_usage(tail: bytes, usage: tuple[int, int] | None) -> None:
    assert reported_cache_usage(tail) == usage
