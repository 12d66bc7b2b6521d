"""The admission benchmark in both fleet modes, side by side, at the target level only.

No timing or target is asserted: the figures depend on the machine. A quick run of both modes
(``--levels 2 --no-mock``: 2 workers, the capacity, the 2x level with admission on and off, the
retry run; about 25 s) proves the third-party fleet is a static one — the engines run without
Redis, the gateways list them from the configuration and load them from ``/metrics`` — and
that the report holds both modes' tables, the side-by-side row of each and each mode's
targets. The own fleet and the mock fleet in full: `test_admission_bench_smoke`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
MODES = (("own", "own"), ("third_party", "third-party"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    results_dir = tmp_path_factory.mktemp("admission-modes")
    done = subprocess.run(
        [sys.executable, "-m", "bench.admission", "--quick", "--mode", "both",
         "--levels", "2", "--no-mock", "--results-dir", str(results_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = results_dir.glob("admission-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document, done.stdout


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_the_third_party_fleet_is_static(run: tuple[dict[str, Any], str]) -> None:
    results, _ = run
    fleet = results["third_party"]["fleet"]
    assert fleet["num_backends"] == 2
    assert (fleet["sources"], fleet["load_sources"]) == (["config"], ["metrics"])
    assert fleet["profile_sources"] == ["block_size: vllm:/metrics",
                                        "kv_capacity_tokens: vllm:/metrics",
                                        "max_context_tokens: /v1/models"]
    assert all(b["num_prefix_kv_blocks"] is None for b in results["third_party"]["fleet_backends"])
    own = results["own"]["fleet"]
    assert (own["sources"], own["load_sources"]) == (["heartbeat"], ["heartbeat"])


@pytest.mark.parametrize(("key", "mode"), [pytest.param(k, m, id=m) for k, m in MODES])
def test_each_mode_ran_every_phase(run: tuple[dict[str, Any], str], key: str,
                                   mode: str) -> None:
    results, _ = run
    mode_run = results[key]
    assert mode_run["mode"] == mode
    capacity_rps = mode_run["capacity"]["capacity_rps"]
    assert _finite(capacity_rps) and capacity_rps > 0
    assert [(r["level"], r["mode"]) for r in mode_run["levels"]] == [(2.0, "on"), (2.0, "off")]
    for level in mode_run["levels"]:
        assert _finite(level["figures"]["goodput_rps"])
        assert level["figures"]["tiers"]["interactive"]["num_offered"] > 0
    retry = mode_run["retry"]
    assert retry["figures"]["tiers"]["standard"]["num_offered"] > 0
    figures = retry["retries"]
    assert figures["num_retried"] <= figures["num_with_retry_after"] <= figures["num_refused"]
    if figures["num_retried"]:
        assert 0 <= figures["admitted_share"] <= 1 and 0 <= figures["met_slo_share"] <= 1
        assert figures["retry_after_s"]["min"] >= 0


def test_the_report_has_both_modes_side_by_side(run: tuple[dict[str, Any], str]) -> None:
    results, stdout = run
    assert results["modes"] == ["own", "third-party"]
    assert "### Own fleet" in stdout and "### Third-party fleet" in stdout
    side = stdout.split("### Side by side", 1)[1].split("###", 1)[0]
    assert "| own |" in side and "| third-party |" in side
    assert "goodput / saturation" in side and "capacity / saturation" in side
    assert "Retries at" in stdout
    assert "quota" not in results and "GCRA allowance" not in stdout  # --no-mock
    assert [t["mode"] for t in results["targets"]] == ["own"] * 8 + ["third-party"] * 8
    labels = {t["label"] for t in results["targets"]}
    assert "retries at 2x: share of first retries (after Retry-After) admitted" in labels
    assert all(isinstance(t["passed"], bool) for t in results["targets"])
