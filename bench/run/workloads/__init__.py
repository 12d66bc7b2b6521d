"""Workloads by name: pure, seeded generators of `RequestSpec` values.

Example::

    specs = WORKLOADS["shared-prefix"](WorkloadOptions(), tenants, 1)
"""

from __future__ import annotations

from bench.run.workloads import fixed, long_doc, multi_turn, shared_prefix, trace
from bench.run.workloads.base import Generate, TokenRange, WorkloadOptions, zipf_weights

__all__ = ["WORKLOADS", "Generate", "TokenRange", "WorkloadOptions", "zipf_weights"]

WORKLOADS: dict[str, Generate] = {
    "shared-prefix": shared_prefix.generate,
    "multi-turn": multi_turn.generate,
    "long-doc": long_doc.generate,
    "trace": trace.generate,
    "fixed": fixed.generate,
}
