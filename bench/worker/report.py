"""The worker benchmark's targets and its markdown tables, from the results JSON.

Example::

    for target in check_targets(results):
        print(target.name, target.value, target.passed)
    print(markdown(results))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    goal: str
    value: float
    passed: bool
    shown: str


def _target(name: str, goal: str, value: float, passed: bool, fmt: str) -> Target:
    return Target(name, goal, value, passed, fmt.format(value))


# (section the figure lives in, the check); a section that did not run is skipped.
_CHECKS: tuple[tuple[str, Callable[[dict[str, Any]], Target]], ...] = (
    ("prefix", lambda r: _target(
        f"prefix cache: uncached / cached TTFT ({r['prefix']['prompt_tokens']:,}-token prompt)",
        ">= 5x",
        r["prefix"]["speedup"], r["prefix"]["speedup"] >= 5, "{:.1f}x")),
    ("capacity", lambda r: _target(
        "int8 / 16-bit KV: 2k-token sequences in the budget", "~2x (>= 1.9x)",
        r["capacity"]["int8_vs_16bit_sequences_ratio"],
        r["capacity"]["int8_vs_16bit_sequences_ratio"] >= 1.9, "{:.2f}x")),
    ("capacity", lambda r: _target(
        "MHA / GQA KV bytes per token", "= heads / KV heads",
        r["capacity"]["gqa_bytes_ratio"],
        r["capacity"]["gqa_bytes_ratio"] == r["capacity"]["gqa_expected_ratio"], "{:.2f}x")),
    ("quality", lambda r: _target(
        "int8 vs 16-bit KV: perplexity change", "<= 1%",
        100 * r["quality"]["perplexity"]["int8_relative_change"],
        abs(r["quality"]["perplexity"]["int8_relative_change"]) <= 0.01, "{:+.2f}%")),
    ("quality", lambda r: _target(
        "int8 vs 16-bit KV: greedy agreement, teacher-forced", ">= 95%",
        100 * r["quality"]["greedy"]["teacher_forced_agreement"],
        r["quality"]["greedy"]["teacher_forced_agreement"] >= 0.95, "{:.1f}%")),
)


def check_targets(results: dict[str, Any]) -> list[Target]:
    return [check(results) for section, check in _CHECKS if section in results]


def markdown(results: dict[str, Any]) -> str:
    lines = [f"Model {results['model']}, device {results['device']} "
             f"({results['device_name']}), compute dtype {results['dtype']}."]
    if "sweep" in results:
        lines += ["", *_sweep(results["sweep"])]
    if "prefix" in results:
        lines += ["", *_prefix(results["prefix"])]
    if "capacity" in results:
        lines += ["", *_capacity(results["capacity"])]
    if "quality" in results:
        lines += ["", *_quality(results["quality"])]
    if "calibration" in results:
        lines += ["", *_calibration(results["calibration"])]
    lines += ["", "| target | goal | measured | result |", "| --- | --- | ---: | --- |"]
    lines += [f"| {t.name} | {t.goal} | {t.shown} | **{'PASS' if t.passed else 'FAIL'}** |"
              for t in check_targets(results)]
    return "\n".join(lines)


def _sweep(sweep: dict[str, Any]) -> list[str]:
    lines = [f"Batch sweep ({sweep['prompt_tokens']}-token prompts, KV {sweep['kv_dtype']}, "
             f"{sweep['measured_steps']} decode steps timed per batch and pass, "
             f"{sweep['passes']} passes; stopped: {sweep['stopped']}):", "",
             "| batch | per-token latency ms | range over passes | decode tokens/s "
             "| prefill tokens/s |", "| ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {p['batch_size']} | {p['decode_step_ms']:.1f} | "
              f"{p['decode_step_ms_min']:.1f} .. {p['decode_step_ms_max']:.1f} | "
              f"{p['decode_tokens_per_s']:,.0f} | {p['prefill_tokens_per_s']:,.0f} |"
              for p in sweep["points"]]
    for limit, best in sweep["best_under_limit"].items():
        lines.append(f"- best batch within {limit} ms per token: " + (
            "none" if best is None else
            f"**{best['batch_size']}** ({best['decode_tokens_per_s']:,.0f} tokens/s at "
            f"{best['decode_step_ms']:.1f} ms)"))
    return lines


def _prefix(prefix: dict[str, Any]) -> list[str]:
    return [f"Prefix cache ({prefix['prompt_tokens']}-token prompt, median of "
            f"{prefix['repeats']}): uncached TTFT {prefix['uncached_ttft_ms']:.0f} ms; "
            f"same prompt again ({prefix['cached_tokens']} tokens cached) "
            f"{prefix['cached_ttft_ms']:.1f} ms (**{prefix['speedup']:.1f}x**); same prefix with "
            f"a new {prefix['suffix_tokens']}-token suffix ({prefix['shared_prefix_cached_tokens']}"
            f" cached) {prefix['shared_prefix_ttft_ms']:.1f} ms "
            f"({prefix['shared_prefix_speedup']:.1f}x)."]


def _capacity(capacity: dict[str, Any]) -> list[str]:
    budget, tokens = capacity["budget_gib"], capacity["sequence_tokens"]
    lines = [f"KV capacity in {budget:g} GiB ({tokens}-token sequences admitted by the block "
             "manager):", "",
             "| KV | KV heads | bytes/token | blocks | sequences |",
             "| --- | ---: | ---: | ---: | ---: |"]
    rows = [*capacity["rows"].values(), {**capacity["mha_bfloat16"],
                                         "kv_dtype": "bfloat16, full MHA KV"}]
    lines += [f"| {r['kv_dtype']} | {r['num_kv_heads']} | {r['bytes_per_token']:,} | "
              f"{r['num_blocks']:,} | {r['num_sequences']} |" for r in rows]
    lines.append(f"- int8 / 16-bit: {capacity['int8_vs_16bit_bytes_ratio']:.3f}x fewer bytes, "
                 f"{capacity['int8_vs_16bit_sequences_ratio']:.2f}x the sequences; MHA / GQA: "
                 f"{capacity['gqa_bytes_ratio']:.2f}x the bytes (heads / KV heads = "
                 f"{capacity['num_heads']} / {capacity['num_kv_heads']})")
    return lines


def _quality(quality: dict[str, Any]) -> list[str]:
    ppl, greedy = quality["perplexity"], quality["greedy"]
    lines = [f"Perplexity ({ppl['num_segments']} x {ppl['segment_tokens']}-token windows, "
             f"{ppl['num_scored_tokens']:,} tokens scored; logit errors against "
             f"{quality['reference_kv_dtype']} KV):", "",
             "| KV | perplexity | mean abs logit error | max abs logit error | top-1 = reference |",
             "| --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {name} | {row['perplexity']:.4f} | {row['mean_abs_logit_error']:.4f} | "
              f"{row['max_abs_logit_error']:.3f} | "
              f"{100 * row['top1_agreement_with_reference']:.2f}% |"
              for name, row in ppl["by_kv_dtype"].items()]
    free, control = greedy["free_running"], greedy["free_running_control"]
    lines += [
        f"- int8 vs {quality['baseline_kv_dtype']}: perplexity "
        f"{100 * ppl['int8_relative_change']:+.3f}%",
        f"- greedy, {greedy['num_prompts']} prompts x {greedy['num_new_tokens']} tokens, "
        f"teacher-forced: {100 * greedy['teacher_forced_agreement']:.1f}% agree "
        "(the baseline with itself: "
        f"{100 * greedy['teacher_forced_baseline_self_agreement']:.1f}%)",
        f"- free-running: {free['matched_tokens']}/{free['total_tokens']} tokens before the "
        f"first divergence, {free['identical_sequences']}/{greedy['num_prompts']} sequences "
        f"identical; control ({control['kv_dtype']} vs {quality['baseline_kv_dtype']}): "
        f"{control['matched_tokens']}/{control['total_tokens']}, "
        f"{control['identical_sequences']}/{greedy['num_prompts']} identical",
    ]
    return lines


def _calibration(calibration: dict[str, Any]) -> list[str]:
    return [f"Calibration ({calibration['num_samples']} steps, written to "
            f"`{calibration['path']}`): a_s {1000 * calibration['a_s']:.2f} ms, b "
            f"{1e6 * calibration['b_s_per_token']:.1f} µs/prefill token, c "
            f"{1e6 * calibration['c_s_per_seq']:.1f} µs/decode seq, d "
            f"{1e9 * calibration['d_s_per_kv_token']:.1f} ns/KV token; median |error| "
            f"{100 * calibration['median_abs_relative_error']:.1f}%, max "
            f"{100 * calibration['max_abs_relative_error']:.1f}%."]
