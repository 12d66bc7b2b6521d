"""``bench.replicas.split``: each hit's TTFT split into the engine's, the gateway's and the
rest by its gateway's request-log line, pooled over invocations per mode and replica count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.replicas.split import hit_parts, main, parts_of
from bench.routing.fleet import ENGINE_LOG


def record(index: int, ttft_s: float, cached: int = 1800, sent_at_s: float = 20.0
           ) -> dict[str, Any]:
    return {"index": index, "sent_at_s": sent_at_s, "ttft_s": ttft_s, "status": 200,
            "error": None, "num_prompt_tokens": 2000, "num_cached_tokens": cached,
            "ideal_cached_tokens": 1800}


def write_run(tmp_path: Path, name: str, runs: dict[str, list[tuple[dict[str, Any], float, float]]]
              ) -> Path:
    """A result JSON with its fleet's logs: per run label, (record, gateway TTFT, engine TTFT)."""
    result: dict[str, Any] = {"config": {"warmup_s": 10}, "modes": ["own"], "own": {"runs": {}}}
    for label, rows in runs.items():
        run_dir = tmp_path / f"{name}-fleet" / f"own-{label.replace(' ', '-')}"
        run_dir.mkdir(parents=True)
        (run_dir / "gateway-0.log").write_text("listening\n" + "".join(
            json.dumps({"request_id": f"bench-{r['index']}", "ttft_s": gateway_s,
                        "waits": {"upstream_connect": 0.001, "upstream_ttft": engine_s - 0.001}})
            + "\n" for r, gateway_s, engine_s in rows))
        result["own"]["runs"][label] = {"records": [r for r, _, _ in rows]}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(result))
    return path


def test_a_hit_splits_into_engine_gateway_and_outside() -> None:
    parts = parts_of(record(1, 0.050), {"ttft_s": 0.040,
                                        "waits": {"upstream_connect": 0.002,
                                                  "upstream_ttft": 0.030}})
    assert parts == pytest.approx({"client": 0.050, "engine": 0.032, "gateway": 0.008,
                                   "outside": 0.010})
    assert parts_of(record(1, 0.050), {"ttft_s": 0.040, "waits": {}}) is None
    assert parts_of(record(1, 0.050), None) is None


def test_hits_after_the_warmup_are_pooled_over_files_per_run(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    first = write_run(tmp_path, "a", {
        "1": [(record(1, 0.030), 0.025, 0.020), (record(2, 0.300, cached=0), 0.29, 0.28),
              (record(3, 0.040, sent_at_s=1.0), 0.03, 0.02)],
        "2": [(record(1, 0.060), 0.050, 0.045)]})
    second = write_run(tmp_path, "b", {"1": [(record(7, 0.032), 0.026, 0.021)],
                                       "2": [(record(7, 0.064), 0.052, 0.046)]})
    pooled = hit_parts([first, second])
    # The miss (request 2) and the one in the warm-up (request 3) are left out.
    assert pooled["own", "1"]["client"] == pytest.approx([0.030, 0.032])
    assert pooled["own", "2"]["engine"] == pytest.approx([0.045, 0.046])
    assert pooled["own", "2"]["outside"] == pytest.approx([0.010, 0.012])
    assert main([str(first), str(second)]) == 0
    rows = capsys.readouterr().out.splitlines()
    two = next(row for row in rows if row.startswith("own          2 "))
    assert "2.00x" in two  # the client's TTFT doubled with two replicas, at p50


def test_logs_without_waits_say_how_to_get_them(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"config": {"warmup_s": 10}, "modes": ["own"],
                                "own": {"runs": {"1": {"records": [record(1, 0.03)]}}}}))
    assert main([str(path)]) == 1
    assert "request_log.mode=all" in capsys.readouterr().err


def test_engine_logs_split_the_engines_part_and_count_hits_behind_big_prefills(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big, crowded, alone = record(1, 0.200, cached=0), record(2, 0.060), record(3, 0.030)
    big["ideal_cached_tokens"] = 0  # a new prompt: no miss, but all of it to prefill
    path = write_run(tmp_path, "e", {"1": [(big, 0.19, 0.18), (crowded, 0.05, 0.045),
                                           (alone, 0.025, 0.02)]})

    def engine(r: dict[str, Any], worker: str, arrival_s: float, queue_s: float,
               prefill_s: float) -> str:
        return json.dumps({
            "request_id": f"bench-{r['index']}", "worker": worker, "arrival_s": arrival_s,
            "queue_s": queue_s, "prefill_s": prefill_s, "ttft_s": queue_s + prefill_s,
            "prompt_tokens": r["num_prompt_tokens"], "cached_tokens": r["num_cached_tokens"]})

    # The crowded hit arrives on sim-0 during the big prefill; the other one on sim-1.
    (tmp_path / "e-fleet" / "own-1" / ENGINE_LOG).write_text("\n".join([
        engine(big, "sim-0", 100.0, 0.0, 0.17), engine(crowded, "sim-0", 100.05, 0.0, 0.04),
        engine(alone, "sim-1", 100.06, 0.001, 0.017)]) + "\n")
    crowds: dict[tuple[str, str], list[int]] = {}
    pooled = hit_parts([path], crowds)
    assert pooled["own", "1"]["prefill"] == pytest.approx([0.04, 0.017])
    assert pooled["own", "1"]["queue"] == pytest.approx([0.0, 0.001])
    assert crowds == {("own", "1"): [1, 1]}
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "prefill p99" in out and "1 big prefills" in out and "1 hits arrived" in out
