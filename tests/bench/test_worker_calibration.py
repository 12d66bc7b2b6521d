"""The calibration fit recovers known step-time coefficients and never goes negative."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.profile import LatencyModel
from bench.worker.calibration import fit_latency_model, write_calibration
from bench.worker.steps import StepSample

TRUE = LatencyModel(a_s=0.02, b_s_per_token=2e-4, c_s_per_seq=1.5e-3, d_s_per_kv_token=3e-6)
SHAPES = [(512, 0, 512), (256, 0, 768), (128, 0, 128), (0, 1, 300), (0, 8, 2400), (0, 32, 9000),
          (0, 8, 8200), (0, 64, 17000), (300, 4, 1500)]


def _samples(model: LatencyModel) -> list[StepSample]:
    return [StepSample(p, d, kv, model.step_time_s(p, d, kv)) for p, d, kv in SHAPES]


def test_recovers_exact_coefficients() -> None:
    fit = fit_latency_model(_samples(TRUE))
    for name in TRUE.__dataclass_fields__:
        assert getattr(fit.model, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert fit.max_abs_relative_error < 1e-6


def test_a_coefficient_the_data_pushes_negative_is_pinned_to_zero() -> None:
    samples = _samples(TRUE)
    # Long-context decodes made cheaper than the rest: least squares wants d < 0.
    samples = [StepSample(s.num_prefill_tokens, s.num_decode_seqs, s.num_kv_tokens,
                          s.seconds * (0.4 if s.num_kv_tokens > 5000 else 1.0))
               for s in samples]
    fit = fit_latency_model(samples)
    assert fit.model.d_s_per_kv_token == 0  # unconstrained least squares gives -9.8e-7
    assert all(getattr(fit.model, name) > 0 for name in ("a_s", "b_s_per_token", "c_s_per_seq"))


def test_needs_four_samples() -> None:
    with pytest.raises(ValueError, match="at least as many"):
        fit_latency_model(_samples(TRUE)[:3])


def test_written_file_loads_in_the_simulator(tmp_path: Path) -> None:
    fit = fit_latency_model(_samples(TRUE))
    path = tmp_path / "calibration.json"
    write_calibration(path, fit, device="cpu", model="tiny", kv_dtype="float32")
    assert LatencyModel.from_json(path) == fit.model
    assert json.loads(path.read_text())["num_samples"] == len(SHAPES)
