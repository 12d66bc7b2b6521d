"""Which runs each experiment of ``bench.routing.live`` makes, in each fleet mode.

- **shared-prefix**: every profile of the mode;
- **multi-turn**: round_robin and the prefix_affinity variants (`MULTI_TURN_PROFILES`);
- **hot-prefix**: each prefix_affinity variant, on the uniform and the hot workload;
- **kv-pressure**: at each worker KV point, each prefix_affinity variant and round_robin as a
  reference.

A profile's runs in the different modes go back to back, so the pair compared across the modes
meets the same machine (which other work shares). Example::

    runs = run_experiments(run, {"own": own_specs, "third-party": third_party_specs},
                           ["shared-prefix"], load, hot_load, {"25%": 824})
    runs["third-party"]["shared_prefix"]["round_robin"]["ttft_ms"]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bench.common.fleet_modes import Mode
from bench.routing.drive import Load
from bench.routing.fleet import FleetSpec

RunOne = Callable[[FleetSpec, str, Load], dict[str, Any]]  # spec, workload, load -> figures
MULTI_TURN_PROFILES = ("round_robin", "prefix_affinity:approx", "prefix_affinity:exact")


def _is_affinity(name: str) -> bool:
    return name.startswith("prefix_affinity")


def interleaved(specs: Mapping[Mode, Mapping[str, FleetSpec]], keep: Callable[[str], bool]
                ) -> list[tuple[Mode, str]]:
    """(mode, profile) in running order: each kept profile in every mode that has it."""
    order = dict.fromkeys(p for names in specs.values() for p in names if keep(p))
    return [(mode, p) for p in order for mode, names in specs.items() if p in names]


def run_experiments(run: RunOne, specs: Mapping[Mode, Mapping[str, FleetSpec]],
                    experiments: Sequence[str], load: Load, hot_load: Load,
                    pressure_blocks: Mapping[str, int]) -> dict[Mode, dict[str, Any]]:
    """Every experiment asked for; ``specs``: mode -> profile name -> its fleet at the main
    worker KV; ``pressure_blocks``: KV-pressure point -> worker KV blocks. Each mode's results
    by experiment, then profile label."""
    out: dict[Mode, dict[str, Any]] = {mode: {} for mode in specs}
    if "shared-prefix" in experiments:
        for mode, p in interleaved(specs, lambda p: True):
            spec = specs[mode][p]
            out[mode].setdefault("shared_prefix", {})[spec.label] = run(spec, "shared-prefix",
                                                                        load)
    if "multi-turn" in experiments:
        for mode, p in interleaved(specs, lambda p: p in MULTI_TURN_PROFILES):
            spec = specs[mode][p]
            out[mode].setdefault("multi_turn", {})[spec.label] = run(spec, "multi-turn", load)
    if "hot-prefix" in experiments:
        for mode, p in interleaved(specs, _is_affinity):
            spec = specs[mode][p]
            out[mode].setdefault("hot_prefix", {})[spec.label] = {
                "uniform": run(spec, "uniform", hot_load), "hot": run(spec, "hot", hot_load)}
    if "kv-pressure" in experiments:
        for point, blocks in pressure_blocks.items():
            for mode, p in interleaved(specs, lambda p: _is_affinity(p) or p == "round_robin"):
                spec = replace(specs[mode][p], num_kv_blocks=blocks)
                points = out[mode].setdefault("kv_pressure", {"points": {}})["points"]
                points.setdefault(point, {})[spec.label] = run(spec, "shared-prefix", load)
    return out
