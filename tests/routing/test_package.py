"""The routing package: a pure core (no I/O, no clock) behind a small public surface."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import routing

ROUTING = Path(routing.__file__).resolve().parent
IMPURE = {"asyncio", "aiohttp", "redis", "httpx", "torch", "time", "gateway", "backends",
          "admission", "opentelemetry"}


@pytest.mark.parametrize("path", [pytest.param(p, id=str(p.relative_to(ROUTING)))
                                  for p in sorted(ROUTING.rglob("*.py"))])
def test_module_is_pure_and_small(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported.isdisjoint(IMPURE)
    assert len(path.read_text().splitlines()) < 300
    assert ast.get_docstring(tree), "every module says what it is for"


def test_public_names_resolve() -> None:
    for name in routing.__all__:
        assert getattr(routing, name) is not None
