"""``bench.replicas.misses``: each miss of a run joined to its gateway's request-log line by
the request index the bench sends as ``x-request-id``, and told by kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.replicas.misses import classify, misses


def record(index: int, cached: int, ideal: int, sent_at_s: float = 20.0) -> dict[str, Any]:
    return {"index": index, "sent_at_s": sent_at_s, "ttft_s": 0.15, "group": 3,
            "worker": "sim-1", "num_prompt_tokens": 2000, "num_cached_tokens": cached,
            "ideal_cached_tokens": ideal}


def test_each_miss_is_told_by_what_routing_knew(tmp_path: Path) -> None:
    run_dir = tmp_path / "own-2"
    run_dir.mkdir()
    logged = {1: (0, 0), 2: (0, 1800), 3: (1800, 1800)}  # index: (expected, best)
    claims = {3: {"claim_age_s": 12.5, "claim_ttl_s": 600.0}}  # sent on an approximate claim
    (run_dir / "gateway-0.log").write_text("switchyard gateway listening\n" + "".join(
        json.dumps({"request_id": f"bench-{i}", "expected_cached_tokens": e,
                    "best_cached_tokens": b} | claims.get(i, {})) + "\n"
        for i, (e, b) in logged.items()))
    result = {"config": {"warmup_s": 10}, "modes": ["own"], "own": {"runs": {"2": {"records": [
        record(1, 0, 1800), record(2, 0, 1800), record(3, 0, 1800), record(4, 0, 1800),
        record(5, 1800, 1800), record(6, 0, 1800, sent_at_s=5.0)]}}}}
    ((mode, label, kinds, rows),) = list(misses(result, tmp_path))
    assert (mode, label) == ("own", "2")
    assert kinds == {"nowhere": 1, "sent away": 1, "evicted": 1, "unlogged": 1}
    assert len(rows) == 4 and "gateway-0" in rows[0]
    evicted = next(row for row in rows if row.endswith(")"))
    assert "evicted  (claim 12.5 s old, lifetime 600.0 s)" in evicted
    assert sum("claim" in row for row in rows) == 1


def test_a_line_without_routing_fields_is_unlogged() -> None:
    assert classify(1800, {"request_id": "bench-1"}) == "unlogged"
    assert classify(1800, None) == "unlogged"
