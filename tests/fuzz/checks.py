"""What every reply to a fuzzed request must be, as a list of problems (empty: fine).

- No 5xx the gateway caused. The one 5xx allowed is the documented overload answer: a 503
  with code ``overloaded`` and a ``Retry-After``, which SLO admission gives when the fleet
  cannot meet the tier's TTFT target (the run keeps its load low, so it should not appear).
- Every non-2xx reply is OpenAI-shaped JSON: ``error.message`` a non-empty string,
  ``error.type`` a string, ``param`` and ``code`` present (a string or null); under
  /v1/messages, Anthropic-shaped: ``{"type": "error", "error": {type, message}}``.
- Every request gets a reply (but one the client cut short: aiohttp closes on the
  half-close), and every reply carries an ``x-request-id``.
- A 2xx JSON reply matches the schema the document gives for it; a stream ends with its
  API's last event (``data: [DONE]``, ``message_stop``, ``response.completed`` or
  ``response.incomplete``) and holds no error event; a 2xx to a completion means the
  document describes its body (the gateway accepted nothing the document refuses).

Example::

    checker = Checker(document())
    assert not checker.problems(case, reply)
"""

from __future__ import annotations

import gzip
import zlib
from typing import Any
from urllib.parse import unquote

import jsonschema
import orjson
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from tests.fuzz.http_cases import Case
from tests.fuzz.wire import CUT_SHORT, Reply

ALLOWED_5XX_CODES = frozenset({"overloaded"})


ANTHROPIC_PREFIX = "/v1/messages"
# The last event of a complete stream, and the start of an error event, per API.
STREAM_ENDS = {"/v1/messages": (b'data: {"type":"message_stop"}',),
               "/v1/responses": (b"event: response.completed", b"event: response.incomplete")}
ERROR_EVENTS = {"/v1/messages": b"event: error", "/v1/responses": b"event: error"}


def is_anthropic(target: str) -> bool:
    """Whether the gateway answers ``target`` (path and query) in Anthropic's shape."""
    return unquote(target.partition("?")[0]).startswith(ANTHROPIC_PREFIX)


def error_problems(reply: Reply, *, anthropic: bool = False) -> list[str]:
    """Why ``reply`` (not a 2xx) is not an OpenAI-format error (``anthropic``: not an
    Anthropic-format one)."""
    if not reply.headers.get("content-type", "").startswith("application/json"):
        return [f"content-type {reply.headers.get('content-type')!r}, not application/json"]
    try:
        data = orjson.loads(reply.body)
    except orjson.JSONDecodeError:
        return ["the body is not JSON"]
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ["no 'error' object"]
    found = []
    if not isinstance(error.get("message"), str) or not error["message"].strip():
        found.append("error.message is not a non-empty string")
    if not isinstance(error.get("type"), str):
        found.append("error.type is not a string")
    if anthropic:
        return found + ([] if data.get("type") == "error" else ["'type' is not 'error'"])
    for name in ("param", "code"):
        if name not in error or not isinstance(error[name], str | None):
            found.append(f"error.{name} is missing or not a string or null")
    return found


def error_code(reply: Reply) -> str | None:
    try:
        code = orjson.loads(reply.body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    return code if isinstance(code, str) else None


def decoded_body(case: Case) -> Any:
    """The JSON value of the request body as the gateway read it, or None."""
    encoding = dict((k.lower(), v) for k, v in case.headers).get("content-encoding")
    body = case.body
    try:
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        return orjson.loads(body)
    except (OSError, EOFError, zlib.error, orjson.JSONDecodeError):
        return None


class Checker:
    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._registry: Registry[Any] = Registry().with_resource(
            "urn:doc", Resource.from_contents(document, default_specification=DRAFT202012))
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def _validator(self, pointer: str) -> jsonschema.Draft202012Validator:
        found = self._validators.get(pointer)
        if found is None:
            found = jsonschema.Draft202012Validator({"$ref": f"urn:doc#{pointer}"},
                                                    registry=self._registry)
            self._validators[pointer] = found
        return found

    def problems(self, case: Case, reply: Reply | None) -> list[str]:
        if reply is None:
            if case.operation == CUT_SHORT:
                return []
            return ["the gateway closed the connection without an answer"]
        found = [] if "x-request-id" in reply.headers else ["no x-request-id header"]
        if reply.status >= 500 and not (
                reply.status == 503 and error_code(reply) in ALLOWED_5XX_CODES
                and "retry-after" in reply.headers):
            found.append(f"gateway answered {reply.status}")
        if not 200 <= reply.status < 300:
            return found + error_problems(reply, anthropic=is_anthropic(case.target))
        if case.raw is not None:
            return found  # well-formed after all (obs-text in a header, valid chunking)
        if not case.is_documented:
            return [*found, f"{reply.status} to an undocumented method or path"]
        return found + self._success_problems(case, reply)

    def _success_problems(self, case: Case, reply: Reply) -> list[str]:
        method, template = case.operation.split(" ", 1)
        escaped = template.replace("~", "~0").replace("/", "~1")
        operation = f"/paths/{escaped}/{method.lower()}"
        found = []
        if template.startswith("/v1/") and method == "POST":
            body = decoded_body(case)
            schema = self.document["paths"][template]["post"]["requestBody"]["content"][
                "application/json"]["schema"]
            errors = list(self._validator(schema["$ref"].removeprefix("#")).iter_errors(body))
            if errors:
                found.append(f"accepted a body the document refuses: {errors[0].message}")
        if reply.headers.get("content-type", "").startswith("text/event-stream"):
            ends = STREAM_ENDS.get(template, (b"data: [DONE]",))
            last_event = reply.body.rstrip().rpartition(b"\n\n")[2]
            if not any(last_event.startswith(end) or last_event.endswith(end) for end in ends):
                found.append(f"the stream does not end with {ends[0].decode()!r}")
            if ERROR_EVENTS.get(template, b'data: {"error"') in reply.body:
                found.append("the stream holds an error event")
            return found
        documented = self.document["paths"][template][method.lower()]["responses"]
        if str(reply.status) not in documented:
            return [*found, f"{reply.status} is not a documented answer"]
        if "application/json" not in documented[str(reply.status)].get("content", {}):
            return found  # /metrics: Prometheus text
        try:
            data = orjson.loads(reply.body)
        except orjson.JSONDecodeError:
            return [*found, "a 2xx body that is not JSON"]
        pointer = f"{operation}/responses/{reply.status}/content/application~1json/schema"
        errors = list(self._validator(pointer).iter_errors(data))
        if errors:
            found.append(f"the {reply.status} body does not match the document: "
                         f"{errors[0].message[:200]}")
        return found
