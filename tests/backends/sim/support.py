"""A simulated worker fleet served by its own process on loopback, for the sim's HTTP tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localproc import ProcessGroup, free_port_range, python_module_argv, wait_http

MODEL = "switchyard-sim"


class SimFleet:
    """``switchyard sim`` with ``num_workers`` on consecutive free ports (the real tokenizer);
    ``flags`` are its command-line options.

    Example::

        fleet = SimFleet(procs, tmp_path, num_workers=2, num_kv_blocks=40)
        httpx.get(fleet.urls[1] + "/v1/models")
    """

    def __init__(self, group: ProcessGroup, tmp: Path, num_workers: int = 1,
                 latency: dict[str, float] | None = None, **flags: Any) -> None:
        self.base_port = free_port_range(num_workers)
        argv = python_module_argv("backends.sim", "--workers", str(num_workers),
                                  "--base-port", str(self.base_port), "--tokenizer", "real")
        if latency is not None:
            path = tmp / f"latency-{self.base_port}.json"
            path.write_text(json.dumps(latency))
            argv += ["--latency-json", str(path)]
        for name, value in flags.items():
            argv += ["--" + name.replace("_", "-"), str(value)]
        self.process = group.spawn(f"sim-{self.base_port}", argv)
        self.urls = [f"http://127.0.0.1:{self.base_port + i}" for i in range(num_workers)]
        for url in self.urls:
            wait_http(url + "/health", group=group)

    def metrics(self, index: int = 0) -> dict[str, float]:
        text = httpx.get(self.urls[index] + "/metrics").text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name.split("{")[0]] = float(value)
        return values
