"""The `switchyard` command's small manners: ``--version``, a reader that leaves early, a chart
with nothing to show."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from gateway.cli.localproc import ProcessGroup
from tests.fleet import ADMIN_TOKEN, Engine, Gateway

ROOT = Path(__file__).resolve().parents[2]
SWITCHYARD = [sys.executable, "-m", "gateway"]


def test_version_is_the_package_version() -> None:
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = subprocess.run([*SWITCHYARD, "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=30, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, f"switchyard {expected}")


def test_waits_png_with_no_requests_says_so(procs: ProcessGroup, workdir: Path, redis_url: str,
                                            engines: list[Engine], tmp_path: Path) -> None:
    fresh = Gateway(procs, workdir, redis_url, [engines[0].backend_config()])
    png = tmp_path / "waits.png"
    done = subprocess.run([*SWITCHYARD, "waits", "--url", fresh.url, "--admin-token",
                           ADMIN_TOKEN, "--png", str(png)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "no chart saved: the gateway saw no requests" in done.stderr
    assert not png.exists()


def test_a_reader_that_leaves_gets_no_traceback(procs: ProcessGroup, workdir: Path,
                                                 redis_url: str, engines: list[Engine]) -> None:
    """``switchyard waits --json | head``: the pipe is closed before the report is written."""
    fresh = Gateway(procs, workdir, redis_url, [engines[0].backend_config()])
    child = subprocess.Popen([*SWITCHYARD, "waits", "--url", fresh.url, "--admin-token",
                              ADMIN_TOKEN, "--json"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=ROOT)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # before the interpreter has even started: the write meets EPIPE
    stderr = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr
