"""Compile the per-request decision modules (``routing.native.MODULES``) with mypyc into
``build/native/``, where ``routing.native`` loads them while their sources are unchanged.

Needs a C compiler and the Python headers; mypy (with mypyc) comes with the dev extra::

    .venv/bin/python scripts/build_native.py            # build (about 3 minutes on 2 cores)
    .venv/bin/python scripts/build_native.py --check    # is the build there and current?
    .venv/bin/python scripts/build_native.py --clean    # remove it: everything interpreted
    .venv/bin/python scripts/build_native.py --can-build   # can one be made here?

After building, it checks that the compiled modules decide exactly as the interpreted ones
(``admission.native_check``, run once each way in a fresh interpreter) and removes the build if
they do not. The manifest records each source's SHA-256, the interpreter's extension suffix,
and the keyword parameters of the routing plugins (a compiled class has no signature).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["SWITCHYARD_NATIVE"] = "0"  # this process imports the interpreted sources

from routing import native  # noqa: E402


def _plugin_parameters() -> dict[str, list[str]]:
    import routing.profiles  # noqa: F401  (registers every built-in plugin)
    from routing.registry import all_factories

    return {f"{f.__module__}.{f.__qualname__}": list(inspect.signature(f).parameters)
            for f in all_factories()}


def build(build_dir: Path, modules: tuple[str, ...]) -> dict[str, object]:
    """Compile ``modules`` into ``build_dir`` and return the manifest (not yet written)."""
    from mypyc.build import mypycify
    from setuptools import setup  # type: ignore[import-untyped,unused-ignore]

    sources = [str(native.source_path(m).relative_to(ROOT)) for m in modules]
    digests = {m: native.source_digest(m) for m in modules}
    with tempfile.TemporaryDirectory(prefix="switchyard-native-") as temp:
        os.chdir(ROOT)
        extensions = mypycify(sources, opt_level="3", target_dir=str(Path(temp) / "c"))
        setup(name="switchyard-native", ext_modules=extensions, script_args=[
            "-q", "build_ext", "--build-lib", str(build_dir), "--build-temp",
            str(Path(temp) / "o"), "--parallel", str(os.cpu_count() or 1)])
    suffix = native.build_tag()
    files = {str(p.relative_to(build_dir)) for p in build_dir.rglob(f"*{suffix}")}
    entries: dict[str, dict[str, str]] = {}
    for module in modules:
        file = f"{module.replace('.', '/')}{suffix}"
        if file not in files:
            raise SystemExit(f"build_native: mypyc made no {file}")
        entries[module] = {"sha256": digests[module], "file": file}
        files.discard(file)
    # What is left is mypyc's shared library of the group (one top-level module).
    shared = {f.removesuffix(suffix).replace("/", "."): f for f in files}
    return {"tag": suffix, "modules": entries, "shared": shared,
            "parameters": _plugin_parameters()}


def _decisions(native_on: bool) -> str:
    env = {**os.environ, "SWITCHYARD_NATIVE": "1" if native_on else "0",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "admission.native_check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build_native: the decision check failed:\n{done.stderr[-4000:]}")
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="report the build's state")
    parser.add_argument("--clean", action="store_true", help="remove the build")
    parser.add_argument("--can-build", action="store_true",
                        help="exit 0 when a C compiler and the Python headers are found")
    args = parser.parse_args()
    if args.can_build:
        return 0 if native.can_build() else 1
    if args.clean:
        shutil.rmtree(native.BUILD_DIR, ignore_errors=True)
        print("build_native: removed; every module runs interpreted")
        return 0
    if args.check:
        os.environ.pop("SWITCHYARD_NATIVE")
        status = subprocess.run(
            [sys.executable, "-c", "import routing.native as n; print(n.STATUS)"], cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
            check=True).stdout.strip()
        print(f"build_native: {status}")
        return 0 if status.startswith("compiled") else 1
    shutil.rmtree(native.BUILD_DIR, ignore_errors=True)
    native.BUILD_DIR.mkdir(parents=True)
    manifest = build(native.BUILD_DIR, native.MODULES)
    native.MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    interpreted, compiled = _decisions(False), _decisions(True)
    if not compiled.startswith("compiled") or interpreted.split("\n", 1)[1:] != \
            compiled.split("\n", 1)[1:]:
        shutil.rmtree(native.BUILD_DIR, ignore_errors=True)
        raise SystemExit("build_native: the compiled modules decide otherwise than the "
                         f"interpreted ones; build removed.\ninterpreted: {interpreted[:2000]}"
                         f"\ncompiled: {compiled[:2000]}")
    print(f"build_native: {len(native.MODULES)} modules compiled into "
          f"{native.BUILD_DIR.relative_to(ROOT)}; decisions identical to the interpreted ones")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
