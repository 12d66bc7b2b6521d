"""Shared fixtures: a private redis-server, mock engines and a gateway, all real processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli.localproc import ProcessGroup, start_redis
from tests.fleet import Engine, Gateway, process_group


@pytest.fixture(scope="session")
def procs() -> Iterator[ProcessGroup]:
    with process_group() as group:
        yield group


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="session")
def redis_url(procs: ProcessGroup, workdir: Path) -> str:
    return start_redis(procs, workdir)


@pytest.fixture(scope="module")
def private_redis_url(procs: ProcessGroup, workdir: Path) -> str:
    """A redis-server only the module that asks for it uses: its counters see nobody else's
    commands, and what it does to its server (a password, a killed client) touches nobody."""
    return start_redis(procs, workdir)


@pytest.fixture(scope="session")
def engines(procs: ProcessGroup) -> list[Engine]:
    return [
        Engine(procs, "engine-a", models=("switchyard-mock", "model-a")),
        Engine(procs, "engine-b", models=("switchyard-mock", "model-b")),
    ]


@pytest.fixture(scope="session")
def gateway(procs: ProcessGroup, workdir: Path, redis_url: str, engines: list[Engine]) -> Gateway:
    """The shared gateway: two engines, both serving switchyard-mock; model-a/-b on one each."""
    return Gateway(procs, workdir, redis_url, [e.backend_config() for e in engines])


@pytest.fixture(scope="session")
def api_key(gateway: Gateway) -> str:
    return gateway.new_key()
