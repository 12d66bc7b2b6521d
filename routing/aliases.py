"""Public model names: aliases over served models, weighted targets (canaries) and fallbacks.

An alias is a model name clients send that stands for one or more models the fleet serves:

- **targets** with weights: each request goes to one, in proportion to the weights, picked by
  smooth weighted round robin (nginx's): over any run of requests the shares are exact to
  within one request per target, with the picks of each target spread out, not bunched, so a
  1 % canary sees its share from the first hundred requests on;
- **fallbacks**: models tried, in order, when the picked target cannot serve the request (no
  healthy backend, none admissible, the prompt too long for it, the upstream failed before a
  byte was sent). The other targets are tried before the fallbacks: a canary that is down
  sends its share to the stable version, not to a fallback.

An alias may have its own name as a target (``llama`` with targets ``llama`` 95 and
``llama-next`` 5 canaries a new version under the name clients already use), and a served
model's name with fallbacks alone is an alias whose one target is itself. Targets and fallbacks
are served model names, never other aliases, so a lookup is one step and cannot loop.

Pure: no I/O, no clock; the round robin's state is the only thing that changes.

Example::

    aliases = ModelAliases([Alias("chat", (("m-v1", 9.0), ("m-v2", 1.0)), ("small",))])
    aliases.candidates("chat")   # ("m-v1", "m-v2", "small"), then ("m-v1", ...), ... ("m-v2", ...)
    aliases.candidates("m-v1")   # None: not an alias, served as it is
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Alias:
    """A public model name, its weighted targets (``(model, weight)``, weight > 0) and the
    models to fall back to, in order."""

    name: str
    targets: tuple[tuple[str, float], ...]
    fallbacks: tuple[str, ...] = ()


class _Rotation:
    """Smooth weighted round robin over one alias's targets: each pick adds every target's
    weight to its credit and takes the target with the most, which then pays the total."""

    __slots__ = ("_credits", "_models", "_tail", "_total", "_weights")

    def __init__(self, alias: Alias) -> None:
        self._models = [model for model, _ in alias.targets]
        self._weights = [weight for _, weight in alias.targets]
        self._credits = [0.0] * len(self._models)
        self._total = sum(self._weights)
        # What follows the pick: the other targets, heaviest first, then the fallbacks.
        by_weight = sorted(range(len(self._models)), key=lambda i: -self._weights[i])
        self._tail = [
            tuple(_unique([*(self._models[j] for j in by_weight if j != i), *alias.fallbacks],
                          skip=self._models[i]))
            for i in range(len(self._models))]

    def pick(self) -> tuple[str, ...]:
        credits = self._credits
        best = 0
        for i, weight in enumerate(self._weights):
            credits[i] += weight
            if credits[i] > credits[best]:
                best = i
        credits[best] -= self._total
        return (self._models[best], *self._tail[best])


def _unique(names: Iterable[str], *, skip: str) -> list[str]:
    seen = {skip}
    out = []
    for name in names:
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


class ModelAliases:
    """The configured aliases; ``candidates`` answers which served models a name stands for."""

    def __init__(self, aliases: Sequence[Alias] = ()) -> None:
        problems = alias_problems(aliases)
        if problems:
            raise ValueError("; ".join(message for _, message in problems))
        self._by_name = {alias.name: alias for alias in aliases}
        self._rotations = {alias.name: _Rotation(alias) for alias in aliases}

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        """The public names, in configuration order."""
        return list(self._by_name)

    def get(self, name: str) -> Alias | None:
        return self._by_name.get(name)

    def candidates(self, name: str) -> tuple[str, ...] | None:
        """The served models to try for ``name``, in order (this request's weighted pick
        first), or None when ``name`` is no alias. Each call is one request's pick."""
        rotation = self._rotations.get(name)
        return None if rotation is None else rotation.pick()


def alias_problems(aliases: Sequence[Alias]) -> list[tuple[int, str]]:
    """What is wrong with a set of aliases: ``(index of the alias, message)`` per problem
    (a repeated name at its second use); empty when nothing is."""
    problems: list[tuple[int, str]] = []
    alias_names = {alias.name for alias in aliases}
    seen: set[str] = set()
    for index, alias in enumerate(aliases):
        if alias.name in seen:
            problems.append((index, f"alias names must be unique; {alias.name!r} is repeated"))
        seen.add(alias.name)
        if not alias.targets:
            problems.append((index, f"alias {alias.name!r} has no targets"))
        models = [model for model, _ in alias.targets]
        for model in sorted({m for m in models if models.count(m) > 1}):
            problems.append((index, f"alias {alias.name!r} lists the target {model!r} twice"))
        for model, weight in alias.targets:
            if not weight > 0:
                problems.append((index, f"alias {alias.name!r}: the weight of {model!r} must "
                                 f"be > 0, got {weight}"))
        for model in [*models, *alias.fallbacks]:
            if model in alias_names and model != alias.name:
                problems.append((index, f"alias {alias.name!r} names the alias {model!r}; "
                                 "targets and fallbacks must be models the backends serve"))
    return problems
