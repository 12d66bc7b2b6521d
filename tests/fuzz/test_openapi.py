"""The OpenAPI document (``gateway.openapi``): valid OpenAPI 3.1, served, and in step with the
routes the app registers, so it cannot drift from the code unnoticed."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from openapi_spec_validator import validate

from gateway.app import setup_routes
from gateway.front import REQUEST_ID_RE
from gateway.openapi import document
from tests.fuzz.conftest import Fleet

DOC = document()
PUBLIC = ("/healthz", "/readyz", "/metrics", "/openapi.json")


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, operation) for path, item in DOC["paths"].items()
            for method, operation in item.items() if method != "parameters"]


def test_the_document_is_valid_openapi_3_1() -> None:
    assert DOC["openapi"].startswith("3.1.")
    validate(DOC)
    orjson.dumps(DOC)  # plain JSON: no tuples, sets or Python-only values


def test_the_gateway_serves_it_without_credentials(fleet: Fleet) -> None:
    response = httpx.get(fleet.gateway.url + "/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("application/json")
    assert "x-request-id" in response.headers
    assert response.json() == DOC


def test_every_route_the_app_registers_is_documented_and_no_other() -> None:
    app = web.Application()
    setup_routes(app)
    registered = {(route.method, route.resource.canonical) for route in app.router.routes()
                  if route.resource is not None}
    documented = {(method, path) for method, path, _ in _operations()}
    assert registered - documented == set(), "routes missing from gateway/openapi.py"
    assert documented - registered == set(), "documented routes the app does not serve"


@pytest.mark.parametrize(("method", "path"),
                         [pytest.param(m, p, id=f"{m} {p}") for m, p, _ in _operations()])
def test_each_operation_states_its_credential_and_its_apis_errors(method: str, path: str
                                                                  ) -> None:
    operation = DOC["paths"][path][method.lower()]
    expected = ([] if path in PUBLIC else [{"adminToken": []}] if path.startswith("/admin")
                else [{"tenantKey": []}, {"tenantKeyHeader": []}])
    assert operation["security"] == expected
    error = "AnthropicError" if path.startswith("/v1/messages") else "Error"
    for status, response in operation["responses"].items():
        if status.startswith("2"):
            continue
        name = response["$ref"].rsplit("/", 1)[1]
        content = DOC["components"]["responses"][name]["content"]
        assert content == {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{error}"}}}


def test_the_error_schema_is_openais() -> None:
    error = DOC["components"]["schemas"]["Error"]["properties"]["error"]
    assert error["required"] == ["message", "type", "param", "code"]
    assert error["properties"]["message"] == {"type": "string", "minLength": 1}


def test_the_request_id_header_is_the_one_the_gateway_checks() -> None:
    parameter = DOC["components"]["parameters"]["RequestId"]
    assert parameter["schema"]["pattern"] == REQUEST_ID_RE.pattern
