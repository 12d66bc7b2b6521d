"""bench.replicas.sync_cost, smoke: both clients measured, every entry read, figures written."""

from __future__ import annotations

import json
from pathlib import Path

from bench.replicas.sync_cost import main


def test_both_clients_are_measured_and_every_entry_is_read(tmp_path: Path) -> None:
    out = tmp_path / "sync-cost.json"
    assert main(["--entries", "60", "--rounds", "1", "--interval-ms", "2",
                 "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert [run["client"] for run in figures["runs"]] == ["redis-py", "plain"]
    for run in figures["runs"]:
        assert run["reader_entries"] == 60
        assert run["writer"]["unsent"] == 0
        assert run["writer_us_per_entry"] > 0 and run["reader_us_per_entry"] > 0
    assert set(figures["ratio"]) == {"writer", "reader"}


def test_bad_counts_are_refused() -> None:
    assert main(["--entries", "0"]) == 2
    assert main(["--interval-ms", "0"]) == 2
