"""``GET /metrics`` of a gateway run with several workers (``gateway.workers``): every worker's
series, each with a ``worker`` label, from whichever worker the scrape reached.

Each worker also serves its own metrics on a Unix socket in a directory the supervisor made
(``worker-<index>.sock``). A scrape reads its own, asks each sibling's socket (in parallel,
``SIBLING_TIMEOUT_S`` each), and writes them out as one exposition: the same families, one
series per worker. A sibling that does not answer (restarting) is left out of that scrape, and
``switchyard_workers_unscraped`` says how many. Sum over ``worker`` for the gateway's totals.

Example::

    text = await merged_metrics(own_text, index=0, socket_dir=Path("/run/sy"))
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

SIBLING_TIMEOUT_S = 1.0
OWN_PATH = "/metrics/own"


def socket_path(socket_dir: Path, index: int) -> Path:
    return socket_dir / f"worker-{index}.sock"


async def _sibling_text(path: Path) -> str | None:
    try:
        async with (aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path)),
                                          timeout=aiohttp.ClientTimeout(SIBLING_TIMEOUT_S))
                    as session,
                    session.get("http://worker" + OWN_PATH) as response):
            if response.status != 200:
                return None
            return await response.text()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


class _Families:
    """Metric families from several expositions, each sample labelled with its worker."""

    def __init__(self) -> None:
        self._by_name: dict[str, Metric] = {}

    def add(self, text: str, worker: str) -> None:
        for family in text_string_to_metric_families(text):
            merged = self._by_name.get(family.name)
            if merged is None:
                merged = self._by_name[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit)
            merged.samples += [Sample(s.name, {**s.labels, "worker": worker}, s.value,
                                      s.timestamp, s.exemplar) for s in family.samples]

    def add_missing(self, num_missing: int) -> None:
        missing = self._by_name["switchyard_workers_unscraped"] = Metric(
            "switchyard_workers_unscraped", "Workers whose metrics this scrape could not read "
            "(restarting): their series are absent from it.", "gauge")
        missing.samples.append(Sample("switchyard_workers_unscraped", {}, float(num_missing)))

    def collect(self) -> Iterator[Metric]:
        return iter(self._by_name.values())


async def merged_metrics(own_text: str, *, index: int, num_workers: int,
                         socket_dir: Path) -> tuple[bytes, int]:
    """Every worker's metrics as one exposition, and how many siblings did not answer."""
    siblings = [i for i in range(num_workers) if i != index]
    texts = await asyncio.gather(*(_sibling_text(socket_path(socket_dir, i))
                                   for i in siblings))
    families = _Families()
    families.add(own_text, str(index))
    num_failed = 0
    for sibling, text in zip(siblings, texts, strict=True):
        if text is None:
            num_failed += 1
        else:
            families.add(text, str(sibling))
    families.add_missing(num_failed)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(families)
    return generate_latest(registry), num_failed
