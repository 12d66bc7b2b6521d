"""Latency model arithmetic, profile validation and the heartbeat round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.profile import LatencyModel, WorkerProfile

MODEL = LatencyModel(a_s=0.01, b_s_per_token=1e-4, c_s_per_seq=1e-3, d_s_per_kv_token=1e-6)


@pytest.mark.parametrize(
    ("prefill_tokens", "decode_seqs", "kv_tokens", "speed", "expected_s"),
    [
        pytest.param(0, 0, 0, 1.0, 0.0, id="empty-step-is-free"),
        pytest.param(100, 0, 100, 1.0, 0.01 + 0.01 + 1e-4, id="prefill-only"),
        pytest.param(0, 4, 1000, 1.0, 0.01 + 0.004 + 0.001, id="decode-only"),
        pytest.param(100, 4, 1100, 2.0, (0.01 + 0.01 + 0.004 + 0.0011) / 2, id="mixed-2x-speed"),
    ],
)
def test_step_time_is_linear_and_scaled_by_speed(
    prefill_tokens: int, decode_seqs: int, kv_tokens: int, speed: float, expected_s: float
) -> None:
    step_s = MODEL.step_time_s(prefill_tokens, decode_seqs, kv_tokens, speed)
    assert step_s == pytest.approx(expected_s)


def test_default_coefficients_are_in_the_published_ranges() -> None:
    profile = WorkerProfile(model="llama-3-8b")
    batch1_decode_s = profile.latency.step_time_s(0, 1, 1024)
    assert 0.007 <= batch1_decode_s <= 0.015
    assert 10_000 <= profile.prefill_tokens_per_s <= 20_000


def test_latency_model_from_json(tmp_path: Path) -> None:
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"a_s": 0.005, "b_s_per_token": 5e-5, "c_s_per_seq": 2e-5,
                                "d_s_per_kv_token": 4e-8, "r2": 0.99}))
    assert LatencyModel.from_json(path) == LatencyModel(0.005, 5e-5, 2e-5, 4e-8)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param('{"a_s": 0.1}', "lacks 'b_s_per_token'", id="missing-key"),
        pytest.param("[1, 2]", "JSON object", id="not-an-object"),
        pytest.param('{"a_s": -1, "b_s_per_token": 0, "c_s_per_seq": 0, "d_s_per_kv_token": 0}',
                     "a_s must be", id="negative"),
    ],
)
def test_latency_model_from_json_rejects(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        LatencyModel.from_json(path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"model": ""}, "model", id="no-model"),
        pytest.param({"speed_factor": 0.0}, "speed_factor", id="zero-speed"),
        pytest.param({"num_kv_blocks": 0}, "num_kv_blocks", id="no-kv"),
        pytest.param({"max_num_batched_tokens": 0}, "max_num_batched_tokens", id="no-budget"),
        pytest.param({"kv_watermark_frac": 1.0}, "kv_watermark_frac", id="watermark-too-big"),
    ],
)
def test_worker_profile_rejects(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"model": "m", **kwargs}
    with pytest.raises(ValueError, match=message):
        WorkerProfile(**fields)  # type: ignore[arg-type]


def test_worker_profile_json_round_trip() -> None:
    profile = WorkerProfile(model="m", device="sim-a100", speed_factor=0.5, num_kv_blocks=100,
                            block_size=32, max_batch=8, latency=MODEL)
    advertised = json.loads(json.dumps(profile.to_json()))
    assert advertised["kv_capacity_tokens"] == 3200
    assert advertised["prefill_tokens_per_s"] == pytest.approx(profile.prefill_tokens_per_s,
                                                               abs=0.1)
    assert WorkerProfile.from_json(advertised) == profile


def test_prefill_throughput_scales_with_speed() -> None:
    slow = WorkerProfile(model="m", speed_factor=1.0)
    fast = WorkerProfile(model="m", speed_factor=3.0)
    assert fast.prefill_tokens_per_s == pytest.approx(3 * slow.prefill_tokens_per_s)
