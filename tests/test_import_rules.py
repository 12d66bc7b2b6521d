"""Package boundaries from DESIGN.md, enforced: imports run one way, pure cores stay pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(package: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


FORBIDDEN = [
    pytest.param("routing", ("gateway", "admission", "backends", "aiohttp", "redis", "httpx",
                             "torch", "asyncio"), id="routing-is-pure"),
    pytest.param("admission", ("gateway", "aiohttp", "httpx", "torch"), id="admission-no-http"),
    pytest.param("backends", ("gateway", "admission"), id="backends-never-import-gateway"),
]


@pytest.mark.parametrize(("package", "forbidden"), FORBIDDEN)
def test_package_does_not_import(package: str, forbidden: tuple[str, ...]) -> None:
    offenders = {
        path: sorted(n for n in names if n.split(".")[0] in forbidden)
        for path, names in _imports(package).items()
    }
    offenders = {path: names for path, names in offenders.items() if names}
    assert offenders == {}


def test_gateway_process_does_not_load_torch() -> None:
    code = (
        "import sys, gateway.cli.commands, gateway.server, gateway.app, backends.mock.server\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "False"
