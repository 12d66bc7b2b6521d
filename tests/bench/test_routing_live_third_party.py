"""The live routing benchmark's third-party mode: a static fleet with no heartbeats, and a report
with both modes side by side.

No timing or target is asserted: the figures depend on the machine. First a third-party fleet
on its own (2 sims without Redis, listed in the gateway's ``backends:``): ``/admin/fleet`` lists
them from the configuration, loaded from ``/metrics``, with the profile discovered from the
engines' own pages, and nothing beats in Redis. Then a quick run of both modes (own
``prefix_affinity (exact)``, third-party ``prefix_affinity (approx)``) on the shared-prefix and
multi-turn workloads at a fixed rate: four runs, about 25 s.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from backends.publisher import WORKERS_ZSET
from bench.routing.fleet import FleetSpec, routing_fleet

REPO_ROOT = Path(__file__).resolve().parents[2]
OWN, THIRD_PARTY = "prefix_affinity (exact)", "prefix_affinity (approx)"
WORKLOADS = ("shared-prefix", "multi-turn")


def test_a_third_party_fleet_is_static_and_sends_no_heartbeats(tmp_path: Path) -> None:
    spec = FleetSpec("prefix_affinity", mode="third-party", num_workers=2, num_kv_blocks=300)
    with routing_fleet(spec, tmp_path) as fleet:
        response = httpx.get(fleet.url.removesuffix("/v1") + "/admin/fleet", timeout=5,
                             headers={"Authorization": f"Bearer {fleet.admin_token}"})
        backends = response.json()["data"]
        client = redis.Redis.from_url(fleet.redis_url)
        try:
            num_beating = client.zcard(WORKERS_ZSET)
        finally:
            client.close()
    assert num_beating == 0
    assert sorted(b["name"] for b in backends) == sorted(fleet.worker_urls)
    assert {(b["source"], b["load_source"]) for b in backends} == {("config", "metrics")}
    assert all(b["num_prefix_kv_blocks"] is None for b in backends)  # no heartbeat says it
    for backend in backends:
        profile = backend["profile"]
        assert profile["kv_capacity_tokens"] == {"value": 300 * 16, "source": "vllm:/metrics"}
        assert profile["block_size"] == {"value": 16, "source": "vllm:/metrics"}
        assert profile["max_context_tokens"]["source"] == "/v1/models"


def test_the_exact_index_is_refused_in_third_party_mode() -> None:
    with pytest.raises(ValueError, match="approximate"):
        FleetSpec("prefix_affinity", "exact", mode="third-party")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("routing-live-modes") / "routing-live.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.routing", "--quick", "--mode", "both", "--rate", "8",
         "--profiles", "prefix_affinity:exact", "--third-party-profiles",
         "prefix_affinity:approx", "--experiments", ",".join(WORKLOADS), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=100, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads(out.read_text())
    return document, done.stdout


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_each_mode_ran_on_its_own_kind_of_fleet(run: tuple[dict[str, Any], str]) -> None:
    results, _ = run
    assert results["modes"] == ["own", "third-party"]
    for key, label, expected in (("own", OWN, ["heartbeat"]),
                                 ("third_party", THIRD_PARTY, ["config"])):
        for experiment in ("shared_prefix", "multi_turn"):
            figures = results[key][experiment][label]
            assert figures["mode"] == key.replace("_", "-")
            assert figures["fleet"]["sources"] == expected
            assert figures["num_ok"] > 0
    fleet = results["third_party"]["shared_prefix"][THIRD_PARTY]["fleet"]
    assert fleet["load_sources"] == ["metrics"]
    assert fleet["profile_sources"] == ["block_size: vllm:/metrics",
                                        "kv_capacity_tokens: vllm:/metrics",
                                        "max_context_tokens: /v1/models"]


def test_both_modes_are_compared_per_workload(run: tuple[dict[str, Any], str]) -> None:
    results, _ = run
    assert list(results["comparison"]) == list(WORKLOADS)
    for workload, rows in results["comparison"].items():
        [row] = rows
        assert (row["third_party"], row["own"]) == (THIRD_PARTY, OWN), workload
        assert all(_finite(v) for v in row["ratio"].values()), (workload, row["ratio"])
        for name in ("busy_max_mean", "max_mean_requests"):
            assert _finite(row[name]["own"]) and _finite(row[name]["third_party"])
    turns = [results[key]["multi_turn"][label]["turns_kept"]
             for key, label in (("own", OWN), ("third_party", THIRD_PARTY))]
    assert all(t["num_turns"] > 0 and 0 <= t["share"] <= 1 for t in turns), turns


def test_the_report_has_both_modes_and_every_target(run: tuple[dict[str, Any], str]) -> None:
    results, stdout = run
    assert "### Own fleet" in stdout and "### Third-party fleet" in stdout
    assert stdout.startswith("Targets: third-party within 10 % of own-fleet")
    for workload in WORKLOADS:
        assert f"| {workload} | {THIRD_PARTY} | {OWN} |" in stdout
    judged = {(t["target"], t["label"].split(":")[0]) for t in results["targets"]
              if t["mode"] == "third-party / own"}
    assert judged == {(f"third-party / own {name}", workload) for workload in WORKLOADS
                      for name in ("TTFT p90", "TTFT p99", "cached share")}
    assert all(isinstance(t["is_met"], bool) for t in results["targets"])
