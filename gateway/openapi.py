"""The OpenAPI 3.1 document of the gateway's HTTP API, served at ``GET /openapi.json``.

It describes what the gateway itself checks and answers: the request bodies it accepts (built
from ``gateway.validation`` and ``gateway.admin``, see ``gateway.openapi_schemas``), the two
bearer credentials (a tenant's API key, the admin token) and the OpenAI-format error every
failure carries. A test checks that every route under /v1 and /admin is documented.

Example::

    doc = document()
    doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]
"""

from __future__ import annotations

import functools
from typing import Any

import orjson
from aiohttp import web

from admission.tiers import TIER_HEADER
from gateway.admin import USAGE_GROUPS
from gateway.openapi_base import Schema, ref
from gateway.openapi_schemas import component_schemas

# A tenant's key as a bearer token, or in Anthropic's x-api-key header.
TENANT: list[dict[str, list[str]]] = [{"tenantKey": []}, {"tenantKeyHeader": []}]
ADMIN: list[dict[str, list[str]]] = [{"adminToken": []}]

_ERRORS: dict[str, str] = {
    "400": "A malformed body or header, a field of the wrong type or out of range ('param' "
           "names it), or a request no backend could ever hold (context_length_exceeded).",
    "401": "A missing, malformed, unknown, revoked or expired credential.",
    "403": "The tenant may not do this: a model outside its allowlist, a disabled tenant, a "
           "tenant key on /admin, a tier above its own.",
    "404": "An unknown model, tenant or key.",
    "409": "The tenant id is taken, the imported key is already stored, or the gateway has no "
           "configuration file to reload.",
    "413": "The body is larger than max_body_bytes.",
    "415": "A Content-Type other than JSON.",
    "417": "An 'Expect' header other than '100-continue'.",
    "429": "A tenant quota (requests or tokens per minute, concurrency) is spent; "
           "Retry-After says when to come back.",
    "502": "The backend failed, or answered without an OpenAI-format body.",
    "503": "The request could be served, but not now: no healthy backend serves the model, SLO "
           "admission refused it (code 'overloaded'), or the state store is unreachable.",
    "504": "The backend timed out.",
    "default": "Any other error, in the same format (an engine's own OpenAI-format error is "
               "passed through with its status).",
}
_RETRY_AFTER = ("429", "503")
_COMPLETION_ERRORS = ("400", "401", "403", "404", "413", "415", "417", "429", "502", "503",
                      "504", "default")
_ADMIN_ERRORS = ("400", "401", "403", "503", "default")


def _error_response(status: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _ERRORS[status],
        "content": {"application/json": {"schema": ref("Error")}},
    }
    if status in _RETRY_AFTER:
        response["headers"] = {"Retry-After": {
            "description": "Seconds to wait before retrying.",
            "schema": {"type": "integer", "minimum": 0},
        }}
    return response


def _errors(*statuses: str) -> dict[str, Any]:
    return {status: {"$ref": f"#/components/responses/{_response_name(status)}"}
            for status in statuses}


def _response_name(status: str) -> str:
    return "Error" if status == "default" else f"Error{status}"


def _json_ok(schema: Schema, description: str = "OK", status: str = "200") -> dict[str, Any]:
    return {status: {"description": description,
                     "content": {"application/json": {"schema": schema}}}}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": ref(name)}}}


def _completion_op(summary: str, body: str, answer: str = "Completion",
                   description: str = "The engine's answer; with 'stream: true', SSE events "
                                      "ending in 'data: [DONE]' (a stream that breaks ends "
                                      "with a 'data: {\"error\": ...}' event).",
                   *, streams: bool | None = None, is_anthropic: bool = False,
                   ) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": ref(answer)}}
    if answer == "Completion" if streams is None else streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    errors = (_anthropic_errors(*_COMPLETION_ERRORS) if is_anthropic
              else _errors(*_COMPLETION_ERRORS))
    return {
        "summary": summary,
        "security": TENANT,
        "parameters": [{"$ref": "#/components/parameters/RequestId"},
                       {"$ref": "#/components/parameters/Tier"}],
        "requestBody": _body(body),
        "responses": {
            "200": {"description": description,
                    "headers": {"x-switchyard-model": {
                        "description": "The model that served the request: the one asked for, "
                                       "or the target or fallback of the alias asked for.",
                        "schema": {"type": "string"}}},
                    "content": content},
            **errors,
        },
    }


def _anthropic_errors(*statuses: str) -> dict[str, Any]:
    """The errors of the /v1/messages paths: the same statuses, in Anthropic's shape."""
    return {status: {"$ref": f"#/components/responses/Anthropic{_response_name(status)}"}
            for status in statuses}


