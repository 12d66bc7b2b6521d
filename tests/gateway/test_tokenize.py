"""/tokenize and /detokenize through a real gateway: passed to an engine serving the model (a
simulated worker with the real tokenizer), the tenant's allowed models checked, and a clear
404 from an engine that does not offer them (the mock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backends.tokenizer import load_default_tokenizer
from gateway.cli.localproc import ProcessGroup, free_port_range, python_module_argv, wait_http
from tests.fleet import Engine, Gateway

SIM_MODEL = "switchyard-sim"


@pytest.fixture(scope="module")
def gateway(workdir: Path, redis_url: str) -> Iterator[Gateway]:
    with ProcessGroup() as group:
        port = free_port_range(1)
        group.spawn(f"sim-{port}", python_module_argv(
            "backends.sim", "--workers", "1", "--base-port", str(port), "--tokenizer", "real"))
        sim_url = f"http://127.0.0.1:{port}"
        wait_http(sim_url + "/health", group=group)
        mock = Engine(group, "tokenize-mock", models=("mock-only",))
        yield Gateway(group, workdir, redis_url, [
            {"name": "sim-0", "url": sim_url, "models": [SIM_MODEL]}, mock.backend_config()],
            routing={"discover_workers": False})


def _post(gateway: Gateway, path: str, key: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(gateway.url + path, json=body, timeout=10,
                      headers={"Authorization": f"Bearer {key}"})


def test_tokenize_and_detokenize_reach_the_engine(gateway: Gateway) -> None:
    key = gateway.new_key()
    tokens = _post(gateway, "/tokenize", key, {"model": SIM_MODEL, "prompt": "Hello trains"})
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["tokens"] == load_default_tokenizer().encode("Hello trains")
    assert tokens.headers["x-switchyard-model"] == SIM_MODEL
    text = _post(gateway, "/detokenize", key, {"model": SIM_MODEL,
                                               "tokens": tokens.json()["tokens"]})
    assert text.json() == {"prompt": "Hello trains"}
    engine_error = _post(gateway, "/detokenize", key, {"model": SIM_MODEL, "tokens": [-1]})
    assert engine_error.status_code == 400
    assert engine_error.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    pytest.param("/tokenize", {"prompt": "x"}, 400, "invalid_request", id="no-model"),
    pytest.param("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model_not_found",
                 id="unknown-model"),
    pytest.param("/tokenize", {"model": "mock-only", "prompt": "x"}, 404,
                 "unsupported_endpoint", id="engine-without-it"),
])
def test_refusals(gateway: Gateway, path: str, body: dict[str, object], status: int,
                  code: str) -> None:
    response = _post(gateway, path, gateway.new_key(), body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_a_tenant_may_tokenize_only_its_models(gateway: Gateway) -> None:
    key = gateway.new_key(models=["mock-only"])
    response = _post(gateway, "/tokenize", key, {"model": SIM_MODEL, "prompt": "x"})
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "model_not_allowed"
    assert _post(gateway, "/tokenize", "sy-wrong", {"model": SIM_MODEL}).status_code == 401
