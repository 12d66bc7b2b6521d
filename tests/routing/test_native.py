"""The compiled build of the decision modules (``routing.native``, ``scripts/build_native.py``):
loaded only while it matches every source, and deciding exactly as the interpreted modules.

The test command builds it (``scripts/setup.sh``) wherever a C compiler and the Python headers
are found, so there these tests demand it; without a compiler they check that everything runs
interpreted and says why.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from routing import native

ROOT = native.ROOT
CAN_BUILD = native.can_build()
PACKAGES = ("routing", "admission", "gateway", "backends")


def _python(code: str, cwd: Path, **env: str) -> list[str]:
    """What ``code`` prints, run in ``cwd``'s packages (the switch only as ``env`` sets it)."""
    inherited = {k: v for k, v in os.environ.items() if k != native.ENV}
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**inherited, "PYTHONPATH": str(cwd), **env})
    return done.stdout.splitlines()


_WHERE = ("import routing.native as n, routing.fit as f, admission.policy as p; "
          "print(n.STATUS); print(f.__file__); print(p.__file__)")


def test_this_process_runs_the_build_where_one_can_be_made() -> None:
    import routing.scheduler

    if CAN_BUILD and os.environ.get(native.ENV) != "0":
        assert native.STATUS.startswith("compiled"), native.STATUS
        assert native.is_compiled(routing.scheduler)
        assert str(routing.scheduler.__file__).startswith(str(native.BUILD_DIR))
    else:
        assert native.STATUS.startswith("interpreted: "), native.STATUS
        assert str(routing.scheduler.__file__).endswith(".py")


