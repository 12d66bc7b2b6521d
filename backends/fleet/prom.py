"""The Prometheus text format, as switchyard reads it: engines' ``/metrics`` pages (the fleet's
scrape of third-party engines) and every page the benchmarks read (gateways and engines).

A sample line is ``name{labels} value [timestamp]``; comments (``#``) and lines that do not
parse are skipped, never raised on: an engine's page is input the gateway does not control.

Example::

    page = 'vllm:num_requests_running{model_name="m"} 3\\nup 1\\n'
    parse_samples(page)                  # {'vllm:num_requests_running{model_name="m"}': 3.0,
                                         #  'up': 1.0}
    metric_sums(page, {"running": ("vllm:num_requests_running", "sglang:num_running_reqs")})
                                         # {'running': 3.0}
    labels('x{a="1",b="q\\\\"z"} 2')       # {'a': '1', 'b': 'q"z'}
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def samples(text: str) -> Iterator[tuple[str, str, float]]:
    """Each sample of a page: its metric name, its label set as written (``{...}``, or empty)
    and its value."""
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace != -1:
            close = line.rfind("}")
            if close < brace:
                continue
            name, label_set, rest = line[:brace], line[brace:close + 1], line[close + 1:]
        else:
            name, _, rest = line.partition(" ")
            label_set, rest = "", " " + rest
        parts = rest.split()
        name = name.strip()
        if not parts or not rest[:1].isspace() or _NAME.fullmatch(name) is None:
            continue
        try:
            value = float(parts[0])
        except ValueError:
            continue
        yield name, label_set, value


def parse_samples(text: str) -> dict[str, float]:
    """The page as ``{"name{labels}": value}`` (a sample without labels: its name alone)."""
    return {name + label_set: value for name, label_set, value in samples(text)}


def metric_sums(text: str, names: Mapping[str, Collection[str]]) -> dict[str, float]:
    """For each key of ``names``, the sum of the finite values of its metrics over all label
    sets; a key none of whose metrics is on the page is left out."""
    wanted = {metric: key for key, metrics in names.items() for metric in metrics}
    totals: dict[str, float] = {}
    for name, _, value in samples(text):
        key = wanted.get(name)
        if key is not None and math.isfinite(value):
            totals[key] = totals.get(key, 0.0) + value
    return totals


def by_label(parsed: Mapping[str, float], name: str) -> dict[str, float]:
    """The samples of one metric of a ``parse_samples`` page, keyed by their (only) label's
    value; a sample without labels: key ``""``."""
    out: dict[str, float] = {}
    for series, value in parsed.items():
        metric, _, label_set = series.partition("{")
        if metric == name:
            found = labels("{" + label_set) if label_set else {}
            out[next(iter(found.values()), "")] = value
    return out


def labels(line: str) -> dict[str, str]:
    """The labels of one sample line or label set (values unescaped of ``\\"`` and ``\\\\``)."""
    start, end = line.find("{"), line.rfind("}")
    out: dict[str, str] = {}
    if start == -1 or end < start:
        return out
    body = line[start + 1:end]
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq == -1 or eq + 1 >= len(body) or body[eq + 1] != '"':
            break
        name = body[i:eq].strip().lstrip(",").strip()
        j = eq + 2
        value = []
        while j < len(body) and body[j] != '"':
            if body[j] == "\\" and j + 1 < len(body):
                j += 1
            value.append(body[j])
            j += 1
        out[name] = "".join(value)
        i = j + 1
    return out
