"""A scheduling profile — filters, weighted scorers, one picker — built from a YAML-like dict.

Example::

    profile = build_profile({
        "filters": [{"type": "model"}, {"type": "healthy"}, {"type": "fresh"},
                    {"type": "not_saturated", "max_waiting": 64}],
        "scorers": [{"type": "prefix", "weight": 3}, {"type": "queue", "weight": 1}],
        "picker": {"type": "max_score"},
        "shortlist": {"above": 16, "holders": 4, "sampled": 8},   # optional: large fleets
    }, name="mine")

Every key is checked: an unknown section, plugin type or setting, a missing ``type`` or a bad
weight is a ValueError whose message starts with where it is (``scorers[1].weight: ...``).
``filters`` and ``scorers`` default to none, ``picker`` to ``max_score``, ``weight`` to 1,
``shortlist`` (``routing.shortlist``) to none: every backend is scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import routing.plugins  # noqa: F401  (registers every built-in plugin)
from routing.plugin import Filter, Picker, Scorer, check_number
from routing.registry import make_filter, make_picker, make_scorer
from routing.shortlist import Shortlist

SECTIONS = ("filters", "scorers", "picker", "shortlist")


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    """A scorer, its type name (the reason recorded for it) and its weight."""

    name: str
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class SchedulingProfile:
    """What ``schedule()`` runs, in order: every filter, every scorer, then the picker; over
    the ``shortlist`` alone when it has one and the fleet is larger than its ``above``.

    Example::

        SchedulingProfile("least_load", (ModelFilter(),),
                          (WeightedScorer("queue", QueueScorer(), 1.0),), MaxScorePicker())
    """

    name: str
    filters: tuple[Filter, ...]
    scorers: tuple[WeightedScorer, ...]
    picker: Picker
    shortlist: Shortlist | None = None


def _type_and_settings(entry: object, where: str) -> tuple[str, dict[str, Any]]:
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: expected a mapping with a 'type', got {entry!r}")
    settings = dict(entry)
    type_name = settings.pop("type", None)
    if not isinstance(type_name, str) or not type_name:
        raise ValueError(f"{where}.type: missing or not a string")
    return type_name, settings


def _entries(config: Mapping[str, Any], section: str) -> Sequence[object]:
    entries = config.get(section, ())
    if entries is None:
        return ()
    if isinstance(entries, str | bytes) or not isinstance(entries, Sequence):
        raise ValueError(f"{section}: expected a list, got {entries!r}")
    return entries


def build_profile(config: Mapping[str, Any], name: str = "custom") -> SchedulingProfile:
    """A :class:`SchedulingProfile` from ``config``; a ValueError naming the bad key if not."""
    if not isinstance(config, Mapping):
        raise ValueError(f"profile {name!r}: expected a mapping, got {config!r}")
    for key in config:
        if key not in SECTIONS:
            raise ValueError(f"{key}: unknown profile key; expected {', '.join(SECTIONS)}")
    built_filters = []
    for i, entry in enumerate(_entries(config, "filters")):
        where = f"filters[{i}]"
        type_name, settings = _type_and_settings(entry, where)
        built_filters.append(make_filter(type_name, settings, where))
    built_scorers = []
    for i, entry in enumerate(_entries(config, "scorers")):
        where = f"scorers[{i}]"
        type_name, settings = _type_and_settings(entry, where)
        weight = check_number(f"{where}.weight", settings.pop("weight", 1.0), minimum=0)
        built_scorers.append(WeightedScorer(type_name, make_scorer(type_name, settings, where),
                                            weight))
    picker_entry = config.get("picker") or {"type": "max_score"}
    type_name, settings = _type_and_settings(picker_entry, "picker")
    picker = make_picker(type_name, settings, "picker")
    shortlist_config = config.get("shortlist")
    shortlist = None if shortlist_config is None else Shortlist.from_config(shortlist_config)
    return SchedulingProfile(name, tuple(built_filters), tuple(built_scorers), picker,
                             shortlist)
