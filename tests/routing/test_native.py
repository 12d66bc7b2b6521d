"""The compiled build of the decision modules (``routing.native``, ``scripts/build_native.py``):
loaded only while it matches every source, and deciding exactly as the interpreted modules.

The test command builds it (``scripts/setup.sh``) wherever a C compiler and the Python headers
are found, so there these tests demand it; without a compiler they check that everything runs
interpreted and says why.
"""

from __future__ import annotations

import ast
import asyncio
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from backends.fleet.approx_sync import ApproxIndexSync
from gateway.auth import Authenticator
from gateway.keystore_memory import MemoryKeyStore
from gateway.usage import UsageBook
from routing import native
from routing.index_approx import ApproxPrefixIndex

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
    ``await`` in a ``finally`` or an ``except`` block, and an ``async with`` whose exit may
    wait. Compiled (mypy 2.4.1), a coroutine that waits inside a handler leaves its exception
    as the thread's handled one while it is suspended, and puts back what it saved when it
    resumes, whatever other coroutines did meanwhile: an exception that went through a
    ``finally`` block with an await became every later exception's ``__context__``, a chain
    growing by one each time, holding every link's frames; and when several tasks wait in
    handlers at once (cancelled together at shutdown, or in a Redis outage's retry loops),
    they put back each other's exceptions, freed ones too: a task then fails with
    "TypeError: invalid exception object" inside the event loop and stays pending for ever
    (``test_tasks_cancelled_together_all_end``). An ``async with`` is such a handler when
    its body raises (its ``__aexit__`` is awaited there): only the ones whose exit never
    waits are allowed (``_exits_at_once``). What a handler must wait for goes after the
    ``try``, the exception kept in a variable and raised after it; a Redis pipeline goes
    through ``backends.redis_url.pipelined``, which runs interpreted."""
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
        if isinstance(node, ast.Try):
            if _awaits(node.finalbody):
                found.append(f"line {node.lineno}: await in finally")
            found += [f"line {handler.lineno}: await in except" for handler in node.handlers
                      if _awaits(handler.body)]
        if isinstance(node, ast.AsyncWith):
            found += [f"line {node.lineno}: async with {ast.unparse(item.context_expr)}"
                      for item in node.items if not _exits_at_once(item.context_expr)]
        if isinstance(node, ast.ClassDef):
            found += [f"line {item.lineno}: field {ast.unparse(item.target)}: object"
                      for item in node.body if isinstance(item, ast.AnnAssign)
                      and ast.unparse(item.annotation) == "object"]
            found += [f"line {item.lineno}: class default {target.id}" for item in node.body
                      if isinstance(item, ast.Assign) for target in item.targets
                      if isinstance(target, ast.Name) and target.id in set_on_instances]
    return found


def _awaits(statements: list[ast.stmt]) -> bool:
    return any(isinstance(inner, (ast.Await, ast.AsyncWith, ast.AsyncFor))
               for statement in statements for inner in ast.walk(statement))


# The async context managers whose ``__aexit__`` returns without waiting: asyncio's timeouts
# and locks (named ``*_lock``; a lock's release wakes its next waiter, it never waits).
def _exits_at_once(manager: ast.expr) -> bool:
    text = ast.unparse(manager)
    return text.startswith(("asyncio.timeout(", "asyncio.timeout_at(")) or text.endswith("_lock")


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
    "async def f(c):\n    try:\n        await c.run()\n    except OSError:\n"
    "        await c.close()\n",
    "async def f(c):\n    async with c.pipeline() as p:\n        await p.execute()\n",
])
def test_the_pitfall_check_finds_each_pitfall(source: str) -> None:
    assert len(_mypyc_pitfalls(source)) == 1


def test_the_pitfall_check_allows_what_compiles_the_same() -> None:
    source = ("async def f(c):\n    async with asyncio.timeout(1):\n        await c.run()\n"
              "    async with c._flush_lock:\n        await c.run()\n    failed = None\n"
              "    try:\n        await c.run()\n    except OSError as exc:\n"
              "        failed = exc\n    await c.close()\n")
    assert _mypyc_pitfalls(source) == []


async def test_tasks_cancelled_together_all_end(redis_url: str) -> None:
    """What a gateway's shutdown does: its background tasks cancelled at once, each waiting
    for Redis on its way out (the invalidation listener closes its pubsub, the usage book
    flushes, the index sync closes its connections). Compiled with an await in their
    handlers, they put back each other's exceptions: one failed inside the event loop with
    "invalid exception object" and stayed pending for ever, and every later exception chained
    onto a stale one."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        for _ in range(3):
            auth = Authenticator(MemoryKeyStore(key_secret=secrets.token_bytes(32)), redis)
            book = UsageBook(redis)
            sync = ApproxIndexSync(redis, ApproxPrefixIndex(ttl_s=60), "gw-cancel", ttl_s=60)
            tasks = [asyncio.create_task(auth.listen_for_invalidations()),
                     asyncio.create_task(sync.run()), asyncio.create_task(book.run())]
            await asyncio.sleep(0.2)
            book.charge("tenant", "key", "model", prompt_tokens=10, cached_tokens=0,
                        output_tokens=2)  # something for the last flush to send
            for task in tasks:
                task.cancel()
            _, stuck = await asyncio.wait(tasks, timeout=3.0)
            assert not stuck
            assert [task.cancelled() for task in tasks] == [True, True, True]
        with pytest.raises(ValueError) as raised:
            raise ValueError("a probe")
        assert raised.value.__context__ is None
    finally:
        await redis.aclose()
