"""bench.admission.redis_cpu runs end to end on a private redis-server and reports every shape.

No figure is asserted (they depend on the machine): only that each is there and sane."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.admission.redis_cpu import SHAPES

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="needs redis-server")


def test_every_shape_is_measured_merged_and_not() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.admission.redis_cpu", "--pairs", "300",
                           "--json"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["pairs"] == 300
    shapes = [(row["ops_per_write"], row["tenants"]) for row in document["figures"]]
    assert shapes == list(SHAPES)
    for row in document["figures"]:
        for mode in ("merged", "one_per_op"):
            assert math.isfinite(row[mode]) and row[mode] >= 0, row
