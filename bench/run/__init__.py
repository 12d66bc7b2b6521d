"""The load generator: ``switchyard bench run`` / ``python -m bench.run``.

Workloads (`bench.run.workloads`) are pure, seeded generators of request specs; arrival
processes (`bench.run.arrivals`) are pure functions of a seeded RNG; the driver
(`bench.run.driver`) sends them through one aiohttp session (`bench.run.client`) and records
each request; `bench.run.summary`, `bench.run.report` and `bench.run.plots` turn the records into
results.json, summary.md and PNGs. See ``python -m bench.run --help``.
"""

from __future__ import annotations

from bench.run.options import OptionError
from bench.run.spec import Record, RequestSpec, TenantSpec

__all__ = ["OptionError", "Record", "RequestSpec", "TenantSpec"]
