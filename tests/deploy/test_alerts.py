"""deploy/prometheus/alerts.yml: well-formed rules, and every metric they name is one a real
gateway exposes (a renamed metric would leave an alert that never fires)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import yaml

from tests.fleet import Gateway

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def _base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _rules() -> list[dict[str, object]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_every_rule_is_complete() -> None:
    rules = _rules()
    assert len(rules) >= 10
    names = [rule["alert"] for rule in rules]
    assert len(set(names)) == len(names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("info", "warning", "critical")  # type: ignore[index]
        assert rule["annotations"]["summary"]  # type: ignore[index]
        assert str(rule["expr"]).count("(") == str(rule["expr"]).count(")")


def test_every_metric_named_is_exposed(gateway: Gateway) -> None:
    scrape = httpx.get(gateway.url + "/metrics", timeout=5).text
    exposed = {_base(m) for m in re.findall(r"^(?:# (?:HELP|TYPE) )?(switchyard_\w+)", scrape,
                                            re.MULTILINE)}
    named = {_base(m) for rule in _rules() for m in re.findall(r"switchyard_\w+",
                                                               str(rule["expr"]))}
    assert named and named <= exposed, sorted(named - exposed)
    assert "switchyard_no_such_metric" not in exposed  # the check can fail
