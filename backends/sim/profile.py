"""What a simulated worker is: its latency model and its resource profile.

``LatencyModel`` prices one engine step (one forward pass over a mixed batch)::

    step_time_s = (a_s + b_s_per_token * prefill_tokens + c_s_per_seq * decode_seqs
                   + d_s_per_kv_token * kv_tokens_attended) / speed_factor

Default coefficients: Llama-3-8B in BF16 on one H100 SXM
--------------------------------------------------------
Derived from spec-sheet figures and a roofline, then checked against the ranges
reported for vLLM serving 7-8B models on H100/A100 (low-concurrency inter-token
latency of roughly 7-15 ms; chunked-prefill throughput of roughly 10-20k tokens/s,
the H100 being about 2x an A100, cf. the vLLM, Sarathi-Serve and DistServe papers
and Lambda's vLLM H100/A100 benchmark). They are defaults, not measurements:
``LatencyModel.from_json`` loads coefficients fitted by a batch sweep on real hardware.

Figures used:

* H100 SXM5: 3.35 TB/s HBM3 bandwidth, 989 TFLOP/s dense BF16.
* Llama-3-8B: 8.03e9 parameters (16.06 GB in BF16), 32 layers, 8 KV heads of
  dimension 128, so KV per token = 2 (K, V) * 32 * 8 * 128 * 2 bytes = 131,072 bytes.
* Efficiencies assumed: 70 % of peak bandwidth for streaming reads; ~27 % model FLOP
  utilisation for prefill (attention, norms and launch gaps included).

Derivation:

* ``a_s = 8.0 ms``: every step streams all weights once: 16.06 GB / (0.7 * 3.35 TB/s)
  = 6.85 ms, plus ~1 ms of per-step CPU work (scheduling, sampling, detokenising).
* ``b_s_per_token = 60 us``: 2 * 8.03e9 = 16.06 GFLOP per token at 0.27 * 989 TFLOP/s
  = 267 TFLOP/s. A full 2048-token chunk then runs at ~15.6k tokens/s.
* ``c_s_per_seq = 30 us``: a decode row costs the same FLOPs as a prefill token, but
  below the roofline knee (~295 tokens per step on H100) they hide under the weight
  read; half of ``b`` is the linear average over batch sizes 1-256.
* ``d_s_per_kv_token = 56 ns``: attention reads each cached token's 131,072 bytes of
  KV once per step: 131,072 B / (0.7 * 3.35 TB/s) = 55.9 ns.

So a batch-1 decode at 1k context takes ~8.1 ms (~120 tokens/s per stream), and a
batch-64 decode at 2k context ~17.3 ms (~3.7k tokens/s).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Linear cost of one engine step; see the module docstring for the defaults' source.

    Example::

        model = LatencyModel()
        model.step_time_s(num_prefill_tokens=512, num_decode_seqs=0, num_kv_tokens=512)
        # 0.008 + 512 * 60e-6 + 512 * 56e-9 = 0.0387...
    """

    a_s: float = 8.0e-3
    b_s_per_token: float = 60e-6
    c_s_per_seq: float = 30e-6
    d_s_per_kv_token: float = 56e-9

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"LatencyModel.{name} must be a finite number >= 0, got {value}")

    def step_time_s(
        self,
        num_prefill_tokens: int,
        num_decode_seqs: int,
        num_kv_tokens: int,
        speed_factor: float = 1.0,
    ) -> float:
        """Seconds one step takes; 0.0 for a step with nothing in it."""
        if num_prefill_tokens == 0 and num_decode_seqs == 0:
            return 0.0
        work_s = (
            self.a_s
            + self.b_s_per_token * num_prefill_tokens
            + self.c_s_per_seq * num_decode_seqs
            + self.d_s_per_kv_token * num_kv_tokens
        )
        return work_s / speed_factor

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> LatencyModel:
        """Coefficients from a dict with the four field names (extra keys are ignored)."""
        try:
            return cls(*(float(data[name]) for name in cls.__dataclass_fields__))
        except KeyError as exc:
            raise ValueError(f"latency profile lacks {exc.args[0]!r}; it needs "
                             f"{sorted(cls.__dataclass_fields__)}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> LatencyModel:
        """Coefficients measured by a batch sweep, from a JSON file
        ``{"a_s": .., "b_s_per_token": .., "c_s_per_seq": .., "d_s_per_kv_token": ..}``."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a JSON object of latency coefficients")
        return cls.from_dict(data)


@dataclass(frozen=True, slots=True)
class WorkerProfile:
    """The resources of one simulated worker, fixed for its life and advertised in heartbeats.

    Defaults describe one H100-80GB serving an 8B model: ~48 GiB of KV cache
    (24,576 blocks of 16 tokens at 128 KiB per token) and vLLM's default batch limits.

    Example::

        fast = WorkerProfile(model="llama-3-8b", speed_factor=2.0, num_kv_blocks=64)
        fast.kv_capacity_tokens   # 1024
        fast.to_json()["device"]  # "sim-h100"
    """

    model: str
    device: str = "sim-h100"
    speed_factor: float = 1.0
    num_kv_blocks: int = 24_576
    block_size: int = 16
    max_batch: int = 256
    max_num_batched_tokens: int = 2048
    max_context_tokens: int = 8192
    kv_watermark_frac: float = 0.01
    latency: LatencyModel = field(default_factory=LatencyModel)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("WorkerProfile.model must name the served model")
        if not (math.isfinite(self.speed_factor) and self.speed_factor > 0):
            raise ValueError(f"WorkerProfile.speed_factor must be > 0, got {self.speed_factor}")
        for name in ("num_kv_blocks", "block_size", "max_batch", "max_num_batched_tokens",
                     "max_context_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"WorkerProfile.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.kv_watermark_frac < 1:
            raise ValueError("WorkerProfile.kv_watermark_frac must be in [0, 1)")

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def kv_watermark_blocks(self) -> int:
        """Free blocks kept back at admission so running sequences can still grow."""
        return int(self.kv_watermark_frac * self.num_kv_blocks)

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prefill throughput with full ``max_num_batched_tokens`` chunks and no decodes."""
        chunk_tokens = self.max_num_batched_tokens
        step_s = self.latency.step_time_s(chunk_tokens, 0, chunk_tokens, self.speed_factor)
        return chunk_tokens / step_s

    def to_json(self) -> dict[str, str | int | float]:
        """A flat JSON-ready dict for the heartbeat; ``from_json`` reads it back."""
        return {
            "model": self.model,
            "device": self.device,
            "speed_factor": self.speed_factor,
            "num_kv_blocks": self.num_kv_blocks,
            "block_size": self.block_size,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_batch": self.max_batch,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_context_tokens": self.max_context_tokens,
            "kv_watermark_frac": self.kv_watermark_frac,
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 1),
            **asdict(self.latency),
        }

    @classmethod
    def from_json(cls, data: dict[str, str | int | float]) -> WorkerProfile:
        """The profile a heartbeat advertised (derived fields are ignored)."""
        return cls(
            model=str(data["model"]),
            device=str(data["device"]),
            speed_factor=float(data["speed_factor"]),
            num_kv_blocks=int(data["num_kv_blocks"]),
            block_size=int(data["block_size"]),
            max_batch=int(data["max_batch"]),
            max_num_batched_tokens=int(data["max_num_batched_tokens"]),
            max_context_tokens=int(data["max_context_tokens"]),
            kv_watermark_frac=float(data["kv_watermark_frac"]),
            latency=LatencyModel.from_dict({k: float(v) for k, v in data.items()
                                            if k in LatencyModel.__dataclass_fields__}),
        )
