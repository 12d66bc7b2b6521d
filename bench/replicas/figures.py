"""The replicas bench's figures and verdicts: pure functions over what the runs recorded.

- **ratios**: each N-replica run's cached-token share and TTFT p90 / p99 over the one-replica
  run of the same invocation and mode;
- **token quota**: tokens admitted (what the gateway charged: its prompt count plus the
  completion) against a ``tokens_per_minute`` GCRA's allowance; requests against a
  ``requests_per_minute`` one come from `bench.admission.quota.quota_figures`;
- **revocation**: per trial, the slowest replica's time from the revoke to its first refusal;
- **convergence**: which backend each prefix group is routed to, how often a restarted
  replica agrees with a replica that kept running, and how often its picks hit the cache;
- **verdicts**: each target, as `bench.routing.report.verdict` judges one.

Example::

    ratios({"1": one, "2": two})["2"]["cached_fraction"]   # 0.99: N=2 keeps 99 % of N=1's
    token_quota_figures([(0.0, 200, 120), (0.1, 429, 0)], tpm=6000)["admitted_to_allowance"]
    agreement({0: "sim-1", 1: "sim-2"}, {0: "sim-1", 1: "sim-3"})   # 0.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.common.stats import median
from bench.routing.report import ratio_of, verdict

# (figure, its place in a run's figures, whether higher is better)
COMPARED = (("cached_fraction", ("cached_fraction",), True),
            ("ttft_p90_ms", ("ttft_ms", "p90"), False),
            ("ttft_p99_ms", ("ttft_ms", "p99"), False))
RATIO_TOLERANCE = 0.05  # N replicas within 5 % of one
QUOTA_TOLERANCE = 0.01  # admitted within 1 % of the allowance, never over
REVOCATION_LIMIT_S = 1.0


def figure_of(run: Mapping[str, Any], path: Sequence[str]) -> float | None:
    value: Any = run
    for key in path:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return float(value)


def ratios(runs: Mapping[str, Mapping[str, Any]], base: str = "1"
           ) -> dict[str, dict[str, float | None]]:
    """Each run's `COMPARED` figures over the ``base`` run's (``runs``: label -> figures,
    labelled by the number of replicas, e.g. ``"1"``, ``"4"``, ``"1 again"``)."""
    if base not in runs:
        return {}
    return {label: {name: ratio_of(figure_of(run, path), figure_of(runs[base], path))
                    for name, path, _ in COMPARED}
            for label, run in runs.items()}


def token_quota_figures(sent: Sequence[tuple[float, int, int]], tpm: int) -> dict[str, Any]:
    """Tokens admitted against a ``tpm`` GCRA's allowance (a burst of ``tpm``, then ``tpm``
    a minute: ``floor(tpm * (1 + elapsed_s / 60))`` by ``elapsed_s``); ``sent``: (sent at,
    status, tokens charged) per request."""
    admitted = [tokens for _, status, tokens in sent if status == 200]
    elapsed_s = sent[-1][0] - sent[0][0] if sent else 0.0
    allowance = math.floor(tpm * (1 + elapsed_s / 60) + 1e-9)
    num_tokens = sum(admitted)
    return {"num_sent": len(sent), "num_admitted": len(admitted),
            "num_refused": sum(status == 429 for _, status, _ in sent),
            "num_other": sum(status not in (200, 429) for _, status, _ in sent),
            "window_s": elapsed_s, "admitted_tokens": num_tokens, "allowance_tokens": allowance,
            "admitted_to_allowance": num_tokens / allowance if allowance else None}


def revocation_figures(trials: Sequence[Mapping[str, float | None]]) -> dict[str, Any]:
    """Per trial, replica -> seconds from the revoke to its first refusal (None: never within
    the bound); the slowest replica of each trial, their median and worst."""
    slowest: list[float | None] = []
    for trial in trials:
        values = list(trial.values())
        slowest.append(None if not values or any(v is None for v in values)
                       else max(v for v in values if v is not None))
    measured = [s for s in slowest if s is not None]
    return {"slowest_s": slowest, "num_never": len(slowest) - len(measured),
            "median_s": median(measured) if measured else None,
            "max_s": max(measured) if len(measured) == len(slowest) and measured else None}


def agreement(reference: Mapping[int, str], picks: Mapping[int, str]) -> float | None:
    """The share of the groups in ``picks`` routed to ``reference`` 's backend."""
    judged = [g for g in picks if g in reference]
    if not judged:
        return None
    return sum(picks[g] == reference[g] for g in judged) / len(judged)


def hit_share(probes: Iterable[Any]) -> float | None:
    """The share of ``probes`` (each with ``is_hit``) that hit the prefix cache."""
    hits = [bool(p.is_hit) for p in probes]
    return sum(hits) / len(hits) if hits else None


def converged_after_s(rounds: Sequence[Mapping[str, Any]], baseline: float | None,
                      key: str = "hit_share") -> float | None:
    """The offset of the first probe round from which every round's ``key`` is at least
    ``baseline`` (a replica that kept running), or None if the last one's is not."""
    if baseline is None:
        return None
    since: float | None = None
    for row in rounds:
        share = row.get(key)
        if share is not None and share >= baseline:
            since = row["offset_s"] if since is None else since
        else:
            since = None
    return since


def _judge(target: str, label: str, value: float | None, limit: float,
           at_least: bool = False) -> dict[str, Any]:
    return {**verdict(target, label, value, limit, at_least), "at_least": at_least}


def verdicts(mode_results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every target judged (`bench.routing.report.verdict`, and whether the limit is a
    floor), for each mode's results."""
    out: list[dict[str, Any]] = []
    for mode, results in mode_results.items():
        for num, row in results.get("ratios", {}).items():
            if not num.isdigit() or num == "1":  # "1 again" measures the noise: not judged
                continue
            for name, _, is_higher_better in COMPARED:
                limit = 1 - RATIO_TOLERANCE if is_higher_better else 1 + RATIO_TOLERANCE
                out.append(_judge(f"{name}, N replicas / 1", f"{mode}, N={num}", row[name],
                                   limit, at_least=is_higher_better))
        quota = results.get("quota") or {}
        for limit_name in ("rpm", "tpm"):
            if limit_name in quota:
                value = quota[limit_name].get("admitted_to_allowance")
                label = f"{mode}, N={quota['num_replicas']}"
                target = f"{limit_name.upper()}: admitted / allowance"
                out.append(_judge(target, label, value, 1 - QUOTA_TOLERANCE, at_least=True))
                out.append(_judge(target, label, value, 1.0))
        revocation = results.get("revocation")
        if revocation:
            out.append(_judge("revocation: slowest replica (s)",
                               f"{mode}, N={revocation['num_replicas']}",
                               revocation["figures"]["max_s"], REVOCATION_LIMIT_S))
    return out
