"""The admission benchmark's targets on hand-made documents: each fleet mode judged at 2x its
own capacity, the quota once, and a missing figure failing its target."""

from __future__ import annotations

from typing import Any

import pytest

from bench.admission.report import judge


def tiers(interactive: float, standard: float, batch_gap_s: float | None,
          num_batch_first: int = 5) -> dict[str, Any]:
    return {"interactive": {"attainment_offered": interactive},
            "standard": {"attainment_admitted": standard},
            "batch": {"longest_gap_s": batch_gap_s, "num_first_tokens_in_window": num_batch_first}}


def mode_run(goodput_rps: float, batch_gap_s: float | None = 2.0, num_batch_first: int = 5,
             retry_admitted: float | None = 0.9) -> dict[str, Any]:
    fairness = {"jain_equal_weight": 0.99, "jain_max_min": 0.96}
    on = {"level": 2.0, "mode": "on", "figures": {
        "goodput_rps": goodput_rps, "fairness": fairness, "jain_max_min_within_tiers": 0.97,
        "tiers": tiers(1.0, 0.97, batch_gap_s, num_batch_first)}}
    off = {"level": 2.0, "mode": "off", "figures": {"goodput_rps": 5.0}}
    return {"capacity": {"capacity_rps": 10.0}, "levels": [on, off],
            "retry": {"retries": {"admitted_share": retry_admitted}}}


def verdicts(document: dict[str, Any]) -> dict[tuple[str, str], bool]:
    return {(t["mode"], t["label"].split(":")[0]): t["passed"] for t in judge(document)}


def test_each_mode_is_judged_on_its_own() -> None:
    found = verdicts({"own": mode_run(9.6), "third_party": mode_run(9.0)})
    assert found[("own", "goodput at 2x / capacity at 1x")] is True  # 0.96
    assert found[("third-party", "goodput at 2x / capacity at 1x")] is False  # 0.90
    assert len(found) == 16  # 8 targets per mode, no quota without the mock fleet


@pytest.mark.parametrize(("run", "label"), [
    pytest.param(mode_run(9.6, batch_gap_s=12.0), "batch never starved at 2x",
                 id="batch-gap-too-long"),
    pytest.param(mode_run(9.6, num_batch_first=0), "batch never starved at 2x",
                 id="batch-never-served"),
    pytest.param(mode_run(9.6, retry_admitted=0.7), "retries at 2x", id="retries-refused"),
    pytest.param(mode_run(9.6, retry_admitted=None), "retries at 2x", id="no-retries-fails"),
])
def test_a_failed_or_missing_figure_fails(run: dict[str, Any], label: str) -> None:
    found = verdicts({"own": run})
    assert found[("own", label)] is False
    assert sum(not passed for passed in found.values()) == 1


def test_the_quota_is_judged_once() -> None:
    quota = {"error_pct": -0.5}
    found = verdicts({"own": mode_run(9.6), "third_party": mode_run(9.6), "quota": quota})
    assert found[("-", "quota")] is True and len(found) == 17