def _anthropic_error_response(status: str) -> dict[str, Any]:
    response = _error_response(status)
    response["content"] = {"application/json": {"schema": ref("AnthropicError")}}
    return response


def _admin_op(summary: str, responses: dict[str, Any], *, body: str | None = None,
              errors: tuple[str, ...] = ()) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "security": ADMIN, "tags": ["admin"],
                                 "responses": {**responses, **_errors(*errors, *_ADMIN_ERRORS)}}
    if body is not None:
        operation["requestBody"] = _body(body)
    return operation


def _path_param(name: str, description: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "description": description,
             "schema": {"type": "string"}}]


def _public_get(summary: str, responses: dict[str, Any]) -> dict[str, Any]:
    return {"get": {"summary": summary, "security": [], "responses": responses}}


def _paths() -> dict[str, Any]:
    tenant_id = _path_param("tenant_id", "The tenant's id.")
    key_id = _path_param("key_id", "The key's id (16 hex characters).")
    return {
        "/v1/chat/completions": {"post": _completion_op("Create a chat completion.",
                                                        "ChatCompletionRequest")},
        "/v1/completions": {"post": _completion_op("Create a text completion.",
                                                   "CompletionRequest")},
        "/v1/messages": {"post": _completion_op(
            "Anthropic's Messages API, passed to an engine that serves it.", "MessagesRequest",
            "Message", "The engine's message; with 'stream: true', Anthropic's SSE events "
            "ending in 'message_stop' (a stream that breaks ends with an 'error' event). "
            "Errors are Anthropic's shape; 'x-api-key' is taken as well as a bearer key.",
            streams=True, is_anthropic=True)},
        "/v1/messages/count_tokens": {"post": _completion_op(
            "Anthropic's token count, passed to an engine serving the model.",
            "MessagesCountTokensRequest", "InputTokens", "The engine's count of the prompt; "
            "404 'unsupported_endpoint' from an engine without it.", is_anthropic=True)},
        "/v1/responses": {"post": _completion_op(
            "OpenAI's Responses API, passed to an engine that serves it.", "ResponsesRequest",
            "Response", "The engine's response; with 'stream: true', SSE events ending in "
            "'response.completed' or 'response.incomplete' (a stream that breaks ends with an "
            "'error' event).", streams=True)},
        "/v1/embeddings": {"post": _completion_op(
            "Create embeddings.", "EmbeddingsRequest", "EmbeddingList",
            "The engine's vectors, one per input, in order (base64 when asked).")},
        "/tokenize": {"post": _completion_op(
            "vLLM's /tokenize, passed to an engine serving the model.", "TokenizeRequest",
            "TokenizeAnswer", "The engine's tokens; 404 'unsupported_endpoint' from an engine "
            "without it.")},
        "/detokenize": {"post": _completion_op(
            "vLLM's /detokenize, passed to an engine serving the model.", "DetokenizeRequest",
            "DetokenizeAnswer", "The engine's text.")},
        "/v1/models": {"get": {"summary": "The models this tenant may use.", "security": TENANT,
                               "responses": {**_json_ok(ref("ModelList")),
                                             **_errors("401", "403", "503", "default")}}},
        "/v1/models/{model}": {"get": {
            "summary": "One model, when this tenant may use it.", "security": TENANT,
            "parameters": _path_param("model", "The model name."),
            "responses": {**_json_ok(ref("Model")),
                          **_errors("401", "403", "404", "503", "default")}}},
        "/healthz": _public_get("Liveness: 200 while the process runs.",
                                _json_ok(ref("Status"))),
        "/readyz": _public_get("Readiness: Redis answers, a backend is healthy, not draining.",
                               {**_json_ok(ref("Status")), **_errors("503")}),
        "/metrics": _public_get("Prometheus metrics.", {"200": {
            "description": "Prometheus text exposition.",
            "content": {"text/plain": {"schema": {"type": "string"}}}}}),
        "/openapi.json": _public_get("This document.", _json_ok({"type": "object"})),
        "/admin/waits": {"get": _admin_op(
            "The waits report: where requests spent their time.", _json_ok({"type": "object"}))
            | {"parameters": [{"name": "window_s", "in": "query", "required": False,
                               "schema": {"type": "number", "exclusiveMinimum": 0}}]}},
        "/admin/tenants": {
            "post": _admin_op("Create a tenant.", _json_ok(ref("Tenant"), "Created", "201"),
                              body="TenantCreate", errors=("409",)),
            "get": _admin_op("List tenants.", _json_ok(ref("TenantList"))),
        },
        "/admin/tenants/{tenant_id}": {
            "parameters": tenant_id,
            "get": _admin_op("Get a tenant.", _json_ok(ref("Tenant")), errors=("404",)),
            "patch": _admin_op("Update a tenant: only the fields sent change.",
                               _json_ok(ref("Tenant")), body="TenantUpdate", errors=("404",)),
            "delete": _admin_op("Disable a tenant (its keys stop working).",
                                _json_ok(ref("Tenant")), errors=("404",)),
        },
        "/admin/keys": {
            "post": _admin_op("Create a key; the plaintext is in this response only.",
                              _json_ok(ref("NewApiKey"), "Created", "201"), body="KeyCreate",
                              errors=("404",)),
            "get": _admin_op("List keys, of one tenant or of all.", _json_ok(ref("ApiKeyList")))
            | {"parameters": [{"name": "tenant_id", "in": "query", "required": False,
                               "schema": {"type": "string"}}]},
        },
        "/admin/keys/import": {"post": _admin_op(
            "Store an operator-supplied key (never echoed back).",
            _json_ok(ref("ApiKey"), "Created", "201"), body="KeyImport", errors=("404", "409"))},
        "/admin/keys/{key_id}": {
            "parameters": key_id,
            "get": _admin_op("Get a key.", _json_ok(ref("ApiKey")), errors=("404",)),
            "delete": _admin_op("Revoke a key.", _json_ok(ref("ApiKey")), errors=("404",)),
        },
        "/admin/reload": {"post": _admin_op(
            "Read the configuration file again and apply what can change live; 400 (nothing "
            "changed) for an invalid file, with each problem's file:line.",
            _json_ok(ref("Reload")), errors=("409",))},
        "/admin/fleet": {"get": _admin_op("Every backend as routing sees it now.",
                                          _json_ok(ref("Fleet")))},
        "/admin/usage": {"get": _admin_op(
            "Requests, tokens and cost per tenant, key or model over [from, to), in hourly "
            "buckets (default: the last 24 hours).", _json_ok(ref("Usage")), errors=("404",))
            | {"parameters": _usage_parameters()}},
    }


