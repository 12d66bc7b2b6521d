"""Registry: plugins by type name; settings checked against the factory's signature."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from random import Random
from typing import Any

import pytest

from routing import registry
from routing.plugin import Cycle
from routing.registry import (
    make_filter,
    make_picker,
    make_scorer,
    register_filter,
    register_picker,
    register_scorer,
)
from routing.types import BackendState


@register_filter("test_registry_drop_all")
class DropAll:
    def filter(self, cycle: Cycle, candidates: list[BackendState]) -> list[BackendState]:
        return []


@register_scorer("test_registry_constant")
class Constant:
    def __init__(self, value: float = 0.5) -> None:
        if value < 0:
            raise ValueError("value must be >= 0")
        self.value = value

    def score(self, cycle: Cycle, candidates: Sequence[BackendState]) -> list[float]:
        return [self.value] * len(candidates)


@register_picker("test_registry_last")
class Last:
    def pick(self, candidates: Sequence[BackendState], scores: Sequence[float],
             rng: Random) -> int:
        return len(scores) - 1


def test_registered_types_are_listed() -> None:
    assert "test_registry_drop_all" in registry.filter_types()
    assert "test_registry_constant" in registry.scorer_types()
    assert "test_registry_last" in registry.picker_types()


def test_make_passes_settings() -> None:
    scorer = make_scorer("test_registry_constant", {"value": 0.25}, "scorers[0]")
    assert isinstance(scorer, Constant)
    assert scorer.value == 0.25
    assert isinstance(make_filter("test_registry_drop_all", {}, "filters[0]"), DropAll)
    assert isinstance(make_picker("test_registry_last", {}, "picker"), Last)


@pytest.mark.parametrize(
    ("type_name", "settings", "message"),
    [
        pytest.param("nope", {}, r"^scorers\[0\]\.type: unknown scorer 'nope'; known: ",
                     id="unknown-type"),
        pytest.param("test_registry_constant", {"valeu": 1},
                     r"^scorers\[0\]\.valeu: scorer 'test_registry_constant' takes value$",
                     id="unknown-setting"),
        pytest.param("test_registry_constant", {"value": -1},
                     r"^scorers\[0\]: value must be >= 0$", id="factory-rejects-value"),
    ],
)
def test_make_errors_name_the_key(type_name: str, settings: dict[str, object],
                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_scorer(type_name, settings, "scorers[0]")


def test_plugin_without_settings_says_so() -> None:
    with pytest.raises(ValueError, match="takes no settings"):
        make_filter("test_registry_drop_all", {"x": 1}, "filters[0]")


@pytest.mark.parametrize(
    ("register", "existing"),
    [
        pytest.param(register_filter, "model", id="filter"),
        pytest.param(register_scorer, "prefix", id="scorer"),
        pytest.param(register_picker, "max_score", id="picker"),
    ],
)
def test_duplicate_names_are_refused(register: Callable[[str], Callable[[Any], Any]],
                                     existing: str) -> None:
    with pytest.raises(ValueError, match="already registered"):
        register(existing)(object)


def test_the_plugins_package_registers_every_built_in_module() -> None:
    """A plugin module left out of ``routing.plugins`` would never register: every module in
    the folder is one the package imports."""
    from pathlib import Path

    import routing.plugins

    folder = Path(routing.plugins.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    assert modules == set(routing.plugins.__all__)
    assert registry.filter_types() and registry.scorer_types() and registry.picker_types()
