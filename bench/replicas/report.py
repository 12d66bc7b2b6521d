"""The tables of ``python -m bench.replicas``: pure functions of its results dict.

Example::

    print(document_markdown(results))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.common.fleet_modes import key_of
from bench.routing.report import fmt


def _ratio(value: float | None) -> str:
    return fmt(value, 3)


def runs_table(results: Mapping[str, Any]) -> str:
    """One row per run of a mode: its figures and their ratios to one replica."""
    lines = ["| replicas | req/s | requests per replica | cached | / N=1 | TTFT p50 / p90 / p99 "
             "(ms) | p90 / N=1 | p99 / N=1 | share of ideal | errors | others' cores |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, run in results["runs"].items():
        ratio = results["ratios"].get(label, {})
        ttft = run["ttft_ms"]
        per_replica = " / ".join(fmt(r["requests"]) for r in run["per_replica"])
        lines.append(
            f"| {label} | {fmt(run['throughput_rps'], 1)} | {per_replica} | "
            f"{fmt(run['cached_fraction'], 3)} | {_ratio(ratio.get('cached_fraction'))} | "
            f"{fmt(ttft['p50'])} / {fmt(ttft['p90'])} / {fmt(ttft['p99'])} | "
            f"{_ratio(ratio.get('ttft_p90_ms'))} | {_ratio(ratio.get('ttft_p99_ms'))} | "
            f"{fmt(run['share_of_ideal'], 3)} | {run['num_errors']} | "
            f"{fmt(run['others_cores'], 2)} |")
    return "\n".join(lines)


def quota_table(quota: Mapping[str, Any]) -> str:
    rpm, tpm = quota["rpm"], quota["tpm"]
    return "\n".join([
        "| limit | sent | window (s) | admitted | allowance | admitted / allowance |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        f"| {rpm['limit']:,} req/min | {rpm['num_sent']:,} | {fmt(rpm['window_s'], 1)} | "
        f"{rpm['num_admitted']:,} requests | {rpm['allowance']:,} | "
        f"{fmt(rpm['admitted_to_allowance'], 4)} |",
        f"| {tpm['limit']:,} tokens/min | {tpm['num_sent']:,} | {fmt(tpm['window_s'], 1)} | "
        f"{tpm['admitted_tokens']:,} tokens ({tpm['num_admitted']:,} requests) | "
        f"{tpm['allowance_tokens']:,} | {fmt(tpm['admitted_to_allowance'], 4)} |"])


def revocation_line(revocation: Mapping[str, Any]) -> str:
    figures = revocation["figures"]
    slowest = ", ".join("never" if s is None else f"{s * 1000:.0f}"
                        for s in figures["slowest_s"])
    return (f"Revocation across {revocation['num_replicas']} replicas, slowest replica per "
            f"trial (ms): {slowest}; median {fmt(_ms(figures['median_s']))} ms, worst "
            f"{fmt(_ms(figures['max_s']))} ms.")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def convergence_lines(convergence: Mapping[str, Any]) -> str:
    rounds = ", ".join(f"+{r['sent_after_ready_s']:.2f} s: {fmt(r['hit_share'], 2)} / "
                       f"{fmt(r['agreement'], 2)}" for r in convergence["rounds"])
    baseline = convergence["baseline"]
    return (f"Restart of replica {convergence['restarted_replica']}: stop to exit "
            f"{convergence['stop_to_exit_s']:.2f} s, start to ready "
            f"{convergence['restart_to_ready_s']:.2f} s; hit share / agreement with replica 0 "
            f"by probe round after ready: {rounds} (a running replica's: "
            f"{fmt(baseline['hit_share'], 2)} / {fmt(baseline['agreement'], 2)}); converged "
            f"{_after(convergence['converged_after_ready_s'])} after ready, "
            f"{_after(convergence['restart_to_converged_s'])} after the start.")


def _after(seconds: float | None) -> str:
    return "never (within the rounds)" if seconds is None else f"{seconds:.2f} s"


def verdicts_table(targets: list[Mapping[str, Any]]) -> str:
    lines = ["| target | run | value | limit | verdict |", "| --- | --- | ---: | ---: | --- |"]
    for v in targets:
        sign = ">=" if v.get("at_least") else "<="
        lines.append(f"| {v['target']} | {v['label']} | {fmt(v['value'], 4)} | {sign} "
                     f"{v['limit']:g} | {'PASS' if v['is_met'] else 'FAIL'} |")
    return "\n".join(lines)


def same_cpu_line(same: Mapping[str, Any]) -> str:
    """The same-CPU control: one replica with the largest fleet's extra CPU burnt beside it."""
    ttft, ratio = same["ttft_ms"], same["ratio"]
    burnt = same.get("ballast", {}).get("cores")
    return (f"Same CPU ({same['label']}: one replica, a ballast burning the cores "
            f"N={same['compared']} used beside the engines more than N=1 did; it burnt "
            f"{fmt(burnt, 2)}): TTFT p50 / p90 / p99 {fmt(ttft['p50'])} / {fmt(ttft['p90'])} / "
            f"{fmt(ttft['p99'])} ms, cached {fmt(same['cached_fraction'], 3)}; N="
            f"{same['compared']} over it: TTFT p90 {_ratio(ratio.get('ttft_p90_ms'))}, p99 "
            f"{_ratio(ratio.get('ttft_p99_ms'))}, cached {_ratio(ratio.get('cached_fraction'))}.")


def _cores(cores: Mapping[str, Any] | None, driver_apart: bool = False) -> str:
    if not cores:
        return "the simulated engines share every core with the rest"
    engines, rest = (", ".join(map(str, cores[key])) for key in ("engines", "rest"))
    if driver_apart:
        return (f"the simulated engines, the front and the load generator on core {engines}, "
                f"the gateways and Redis on {rest}")
    return (f"the simulated engines on core {engines}, the gateways, Redis, the front and the "
            f"load generator on {rest}")


def document_markdown(results: Mapping[str, Any]) -> str:
    """Every mode's tables, the control run and the verdicts."""
    config = results["config"]
    parts = [f"Replicas measured as one: {results['config']['date']}, "
             f"{results['config']['rate_per_s']} req/s for {results['config']['send_s']:g} s "
             f"(the first {results['config']['warmup_s']:g} s left out), KV "
             f"{results['kv']['num_kv_blocks']} blocks a worker; "
             f"{_cores(config.get('cores'), bool(config.get('driver_apart')))}."]
    for mode in results["modes"]:
        mode_results = results[key_of(mode)]
        parts += [f"\n## {mode}\n", runs_table(mode_results)]
        if "control" in mode_results:
            control = mode_results["control"]
            parts.append(f"\nWithout shared state ({control['label']}): cached "
                         f"{fmt(control['cached_fraction'], 3)} "
                         f"({_ratio(control['ratio']['cached_fraction'])} of N=1), TTFT "
                         f"p90 / p99 {_ratio(control['ratio']['ttft_p90_ms'])} / "
                         f"{_ratio(control['ratio']['ttft_p99_ms'])} of N=1.")
        if "same_cpu" in mode_results:
            parts += ["", same_cpu_line(mode_results["same_cpu"])]
        if "quota" in mode_results:
            parts += [f"\nQuota, {mode_results['quota']['num_replicas']} replicas:\n",
                      quota_table(mode_results["quota"])]
        if "revocation" in mode_results:
            parts += ["", revocation_line(mode_results["revocation"])]
        if "convergence" in mode_results:
            parts += ["", convergence_lines(mode_results["convergence"])]
    parts += ["\n## Verdicts\n", verdicts_table(results["targets"])]
    return "\n".join(parts)
