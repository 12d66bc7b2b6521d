"""The one Prometheus text parser (``backends.fleet.prom``): real pages' shapes and the lines
an engine could send that must be skipped, never raised on."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.fleet.prom import by_label, labels, metric_sums, parse_samples, samples

FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_a_page_of_counters_gauges_and_labels() -> None:
    page = ("# HELP x_total Things.\n# TYPE x_total counter\n"
            'x_total{model_name="a",reason="stop"} 3\n'
            'x_total{model_name="b",reason="len}gth"} 4.5 1700000000000\n'
            "up 1\n\n"
            "x_created 1.7e9\n")
    assert parse_samples(page) == {'x_total{model_name="a",reason="stop"}': 3.0,
                                   'x_total{model_name="b",reason="len}gth"}': 4.5,
                                   "up": 1.0, "x_created": 1.7e9}
    assert metric_sums(page, {"things": ("x_total", "y_total"), "missing": ("z",)}) == {
        "things": 7.5}


@pytest.mark.parametrize("line", [
    "x_total{a=\"1\"}",            # no value
    "x_total{a=\"1\"} many",       # not a number
    "x_total{a=\"1\" 3",           # unclosed labels
    "x_total} 3",                  # a stray brace
    " 3",                          # no name
    "x_total{a=\"1\"}3",           # no space before the value
])
def test_lines_that_do_not_parse_are_skipped(line: str) -> None:
    assert list(samples(line + "\nok 2\n")) == [("ok", "", 2.0)]


def test_non_finite_values_are_kept_as_samples_but_not_summed() -> None:
    page = "g NaN\ng +Inf\ng 2\n"
    assert [value for _, _, value in samples(page)][-1] == 2.0
    assert metric_sums(page, {"g": ("g",)}) == {"g": 2.0}


def test_labels_unescape_quotes_and_backslashes() -> None:
    assert labels('m{a="1",b="q\\"z",c="back\\\\slash"} 2') == {
        "a": "1", "b": 'q"z', "c": "back\\slash"}
    assert labels("m 2") == {}


def test_by_label_keys_a_metric_by_its_label() -> None:
    parsed = parse_samples('r_total{reason="deadline"} 2\nr_total{reason="saturated"} 1\n'
                           "r_total 5\nother{reason=\"x\"} 9\n")
    assert by_label(parsed, "r_total") == {"deadline": 2.0, "saturated": 1.0, "": 5.0}


def test_a_real_vllm_page() -> None:
    page = (FIXTURES / "real_vllm_metrics.txt").read_text()
    sums = metric_sums(page, {"running": ("vllm:num_requests_running",),
                              "waiting": ("vllm:num_requests_waiting",)})
    assert set(sums) == {"running", "waiting"}
    assert all(value >= 0 for value in sums.values())
    sample_lines = [line for line in page.splitlines() if line and not line.startswith("#")]
    assert len(parse_samples(page)) == len(sample_lines)