@pytest.mark.skipif(not CAN_BUILD, reason="no C compiler: nothing compiled to compare")
def test_compiled_and_interpreted_modules_decide_the_same() -> None:
    traces = {}
    for flag in ("0", "1"):
        done = subprocess.run([sys.executable, "-m", "admission.native_check"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, check=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT), native.ENV: flag})
        traces[flag] = done.stdout.splitlines()
    assert traces["0"][0] == f"interpreted: {native.ENV}=0"
    assert traces["1"][0].startswith("compiled"), traces["1"][0]
    assert len(traces["0"]) > 2000  # every profile, decide, the queue and the index
    assert traces["0"][1:] == traces["1"][1:]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages and their build, to edit."""
    if not CAN_BUILD:
        pytest.skip("no C compiler: no build to copy")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(native.BUILD_DIR, tmp_path / "build" / "native")
    return tmp_path


def test_a_matching_build_is_loaded_for_every_module_of_the_set(tree: Path) -> None:
    status, fit, policy = _python(_WHERE, tree)
    assert status == f"compiled (mypyc, {len(native.MODULES)} modules)"
    assert fit.startswith(str(tree / "build" / "native")) and fit.endswith(native.build_tag())
    assert policy.endswith(native.build_tag())


def test_one_edited_source_makes_every_module_run_interpreted(tree: Path) -> None:
    with (tree / "routing" / "fit.py").open("a") as source:
        source.write("\n# an edit after the build\n")
    status, fit, policy = _python(_WHERE, tree)
    assert status.startswith("interpreted: routing/fit.py changed since the build"), status
    assert fit == str(tree / "routing" / "fit.py")
    assert policy == str(tree / "admission" / "policy.py")  # unchanged, but not mixed in


def test_a_build_for_another_interpreter_is_not_loaded(tree: Path) -> None:
    manifest = tree / "build" / "native" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(native.build_tag(), ".cpython-399-x.so"))
    status, fit, _ = _python(_WHERE, tree)
    assert status.startswith("interpreted: the build is for .cpython-399-x.so"), status
    assert fit.endswith(".py")


def test_the_build_is_off_with_the_environment_switch(tree: Path) -> None:
    status, fit, _ = _python(_WHERE, tree, **{native.ENV: "0"})
    assert status == f"interpreted: {native.ENV}=0"
    assert fit.endswith(".py")


def test_a_compiled_plugin_names_its_settings_from_the_build(tree: Path) -> None:
    code = ("from routing.registry import make_filter\n"
            "try:\n    make_filter('not_saturated', {'max_wait': 1}, 'filters[0]')\n"
            "except ValueError as e:\n    print(e)\n")
    lines = _python(code, tree)
    assert lines == ["filters[0].max_wait: filter 'not_saturated' takes max_waiting, "
                     "max_kv_usage"]


def _mypyc_pitfalls(source: str) -> list[str]:
    """What mypyc compiles otherwise than Python runs it, found in ``source``: a name bound by
    ``except`` clauses of different types in one function (compiled, the name keeps the first
    clause's type, and the second clause's exception fails a type check), a dataclass-style
    field annotated ``object`` (its class fails at import), an async generator (not
    compilable), ``__setattr__`` (compiled code sets attributes around it), a class-level
    default of an attribute that instances set (compiled, instances never see it) and an
    ``await`` in a ``finally`` block (compiled, an exception that came out of an await, a
    task's cancellation too, and went through such a block stays the thread's handled
    exception after the coroutine ends: every exception raised later, anywhere, gets it as
    ``__context__``, so the chain grows by one with each such block run, and holds every
    link's frames; mypy 2.4.1. The same block as ``except BaseException: ...; raise`` and
    after the ``try`` does not leak)."""
    found = []
    tree = ast.parse(source)
    set_on_instances = {target.attr for node in ast.walk(tree)
                        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                        for target in (node.targets if isinstance(node, ast.Assign)
                                       else [node.target])
                        if isinstance(target, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound: dict[str, set[str]] = {}
            for inner in ast.walk(node):
                if isinstance(inner, ast.ExceptHandler) and inner.name and inner.type:
                    bound.setdefault(inner.name, set()).add(ast.unparse(inner.type))
            found += [f"line {node.lineno}: {node.name} binds {name!r} to {sorted(types)}"
                      for name, types in bound.items() if len(types) > 1]
            if node.name == "__setattr__":
                found.append(f"line {node.lineno}: __setattr__")
            if isinstance(node, ast.AsyncFunctionDef) and any(
                    isinstance(inner, (ast.Yield, ast.YieldFrom)) for inner in ast.walk(node)):
                found.append(f"line {node.lineno}: async generator {node.name}")
        if isinstance(node, ast.Try) and any(
                isinstance(inner, (ast.Await, ast.AsyncWith, ast.AsyncFor))
                for statement in node.finalbody for inner in ast.walk(statement)):
            found.append(f"line {node.lineno}: await in finally")
        if isinstance(node, ast.ClassDef):
            found += [f"line {item.lineno}: field {ast.unparse(item.target)}: object"
                      for item in node.body if isinstance(item, ast.AnnAssign)
                      and ast.unparse(item.annotation) == "object"]
            found += [f"line {item.lineno}: class default {target.id}" for item in node.body
                      if isinstance(item, ast.Assign) for target in item.targets
                      if isinstance(target, ast.Name) and target.id in set_on_instances]
    return found


def test_no_compiled_module_holds_what_mypyc_compiles_otherwise() -> None:
    found = {module: problems for module in native.MODULES
             if (problems := _mypyc_pitfalls(native.source_path(module).read_text()))}
    assert found == {}


@pytest.mark.parametrize("source", [
    "def f():\n    try:\n        pass\n    except KeyError as e:\n        pass\n"
    "    except ValueError as e:\n        pass\n",
    "class C:\n    x: object = None\n",
    "async def f():\n    yield 1\n",
    "class C:\n    def __setattr__(self, name, value):\n        pass\n",
    "class C:\n    flag = False\n\ndef f(c):\n    c.flag = True\n",
    "async def f(c):\n    try:\n        await c.run()\n    finally:\n        await c.close()\n",
])
def test_the_pitfall_check_finds_each_pitfall(source: str) -> None:
    assert len(_mypyc_pitfalls(source)) == 1
