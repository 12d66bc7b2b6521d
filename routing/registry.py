"""Plugin type names: ``register_filter/scorer/picker(name)`` and the lookups that build them.

A registered plugin is a class (or any factory) whose keyword arguments are its settings; the
registry checks a config's keys against the factory's signature, so a typo is a ValueError that
names the key, not a silent default. Settings arrive as parsed configuration values: a plugin
takes them as ``object`` and checks each itself (``routing.plugin.check_number``), so that a
wrong type names its key compiled or not (a compiled plugin's typed parameter would refuse it
first, without the key: ``routing.native``).

Example::

    @register_filter("small_only")
    class SmallOnly:
        def __init__(self, max_prompt_tokens: object = 1024) -> None:
            self.max_prompt_tokens = check_number("max_prompt_tokens", max_prompt_tokens)
        def filter(self, cycle, candidates): ...

    make_filter("small_only", {"max_prompt_tokens": 512}, where="filters[0]")
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from routing import native
from routing.plugin import Filter, Picker, Scorer

_F = TypeVar("_F", bound=Callable[..., Filter])
_S = TypeVar("_S", bound=Callable[..., Scorer])
_P = TypeVar("_P", bound=Callable[..., Picker])

_FILTERS: dict[str, Callable[..., Filter]] = {}
_SCORERS: dict[str, Callable[..., Scorer]] = {}
_PICKERS: dict[str, Callable[..., Picker]] = {}


def _register(table: dict[str, Any], kind: str, name: str, factory: Any) -> None:
    if name in table:
        raise ValueError(f"{kind} type {name!r} is already registered")
    table[name] = factory


def register_filter(name: str) -> Callable[[_F], _F]:
    """Class decorator: make a Filter available as ``{"type": name}``."""
    def decorate(factory: _F) -> _F:
        _register(_FILTERS, "filter", name, factory)
        return factory
    return decorate


def register_scorer(name: str) -> Callable[[_S], _S]:
    """Class decorator: make a Scorer available as ``{"type": name, "weight": w}``."""
    def decorate(factory: _S) -> _S:
        _register(_SCORERS, "scorer", name, factory)
        return factory
    return decorate


def register_picker(name: str) -> Callable[[_P], _P]:
    """Class decorator: make a Picker available as ``{"type": name}``."""
    def decorate(factory: _P) -> _P:
        _register(_PICKERS, "picker", name, factory)
        return factory
    return decorate


def filter_types() -> list[str]:
    return sorted(_FILTERS)


def scorer_types() -> list[str]:
    return sorted(_SCORERS)


def picker_types() -> list[str]:
    return sorted(_PICKERS)


def _make(table: Mapping[str, Callable[..., Any]], kind: str, type_name: str,
          settings: Mapping[str, Any], where: str) -> Any:
    factory = table.get(type_name)
    if factory is None:
        raise ValueError(f"{where}.type: unknown {kind} {type_name!r}; "
                         f"known: {', '.join(sorted(table))}")
    accepted = _parameters(factory)
    for key in settings:
        if key not in accepted:
            known = ", ".join(accepted) or "no settings"
            raise ValueError(f"{where}.{key}: {kind} {type_name!r} takes {known}")
    try:
        return factory(**settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _parameters(factory: Callable[..., Any]) -> list[str]:
    """The factory's keyword parameters: from its signature, or, for a plugin compiled by
    the native build (which has none to inspect), as the build recorded them."""
    try:
        return list(inspect.signature(factory).parameters)
    except ValueError:
        recorded = native.parameters(factory)
        if recorded is None:
            raise
        return recorded


def all_factories() -> list[Callable[..., Any]]:
    """Every registered plugin factory (the native build records their parameters)."""
    return [*_FILTERS.values(), *_SCORERS.values(), *_PICKERS.values()]


def make_filter(type_name: str, settings: Mapping[str, Any], where: str) -> Filter:
    plugin: Filter = _make(_FILTERS, "filter", type_name, settings, where)
    return plugin


def make_scorer(type_name: str, settings: Mapping[str, Any], where: str) -> Scorer:
    plugin: Scorer = _make(_SCORERS, "scorer", type_name, settings, where)
    return plugin


def make_picker(type_name: str, settings: Mapping[str, Any], where: str) -> Picker:
    plugin: Picker = _make(_PICKERS, "picker", type_name, settings, where)
    return plugin