def _usage_parameters() -> list[dict[str, Any]]:
    instant = {"description": "Unix seconds, or an ISO 8601 date or time (UTC unless it says).",
               "schema": {"type": "string"}}
    names = {"tenant": "Only this tenant.", "model": "Only this model.",
             "key_id": "Only this key (with group_by=key)."}
    return [
        {"name": "from", "in": "query", "required": False, **instant},
        {"name": "to", "in": "query", "required": False, **instant},
        {"name": "group_by", "in": "query", "required": False,
         "schema": {"type": "string", "enum": list(USAGE_GROUPS), "default": "key"}},
        *({"name": name, "in": "query", "required": False, "description": description,
           "schema": {"type": "string"}} for name, description in names.items()),
    ]


@functools.cache
def document_bytes() -> bytes:
    return orjson.dumps(document())


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "switchyard gateway",
            "version": "1",
            "description": "An OpenAI-compatible gateway: /v1 for tenants, /admin for the "
                           "operator. Request bodies are forwarded to the engine byte for byte; "
                           "fields not listed here pass through unchecked.",
        },
        "paths": _paths(),
        "components": {
            "schemas": component_schemas(),
            "responses": {
                **{_response_name(s): _error_response(s) for s in _ERRORS},
                **{f"Anthropic{_response_name(s)}": _anthropic_error_response(s)
                   for s in _COMPLETION_ERRORS}},
            "parameters": {
                "RequestId": {"name": "x-request-id", "in": "header", "required": False,
                              "description": "Echoed on the response and sent upstream; "
                                             "generated when absent.",
                              "schema": {"type": "string",
                                         "pattern": "^[A-Za-z0-9._:@/+=-]{1,128}$"}},
                "Tier": {"name": TIER_HEADER, "in": "header", "required": False,
                         "description": "Run in this tier, at most the tenant's own. "
                                        "Without it, x-llm-d-inference-objective, "
                                        "x-llm-d-slo-ttft-ms, x-smg-priority or the body's "
                                        "service_tier may lower the tier (docs/admission.md).",
                         "schema": {"type": "string"}},
            },
            "securitySchemes": {
                "tenantKey": {"type": "http", "scheme": "bearer",
                              "description": "A tenant's API key, 'sy-<16 hex>-<43 "
                                             "characters>' or one the operator imported."},
                "tenantKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key",
                                    "description": "The same key in Anthropic's header."},
                "adminToken": {"type": "http", "scheme": "bearer",
                               "description": "The gateway's admin_token."},
            },
        },
    }


async def serve_document(request: web.Request) -> web.Response:
    return web.Response(body=document_bytes(), content_type="application/json")
