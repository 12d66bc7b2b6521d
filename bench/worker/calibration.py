"""Calibration export: the simulator's step-time model fitted to measured engine steps.

The simulator prices a step as ``a_s + b_s_per_token * prefill_tokens + c_s_per_seq *
decode_seqs + d_s_per_kv_token * kv_tokens_attended`` (`backends.sim.profile.LatencyModel`).
`fit_latency_model` fits the four coefficients to `StepSample`s by least squares on the
*relative* error (each row divided by its measured time, so a 20 ms decode step counts as much
as a 2 s prefill), keeping every coefficient >= 0 (a negative one is pinned to 0 and the rest
refitted). `write_calibration` writes the JSON the simulator loads::

    switchyard sim --latency-json bench/results/worker-calibration-cpu.json

Example::

    fit = fit_latency_model(samples)
    fit.model.step_time_s(num_prefill_tokens=512, num_decode_seqs=0, num_kv_tokens=512)
    write_calibration(path, fit, device="cpu", model="SmolLM2-135M-Instruct", kv_dtype="float32")
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backends.sim.profile import LatencyModel
from bench.worker.steps import StepSample

COEFFICIENTS = ("a_s", "b_s_per_token", "c_s_per_seq", "d_s_per_kv_token")


@dataclass(frozen=True, slots=True)
class LatencyFit:
    model: LatencyModel
    num_samples: int
    median_abs_relative_error: float
    max_abs_relative_error: float


def fit_latency_model(samples: Sequence[StepSample]) -> LatencyFit:
    """Non-negative least squares on relative error; ValueError with fewer than 4 samples."""
    if len(samples) < len(COEFFICIENTS):
        raise ValueError(f"a fit of {len(COEFFICIENTS)} coefficients needs at least as many "
                         f"step samples, got {len(samples)}")
    features = np.array([[1.0, s.num_prefill_tokens, s.num_decode_seqs, s.num_kv_tokens]
                         for s in samples])
    seconds = np.array([s.seconds for s in samples])
    weighted, ones = features / seconds[:, None], np.ones(len(samples))
    active = list(range(len(COEFFICIENTS)))
    coefficients = np.zeros(len(COEFFICIENTS))
    while active:
        solution, *_ = np.linalg.lstsq(weighted[:, active], ones, rcond=None)
        if (solution >= 0).all():
            coefficients[active] = solution
            break
        active.pop(int(np.argmin(solution)))  # pin the most negative to 0, refit the rest
    model = LatencyModel(*(float(c) for c in coefficients))
    errors = [abs(model.step_time_s(s.num_prefill_tokens, s.num_decode_seqs, s.num_kv_tokens)
                  / s.seconds - 1) for s in samples]
    return LatencyFit(model, len(samples), statistics.median(errors), max(errors))


def write_calibration(path: Path, fit: LatencyFit, *, device: str, model: str,
                      kv_dtype: str) -> dict[str, object]:
    """The four coefficients (what `LatencyModel.from_json` reads) plus where they came from;
    the simulator ignores the extra keys."""
    document: dict[str, object] = {
        name: getattr(fit.model, name) for name in COEFFICIENTS}
    document |= {"device": device, "model": model, "kv_dtype": kv_dtype,
                 "num_samples": fit.num_samples,
                 "median_abs_relative_error": fit.median_abs_relative_error,
                 "max_abs_relative_error": fit.max_abs_relative_error,
                 "source": "python -m bench.worker (batch sweep steps)"}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    return document
