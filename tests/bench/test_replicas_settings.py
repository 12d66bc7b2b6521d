"""bench.replicas' experiment settings: ``--set`` overrides, the same-CPU control's share, its
report line."""

from __future__ import annotations

from typing import Any

import pytest

from bench.replicas.bench import gateway_side_cores, parse_override
from bench.replicas.fleet import set_dotted
from bench.replicas.report import same_cpu_line


def test_an_override_is_a_dotted_path_and_a_yaml_value() -> None:
    assert parse_override("routing.share_push_ms=5") == ("routing.share_push_ms", 5)
    assert parse_override("routing.profile=round_robin") == ("routing.profile", "round_robin")
    assert parse_override("admission.slo_enabled=true") == ("admission.slo_enabled", True)


@pytest.mark.parametrize("item", ["routing.share_push_ms", "=5", "routing..x=1", "a.=1"])
def test_a_malformed_override_says_what_it_takes(item: str) -> None:
    with pytest.raises(ValueError, match="PATH=VALUE"):
        parse_override(item)


def test_set_dotted_makes_sections_and_keeps_the_rest() -> None:
    settings: dict[str, Any] = {"routing": {"profile": "prefix_affinity"}}
    set_dotted(settings, "routing.share_push_ms", 5)
    set_dotted(settings, "admission.slo_enabled", True)
    assert settings == {"routing": {"profile": "prefix_affinity", "share_push_ms": 5},
                        "admission": {"slo_enabled": True}}
    with pytest.raises(ValueError, match="not a section"):
        set_dotted(settings, "routing.profile.x", 1)


def _run(sim: float, gateways: list[float], own: float, *, apart: bool,
         driver_apart: bool = False) -> dict[str, Any]:
    cores = {"sim": sim, "redis": 0.01, "front": 0.05}
    cores.update({f"gateway-{i}": c for i, c in enumerate(gateways)})
    return {"process_cores": cores, "own_cores": own,
            "cores": {"engines": [0], "rest": [1]} if apart else None,
            "driver_apart": driver_apart}


def test_the_engines_count_beside_the_gateways_only_when_they_share_their_cores() -> None:
    one, four = _run(0.2, [0.1], 0.1, apart=True), _run(0.3, [0.08] * 4, 0.12, apart=True)
    assert gateway_side_cores(one) == pytest.approx(0.26)
    assert gateway_side_cores(four) - gateway_side_cores(one) == pytest.approx(0.24)
    shared = _run(0.2, [0.1], 0.1, apart=False)
    assert gateway_side_cores(shared) == pytest.approx(0.46)


def test_with_the_driver_beside_the_engines_only_the_gateways_and_redis_count() -> None:
    one = _run(0.2, [0.1], 0.1, apart=True, driver_apart=True)
    four = _run(0.3, [0.08] * 4, 0.12, apart=True, driver_apart=True)
    assert gateway_side_cores(one) == pytest.approx(0.11)
    assert gateway_side_cores(four) - gateway_side_cores(one) == pytest.approx(0.22)


def test_the_same_cpu_line_gives_the_control_and_the_ratios() -> None:
    line = same_cpu_line({"label": "1 + 0.24 cores", "compared": "4",
                          "ballast": {"target_cores": 0.24, "cores": 0.238},
                          "ttft_ms": {"p50": 28.0, "p90": 34.4, "p99": 45.2},
                          "cached_fraction": 0.936,
                          "ratio": {"ttft_p90_ms": 1.02, "ttft_p99_ms": 1.04,
                                    "cached_fraction": 1.0}})
    assert "1 + 0.24 cores" in line and "burnt 0.24" in line
    assert "28 / 34 / 45 ms" in line
    assert "N=4 over it: TTFT p90 1.020, p99 1.040, cached 1.000" in line
