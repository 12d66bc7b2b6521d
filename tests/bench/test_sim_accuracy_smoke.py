"""The simulator accuracy benchmark runs end to end in its quick mode and writes every figure.

Its only timing check is a loose sanity bound on one worker, far from the benchmark's 5 %
target: it proves that the replay models the same requests the simulator served, not that
this machine is quiet enough to meet the target.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from backends.sim.profile import WorkerProfile
from bench.sim_accuracy.bench import QUICK
from bench.sim_accuracy.model import (
    ObservedRequest,
    relative_errors,
    replay_worker,
    request_shape,
    summarize,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SUMMARY_FIELDS = ("num_requests", "median_abs", "p90_abs", "p99_abs", "max_abs", "bias")
ROW_FIELDS = (
    "workers", "concurrency", "num_requests", "elapsed_s", "e2e_observed_median_s",
    "e2e_modelled_median_s", "ttft_observed_median_s", "ttft_modelled_median_s",
    "e2e_delta_median_ms", "ttft_delta_median_ms", "num_token_count_mismatches", "tokens_per_s",
    "steps_per_s", "lateness_per_step_ms", "max_lateness_ms", "sim_cores_busy",
    "sim_cpu_us_per_token", "client_cores_busy", "others_cores_busy",
)
# Signed figures, and figures that are zero when all goes well.
MAY_BE_ZERO_OR_NEGATIVE = ("e2e_delta_median_ms", "ttft_delta_median_ms",
                           "num_token_count_mismatches", "lateness_per_step_ms",
                           "max_lateness_ms", "others_cores_busy")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    results_dir = tmp_path_factory.mktemp("bench-results")
    done = subprocess.run(
        [sys.executable, "-m", "bench.sim_accuracy", "--quick", "--results-dir", str(results_dir)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = results_dir.glob("sim-accuracy-*.json")
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_one_row_per_fleet_size_with_every_figure(results: dict[str, Any]) -> None:
    rows = results["fleets"]
    assert [row["workers"] for row in rows] == list(QUICK.workers_list)
    for row in rows:
        assert [name for name in ROW_FIELDS if name not in row] == []
        for name in ROW_FIELDS:
            value = row[name]
            assert isinstance(value, int | float) and math.isfinite(value), name
            if name not in MAY_BE_ZERO_OR_NEGATIVE:
                assert value > 0, name
        for latency in ("e2e", "ttft"):
            summary = row[latency]
            assert [name for name in SUMMARY_FIELDS if name not in summary] == []
            assert all(math.isfinite(summary[name]) for name in SUMMARY_FIELDS), latency
            assert summary["num_requests"] == row["num_requests"]
        assert isinstance(row["meets_target"], bool)


def test_every_request_got_the_tokens_the_model_gives_it(results: dict[str, Any]) -> None:
    assert all(row["num_token_count_mismatches"] == 0 for row in results["fleets"])


def test_one_worker_follows_the_model_roughly(results: dict[str, Any]) -> None:
    [one] = [row for row in results["fleets"] if row["workers"] == 1]
    assert one["e2e"]["median_abs"] < 0.20


def test_results_file_records_the_run(results: dict[str, Any]) -> None:
    assert results["benchmark"] == "sim_accuracy"
    assert results["plan"]["workers_list"] == list(QUICK.workers_list)
    assert len(results["loadavg_at_start"]) == 3
    assert results["target_e2e_p90_abs"] == 0.05


def _observed(index: int, send_s: float, first_token_s: float,
              finish_s: float) -> ObservedRequest:
    prompt_ids, max_tokens = request_shape(seed=7, worker=0, index=index)
    return ObservedRequest(0, index, len(prompt_ids), max_tokens, send_s, first_token_s,
                           finish_s, max_tokens)


@pytest.mark.parametrize("late_s", [pytest.param(0.0, id="on-time"),
                                    pytest.param(0.05, id="late-by-50ms")])
def test_replay_gives_a_lone_request_its_modelled_latency(late_s: float) -> None:
    """No HTTP: the replay's own arithmetic, which the benchmark's figures rest on."""
    [modelled] = replay_worker(WorkerProfile(model="switchyard-sim"),
                               [_observed(0, 10.0, 10.0, 10.0)], seed=7)
    observed = _observed(0, 10.0, modelled.first_token_s + late_s, modelled.finish_s + late_s)
    summary = summarize(relative_errors([observed.e2e_s], [modelled.e2e_s]))
    assert observed.num_output_tokens == modelled.num_output_tokens
    assert 0 < modelled.ttft_s < modelled.e2e_s
    assert summary.bias == pytest.approx(late_s / modelled.e2e_s)
    assert summary.median_abs == pytest.approx(late_s / modelled.e2e_s)
