"""The compiled build of the per-request modules: loaded when it matches the sources.

The modules that every request runs through (routing's scheduler, plugins and indexes, SLO
admission's policy, predictor, queues and waiting room, the router; then quotas, auth,
validation, telemetry, the upstream client and the proxy: ``MODULES``) are plain typed Python,
and ``scripts/build_native.py`` compiles them with mypyc into ``build/native/``
(``scripts/setup.sh`` does it where a C compiler is found). Compiled, a decision costs about
half as much over 4 backends and a third as much over 64 (``python -m
bench.overhead.decision``), and a proxied request about 0.8 x the CPU
(``docs/benchmarks/overhead.md``).

The build lives outside the packages, so a plain import never finds it: ``install`` (called
when this module is imported: ``routing/__init__.py`` imports it first, and every package
imports ``routing`` before its own modules) puts a finder
first on ``sys.meta_path`` that loads the compiled modules, and only when the whole build
matches: the same Python, and every listed source unchanged since the build (SHA-256 in the
build's manifest). One edited source, and every module runs interpreted until the next build:
a compiled module never runs code older than its source, and compiled and interpreted
modules of the set never mix (their classes would differ). ``SWITCHYARD_NATIVE=0`` turns the
build off. ``STATUS`` says which it is, for the gateway's start-up log.

Example::

    from routing import native
    native.STATUS        # "compiled (mypyc, 21 modules)" or "interpreted: ..."
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BUILD_DIR = ROOT / "build" / "native"
MANIFEST = BUILD_DIR / "manifest.json"
ENV = "SWITCHYARD_NATIVE"
# Typed, and on the per-request path: what compiling pays for. Their imports of one another
# are resolved inside the build, so the set is compiled, and loaded, as one.
MODULES = (
    "routing.types", "routing.fit", "routing.prefix", "routing.plugin", "routing.scheduler",
    "routing.index_approx", "routing.plugins.filters", "routing.plugins.scorers",
    "routing.plugins.pickers", "routing.plugins.ttft", "routing.plugins.cache_room",
    "routing.plugins.session", "admission.policy", "admission.predictor", "admission.headroom",
    "admission.sfq", "admission.fair_queue", "admission.finishes", "admission.waiting_room",
    "gateway.router",
    # The rest of a request's path: quotas, auth, validation, telemetry, the breaker, the
    # upstream client, the front of every route and the proxy itself.
    "admission.quota.budget", "admission.quota.types", "admission.quota.store",
    "admission.tiers", "admission.hints", "admission.retry_book", "gateway.admit",
    "gateway.usage", "gateway.auth", "gateway.tenancy", "gateway.validation", "gateway.errors",
    "gateway.observe.telemetry", "gateway.observe.waits", "gateway.observe.wait_metrics",
    "gateway.observe.metrics", "gateway.observe.request_log", "backends.fleet.breaker",
    "backends.fleet.deadlines", "backends.fleet.http1", "backends.fleet.upstream",
    "backends.fleet.registry",
    "gateway.apis", "gateway.relay", "gateway.front", "gateway.proxy",
    # What every replica does per entry of the shared stream (sy:approx): the plain RESP
    # connection, the claims and the peers' load (docs/benchmarks/replicas.md).
    "backends.resp", "backends.publisher", "backends.fleet.peer_load",
    "backends.fleet.approx_sync",
)
# What mypyc compiles otherwise than Python runs it: ``_mypyc_pitfalls`` in
# tests/routing/test_native.py, which checks every module here for it. (A ``__setattr__`` is
# one for older mypyc, which bypasses it: the registry's Backend used one to drop its
# cached state, and now drops it in each method that changes a field, with ``invalidate()``
# for code elsewhere.)

STATUS = "interpreted: not looked for yet"
_PARAMETERS: dict[str, list[str]] = {}


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(module: str) -> str:
    return hashlib.sha256(source_path(module).read_bytes()).hexdigest()


def can_build() -> bool:
    """Whether a build can be made here: a C compiler and this interpreter's headers."""
    return shutil.which("cc") is not None and Path(
        sysconfig.get_paths()["include"], "Python.h").exists()


def build_tag() -> str:
    """What a build must have been made for: this interpreter's extension suffix."""
    return str(sysconfig.get_config_var("EXT_SUFFIX"))


class _Finder(importlib.abc.MetaPathFinder):
    """Loads the build's extension modules by their names; leaves every other name alone."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        file = self.files.get(fullname)
        if file is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(file))
        return importlib.util.spec_from_file_location(fullname, file, loader=loader)


def _check(manifest: dict[str, object]) -> tuple[dict[str, Path], str]:
    """The files to load and the status, or no files and why not."""
    if manifest.get("tag") != build_tag():
        return {}, f"interpreted: the build is for {manifest.get('tag')}, not {build_tag()}"
    modules = manifest.get("modules")
    shared = manifest.get("shared")
    if not isinstance(modules, dict) or not isinstance(shared, dict):
        return {}, "interpreted: the build's manifest is malformed; rebuild it"
    if sorted(modules) != sorted(MODULES):
        return {}, "interpreted: the build holds another set of modules; rebuild it"
    files: dict[str, Path] = {}
    for module, entry in modules.items():
        if not isinstance(entry, dict) or not source_path(module).is_file():
            return {}, f"interpreted: {module} is not in the build or not in the sources"
        if entry.get("sha256") != source_digest(module):
            return {}, (f"interpreted: {source_path(module).relative_to(ROOT)} changed since "
                        "the build (python scripts/build_native.py rebuilds it)")
        files[module] = BUILD_DIR / str(entry.get("file"))
    for name, file in shared.items():
        files[str(name)] = BUILD_DIR / str(file)
    if missing := [str(f.relative_to(ROOT)) for f in files.values() if not f.is_file()]:
        return {}, f"interpreted: the build lacks {missing[0]}; rebuild it"
    return files, f"compiled (mypyc, {len(modules)} modules)"


def install() -> str:
    """Load the compiled modules from now on when the build matches; return ``STATUS``.
    Idempotent; a no-op once any module of the set is imported (it is too late to swap)."""
    global STATUS
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return STATUS
    if os.environ.get(ENV, "1") == "0":
        STATUS = f"interpreted: {ENV}=0"
        return STATUS
    if already := [m for m in MODULES if m in sys.modules]:
        STATUS = f"interpreted: {already[0]} was imported before the build was looked for"
        return STATUS
    try:
        manifest = json.loads(MANIFEST.read_text())
    except FileNotFoundError:
        STATUS = "interpreted: no build (python scripts/build_native.py makes one)"
        return STATUS
    except (OSError, ValueError) as exc:
        STATUS = f"interpreted: the build's manifest cannot be read ({exc})"
        return STATUS
    files, STATUS = _check(manifest)
    if files:
        parameters = manifest.get("parameters")
        if isinstance(parameters, dict):
            _PARAMETERS.update({str(k): [str(p) for p in v] for k, v in parameters.items()})
        sys.meta_path.insert(0, _Finder(files))
    return STATUS


def is_compiled(module: ModuleType) -> bool:
    return str(getattr(module, "__file__", "")).endswith(build_tag())


def parameters(factory: object) -> list[str] | None:
    """The keyword parameters of a compiled plugin class, as the build recorded them from its
    source (a compiled class has no signature to inspect); None when not recorded."""
    name = f"{getattr(factory, '__module__', '')}.{getattr(factory, '__qualname__', '')}"
    return _PARAMETERS.get(name)


install()
