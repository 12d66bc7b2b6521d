"""A third-party fleet as the gateway sees it: ``/metrics`` scrapes and profile discovery, by
``backends/fleet/sync.py``'s own ``FleetSync``, in virtual time.

A third-party engine (vLLM, SGLang) tells the gateway nothing; the gateway reads its pages.
``EnginePages`` is a ``FleetSync`` whose one I/O seam, the page fetch ``_get``, answers from
the simulated engines' cores instead of HTTP, with the pages ``backends/sim/server.py`` serves:

- ``/metrics``: the lines the gateway reads, in vLLM's names: running, waiting and KV usage
  (``SimEngineCore.load()``, the figures the sim server renders) and ``vllm:cache_config_info``
  (block size, number of KV blocks);
- ``/v1/models``: the model with its ``max_model_len``;
- SGLang's ``/get_server_info`` and llama.cpp's ``/props``: not found, as the sim answers.

So what reaches each ``Backend`` is what ``FleetSync._scrape`` and ``discover_profile`` make
of those pages: ``load_source`` ``"metrics"``, running / waiting / KV usage and nothing else
(no queued prefill tokens, no prefix blocks), ``num_finished_since_load`` reset, the block
size, KV capacity and context length as discovered, and a max batch only once
``SaturationWatch`` infers one from two saturated scrapes in a row. The one change: FleetSync
stamps the load with ``time.monotonic()``; the simulation's clock replaces that stamp. The
fetches answer at once, so their coroutines finish in one ``send`` with no event loop.

With ``scrapes`` (several replicas, ``routing.share_scrapes``) each replica's ``EnginePages``
carries its own ``ScrapeShare``, as ``gateway/app.py`` gives ``FleetSync`` one: the simulation
asks it which engines are due, and carries its entries to the other replicas'
(``bench/vsim/sim.py``).

Example::

    pages = EnginePages(backends, cores)
    pages.first_look_at(0.0)       # FleetSync.first_look: one scrape and one discovery
    pages.scrape(2, now_s=1.0)     # backend 2's load as its /metrics says at 1.0 s
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from typing import Any, cast

import aiohttp

from backends.fleet.registry import Backend, BackendRegistry
from backends.fleet.scrape_share import ScrapeShare
from backends.fleet.sync import FleetSync
from backends.sim.core import SimEngineCore
from backends.sim.server import core_metrics_lines, sim_models_page


class EnginePages(FleetSync):
    """``FleetSync`` reading simulated engines' pages; see the module docstring."""

    def __init__(self, backends: Sequence[Backend], cores: Sequence[SimEngineCore], *,
                 scrapes: ScrapeShare | None = None) -> None:
        if len(backends) != len(cores):
            raise ValueError(f"{len(backends)} backends for {len(cores)} engines")
        # No Redis (no heartbeats, no KV events) and no HTTP session: _get is the only I/O.
        # ``scrapes``: this replica's share of the replicas' scrapes (``bench/vsim/sim.py``
        # sends its entries), on ``now_s`` as its clock.
        super().__init__(BackendRegistry(list(backends)), None,
                         cast(aiohttp.ClientSession, None), discover_workers=False,
                         scrapes=scrapes)
        self.now_s = 0.0  # the simulation's clock, as of the last scrape
        self.backends = list(backends)
        self._cores = {b.name: core for b, core in zip(backends, cores, strict=True)}
        self.num_scrapes = 0

    def first_look_at(self, now_s: float) -> None:
        """What the gateway does before serving (``FleetSync.first_look``), for every engine:
        one scrape, then one discovery of the profile pages."""
        for index in range(len(self.backends)):
            self.scrape(index, now_s)
        for backend in self.backends:
            _run_at_once(self.discover_profile(backend))

    @property
    def scrapes(self) -> ScrapeShare | None:
        """This replica's share of the replicas' scrapes (None: it scrapes alone)."""
        return self._scrapes

    def scrape(self, index: int, now_s: float) -> None:
        """One ``/metrics`` scrape of backend ``index`` (``FleetSync._scrape``) at ``now_s``."""
        backend = self.backends[index]
        self.now_s = now_s
        _run_at_once(self._scrape(backend))
        if backend.load_source == "metrics":
            backend.load_observed(now_s, is_new=False)  # FleetSync's stamp is the wall clock's
        self.num_scrapes += 1

    async def _get(self, backend: Backend, path: str, *, as_json: bool) -> Any:
        core = self._cores[backend.name]
        if path == "/metrics":
            return metrics_page(core)
        if path == "/v1/models":
            return sim_models_page(core)
        return None  # the sim answers 404 to other engines' pages


def metrics_page(core: SimEngineCore) -> str:
    """The core's lines of ``backends/sim/server.py``'s ``/metrics`` (those the gateway reads
    among them)."""
    return "\n".join(core_metrics_lines(core)) + "\n"


def _run_at_once(coro: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine that never suspends (its page fetches answer at once)."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a simulated page fetch suspended; it must answer at once")
