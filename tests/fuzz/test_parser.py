"""Property tests of the completion-body parser (``gateway.validation``).

Whatever bytes arrive, the parser returns a request or raises its 400 ``APIError`` with a
message; it never raises anything else. A body the OpenAPI document describes is accepted,
and a body the parser accepts is one the document describes: the two cannot disagree.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from gateway.errors import APIError
from gateway.openapi import document
from gateway.validation import CompletionRequest, parse_completion_body
from tests.fuzz.mutations import encoded, near_valid, request_bytes
from tests.fuzz.schema_strategies import SchemaGen, json_values

DOC = document()
GEN = SchemaGen(DOC)
SCHEMAS = {"chat": "ChatCompletionRequest", "completions": "CompletionRequest"}
REGISTRY: Registry[Any] = Registry().with_resource(
    "urn:switchyard", Resource.from_contents(DOC, default_specification=DRAFT202012))
FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=list(HealthCheck))
ROUTES = st.sampled_from(sorted(SCHEMAS))


def validator(route: str) -> jsonschema.Draft202012Validator:
    ref = {"$ref": f"urn:switchyard#/components/schemas/{SCHEMAS[route]}"}
    return jsonschema.Draft202012Validator(ref, registry=REGISTRY)


VALIDATORS = {route: validator(route) for route in SCHEMAS}


def parse(raw: bytes, route: str) -> CompletionRequest | APIError:
    """The parser's answer: its request, or its client error (any other exception fails)."""
    try:
        return parse_completion_body(raw, route=route)
    except APIError as exc:
        assert exc.status == 400, exc.status
        assert exc.type == "invalid_request_error"
        assert isinstance(exc.message, str) and exc.message.strip()
        assert exc.param is None or isinstance(exc.param, str)
        assert isinstance(exc.code, str) and exc.code
        return exc


def any_input() -> st.SearchStrategy[tuple[str, bytes]]:
    return ROUTES.flatmap(lambda route: st.tuples(
        st.just(route), request_bytes(GEN, GEN.component(SCHEMAS[route]))))


@settings(FUZZ, max_examples=500)
@given(case=any_input())
def test_any_input_is_parsed_or_refused_with_a_client_error(case: tuple[str, bytes]) -> None:
    route, raw = case
    parsed = parse(raw, route)
    if isinstance(parsed, CompletionRequest):
        assert isinstance(parsed.model, str) and parsed.model
        assert isinstance(parsed.is_stream, bool)
        assert parsed.body == orjson.loads(raw)


@settings(FUZZ, max_examples=150)
@given(data=st.data(), route=ROUTES)
def test_a_body_the_document_describes_is_accepted(data: st.DataObject, route: str) -> None:
    body = data.draw(GEN.valid(GEN.component(SCHEMAS[route])))
    VALIDATORS[route].validate(body)  # the generator's own check
    parsed = parse(orjson.dumps(body), route)
    assert isinstance(parsed, CompletionRequest), parsed
    assert parsed.model == body["model"]
    assert parsed.is_stream is bool(body.get("stream"))


@settings(FUZZ, max_examples=500)
@given(data=st.data(), route=ROUTES)
def test_a_body_the_parser_accepts_is_one_the_document_describes(
    data: st.DataObject, route: str
) -> None:
    schema = GEN.component(SCHEMAS[route])
    raw = data.draw(encoded(near_valid(GEN, schema) | json_values()))
    parsed = parse(raw, route)
    if isinstance(parsed, CompletionRequest):
        errors = [e.message for e in VALIDATORS[route].iter_errors(parsed.body)]
        assert not errors, f"accepted, but the document refuses it: {errors}"


@pytest.mark.parametrize("raw", [
    pytest.param(b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": '
                 + str(2**64).encode() + b"}", id="max-tokens-2-to-the-64"),
    pytest.param(b'{"model": "m", "messages": [{"role": "user"}], "seed": -'
                 + str(2**63 + 1).encode() + b"}", id="seed-below-int64"),
    pytest.param(b'{"model": "m", "messages": [{"role": "user"}], "temperature": NaN}',
                 id="nan-literal"),
    pytest.param(b'{"model": "m", "messages": [{"role": "user"}], "top_p": 1e400}',
                 id="float-overflow"),
    pytest.param(b'{"model": "\\ud800", "messages": [{"role": "user"}]}',
                 id="lone-surrogate-escape"),
    pytest.param(b'{"model": "\xed\xa0\x80", "messages": [{"role": "user"}]}',
                 id="lone-surrogate-raw"),
    pytest.param(b'{"model": "m", "messages": ' + b"[" * 2000 + b"]" * 2000 + b"}",
                 id="nested-2000-deep"),
    pytest.param(b"\xef\xbb\xbf{}", id="byte-order-mark"),
])
def test_edge_inputs_are_client_errors(raw: bytes) -> None:
    for route in SCHEMAS:
        assert isinstance(parse(raw, route), APIError)
