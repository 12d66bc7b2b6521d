"""Package boundaries from DESIGN.md, enforced: imports run one way, pure cores stay pure."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(*paths: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Every absolute import (lazy ones inside functions included) of each module under
    ``paths`` (folders or single files, relative to ``root``)."""
    found: dict[str, set[str]] = {}
    files = [f for p in paths for f in ((root / p).rglob("*.py") if (root / p).is_dir()
                                        else [root / p])]
    assert files, paths
    for path in sorted(files):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(root))] = names
    return found


ENGINES = ("backends.sim", "backends.worker", "backends.mock")
PURE = ("asyncio", "aiohttp", "redis", "httpx", "torch", "time", "random")
FORBIDDEN = [
    pytest.param(("routing",), ("gateway", "admission", "backends", "aiohttp", "redis", "httpx",
                                "torch", "asyncio"), id="routing-is-pure"),
    pytest.param(("admission",), ("gateway", "aiohttp", "httpx", "torch"),
                 id="admission-no-gateway-no-http"),
    pytest.param(("gateway",), ("bench",), id="gateway-never-imports-bench"),
    pytest.param(("backends",), ("gateway", "admission", "bench"),
                 id="backends-never-import-gateway"),
    pytest.param(("backends/fleet",), (*ENGINES, "backends.engine_core", "backends.engine_http",
                                       "torch"),
                 id="fleet-imports-no-engine"),
    pytest.param(("backends/engine_core",), (*PURE, *ENGINES, "backends.fleet"),
                 id="engine-core-is-pure"),
    pytest.param(("backends/sim/core.py", "backends/sim/latency.py", "backends/sim/profile.py"),
                 (*PURE, "backends.worker", "backends.mock", "backends.fleet"),
                 id="sim-core-is-pure"),
    pytest.param(("backends/sim", "backends/mock"), ("backends.worker", "torch"),
                 id="sim-and-mock-never-import-the-worker"),
    pytest.param(("backends/worker", "backends/mock"), ("backends.sim",),
                 id="engines-share-only-engine-core-and-engine-http"),
]


def _matches(name: str, forbidden: tuple[str, ...]) -> bool:
    return any(name == f or name.startswith(f + ".") for f in forbidden)


@pytest.mark.parametrize(("paths", "forbidden"), FORBIDDEN)
def test_package_does_not_import(paths: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    offenders = {
        path: sorted(n for n in names if _matches(n, forbidden))
        for path, names in _imports(*paths).items()
    }
    offenders = {path: names for path, names in offenders.items() if names}
    assert offenders == {}


def test_a_forbidden_import_is_found(tmp_path: Path) -> None:
    """The checker sees lazy imports and sub-packages, so the rules above can fail."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "import os\n\ndef f():\n    from backends.sim.core import X\n    import torch.nn\n")
    names = _imports("pkg", root=tmp_path)["pkg/m.py"]
    assert {n for n in names if _matches(n, (*ENGINES, "torch"))} == {"backends.sim.core",
                                                                      "torch.nn"}
    assert not _matches("backends.simulator", ENGINES)


def test_gateway_process_does_not_load_torch() -> None:
    code = (
        "import sys, gateway.cli.commands, gateway.server, gateway.app, backends.mock.server\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    assert result.stdout.strip() == "False"
