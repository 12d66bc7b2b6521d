"""bench.replicas.pool: several invocations' requests pooled per mode and replica count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.replicas.pool import is_counted, main, pool, pool_figures, undisturbed


def _record(index: int, ttft_s: float, *, sent_at_s: float = 20.0, cached: int = 900,
            ideal: int | None = 1000, status: int = 200) -> dict[str, Any]:
    return {"index": index, "status": status, "error": "", "sent_at_s": sent_at_s,
            "ttft_s": ttft_s, "num_prompt_tokens": 1000, "num_cached_tokens": cached,
            "ideal_cached_tokens": ideal}


def _document(runs: dict[str, list[dict[str, Any]]], mode: str = "own") -> dict[str, Any]:
    return {"modes": [mode], "config": {"warmup_s": 10.0},
            mode.replace("-", "_"): {"runs": {label: {"records": records}
                                              for label, records in runs.items()}}}


def test_warmup_and_failed_requests_are_left_out_and_misses_counted() -> None:
    records = [_record(0, 0.030), _record(1, 0.040, cached=100),  # a miss: 100 < 500
               _record(2, 9.0, sent_at_s=5.0), _record(3, 9.0, status=503),
               _record(4, 0.050, ideal=None)]  # not judged: no ideal

    counted = [r for r in records if is_counted(r, 10.0)]
    figures = pool_figures(counted)
    assert figures["num_requests"] == 3
    assert figures["num_missed"] == 1
    assert figures["ttft_ms"]["p50"] == pytest.approx(40.0)
    assert figures["cached_fraction"] == pytest.approx((900 + 100 + 900) / 3000)


def test_runs_of_several_invocations_are_pooled_and_set_over_one_replica() -> None:
    one = [_record(i, 0.010 * (i + 1)) for i in range(10)]  # 10 .. 100 ms
    four = [_record(i, 0.011 * (i + 1)) for i in range(10)]  # 10 % slower throughout
    pooled = pool([_document({"1": one[:5], "4": four[:5]}),
                   _document({"1": one[5:], "4": four[5:]})])
    rows = pooled["own"]
    assert rows["1"]["num_runs"] == rows["4"]["num_runs"] == 2
    assert rows["4"]["num_requests"] == 10
    assert rows["4"]["ratio"]["ttft_p90_ms"] == pytest.approx(1.1)
    assert rows["4"]["ratio"]["ttft_p99_ms"] == pytest.approx(1.1)
    assert rows["1"]["ratio"]["cached_fraction"] == pytest.approx(1.0)


def test_the_cli_prints_verdicts_and_refuses_results_without_records(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(_document(
        {"1": [_record(i, 0.010 * (i + 1)) for i in range(10)],
         "2": [_record(i, 0.0101 * (i + 1)) for i in range(10)],
         "4": [_record(i, 0.012 * (i + 1)) for i in range(10)]}, mode="third-party")))
    out = tmp_path / "pooled.json"
    assert main([str(path), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if "| third-party | 2 |" in line).endswith("PASS |")
    assert next(line for line in lines if "| third-party | 4 |" in line).endswith("FAIL |")
    assert json.loads(out.read_text())["third-party"]["4"]["num_requests"] == 10
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"modes": ["own"], "config": {"warmup_s": 10.0},
                                "own": {"runs": {"1": {"ttft_ms": {}}}}}))
    assert main([str(bare)]) == 2
    assert "no request records" in capsys.readouterr().err


def test_both_one_replica_runs_can_be_the_reference(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    first = [_record(i, 0.010 * (i + 1)) for i in range(10)]  # 10 .. 100 ms
    again = [_record(i, 0.012 * (i + 1)) for i in range(10)]  # the same, run slower
    two = [_record(i, 0.011 * (i + 1)) for i in range(10)]  # between the two
    document = _document({"1": first, "2": two, "1 again": again})
    rows = pool([document], reference="both")["own"]
    assert rows["1 + 1 again"]["num_requests"] == 20 and rows["1 + 1 again"]["num_runs"] == 2
    # Over the first run alone two replicas are 10 % slower; over both, within 5 %.
    assert pool([document])["own"]["2"]["ratio"]["ttft_p90_ms"] == pytest.approx(1.1)
    assert 0.95 < rows["2"]["ratio"]["ttft_p90_ms"] < 1.05
    assert rows["1"]["ratio"]["ttft_p90_ms"] < 1.0 < rows["1 again"]["ratio"]["ttft_p90_ms"]
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    assert main([str(path), "--reference", "both"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "p90 / N=1 (both)" in lines[0]
    assert next(line for line in lines if "| own | 2 |" in line).endswith("PASS |")
    assert main([str(path)]) == 0
    assert next(line for line in capsys.readouterr().out.splitlines()
                if "| own | 2 |" in line).endswith("FAIL |")


def test_an_invocation_slowed_by_other_work_is_left_out_whole(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quiet = _document({"1": [_record(0, 0.010)], "4": [_record(0, 0.010)]}, mode="third-party")
    busy = _document({"1": [_record(0, 0.010)], "4": [_record(0, 0.090)]}, mode="third-party")
    for document, others in ((quiet, (0.01, 0.02)), (busy, (0.0, 0.18))):
        for run, cores in zip(document["third_party"]["runs"].values(), others, strict=True):
            run["others_cores"] = cores
    kept, left_out = undisturbed([quiet, busy], 0.05, ["quiet.json", "busy.json"])
    assert kept == [quiet]
    assert left_out == ["busy.json third-party: left out, other work took 0.18 cores during "
                        "its N=4 run"]
    paths = []
    for name, document in (("quiet.json", quiet), ("busy.json", busy)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(document))
    assert main(["--max-others-cores", "0.05", *map(str, paths)]) == 0
    printed = capsys.readouterr().out
    assert "busy.json third-party: left out" in printed
    assert "| third-party | 4 | 1 | 1 |" in printed  # one run pooled: the quiet one's
    assert main([*map(str, paths)]) == 0
    assert "| third-party | 4 | 2 | 2 |" in capsys.readouterr().out
