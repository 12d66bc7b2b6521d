"""The fleet the gateway knows: backends, the models each serves, and their health.

Selection is smooth weighted round-robin among healthy backends serving the model (the
routing issue replaces it with the scheduler). ``candidates()`` returns the pick first and the
other healthy backends after it, so a retry goes to a different backend.

Example::

    registry = BackendRegistry([Backend("a", "http://127.0.0.1:19001", frozenset({"m"}))])
    first, *fallbacks = registry.candidates("m")
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class Backend:
    name: str
    url: str
    models: frozenset[str]
    weight: float = 1.0
    health_path: str = "/health"
    api_key: str | None = None
    is_healthy: bool = True
    num_consecutive_failures: int = 0
    last_error: str = ""
    _current_weight: float = field(default=0.0, repr=False)

    def mark_success(self) -> None:
        self.is_healthy = True
        self.num_consecutive_failures = 0
        self.last_error = ""

    def mark_failure(self, reason: str) -> None:
        """A failed request or probe takes the backend out until a probe succeeds."""
        self.is_healthy = False
        self.num_consecutive_failures += 1
        self.last_error = reason


class BackendRegistry:
    def __init__(self, backends: list[Backend]) -> None:
        self.backends = backends
        self._by_model: dict[str, list[Backend]] = {}
        for backend in backends:
            for model in backend.models:
                self._by_model.setdefault(model, []).append(backend)

    def models(self) -> list[str]:
        return sorted(self._by_model)

    def serves(self, model: str) -> bool:
        return model in self._by_model

    def num_healthy(self) -> int:
        return sum(1 for b in self.backends if b.is_healthy)

    def candidates(self, model: str) -> list[Backend]:
        """Healthy backends for ``model``: the weighted round-robin pick first, then the rest."""
        pool = self._by_model.get(model)
        if not pool:
            return []
        healthy = [b for b in pool if b.is_healthy]
        if len(healthy) <= 1:
            return healthy
        total = 0.0
        best = healthy[0]
        for backend in healthy:
            backend._current_weight += backend.weight
            total += backend.weight
            if backend._current_weight > best._current_weight:
                best = backend
        best._current_weight -= total
        start = healthy.index(best)
        return healthy[start:] + healthy[:start]
