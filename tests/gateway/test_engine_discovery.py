"""Engines given by URL: names derived from the URL, models from a real engine's /v1/models."""

from __future__ import annotations

import pytest

from gateway.cli.localproc import ProcessGroup
from gateway.engine_discovery import (
    DiscoveryError,
    backend_name,
    check_urls,
    discover_engines,
)
from tests.fleet import Engine


@pytest.mark.parametrize(
    ("url", "taken", "name"),
    [
        pytest.param("http://10.0.0.7:8000", set(), "10.0.0.7:8000", id="host-port"),
        pytest.param("https://engine.example", set(), "engine.example", id="no-port"),
        pytest.param("http://h:8000/llama/", set(), "h:8000/llama", id="path-kept"),
        pytest.param("http://user:pw@h:8000", set(), "h:8000", id="credentials-dropped"),
        pytest.param("http://[::1]:8000", set(), "1:8000", id="ipv6"),
        pytest.param("http://h:8000/a b", set(), "h:8000/a-b", id="odd-characters"),
        pytest.param("http://h:1", {"h:1"}, "h:1-2", id="taken"),
        pytest.param("http://h:1", {"h:1", "h:1-2"}, "h:1-3", id="taken-twice"),
    ],
)
def test_backend_name(url: str, taken: set[str], name: str) -> None:
    assert backend_name(url, taken) == name
    assert name in taken


@pytest.mark.parametrize(
    ("urls", "message"),
    [
        pytest.param(["ftp://h"], "must be an http", id="not-http"),
        pytest.param(["http://h:1", "http://h:1/"], "given twice", id="repeated"),
    ],
)
def test_bad_urls_are_refused(urls: list[str], message: str) -> None:
    with pytest.raises(DiscoveryError, match=message):
        check_urls(urls)


def test_models_come_from_the_engine(procs: ProcessGroup) -> None:
    engine = Engine(procs, "discovery-engine", models=("m-one", "m-two"))
    lines: list[str] = []
    found = discover_engines([engine.url + "/"], wait_s=5, say=lines.append)
    assert [(e.url, e.name, e.models) for e in found] == [
        (engine.url, f"127.0.0.1:{engine.port}", ("m-one", "m-two"))]
    assert lines == []  # nothing to wait for
