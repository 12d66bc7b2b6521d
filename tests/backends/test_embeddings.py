"""The embeddings API's checks and answer shape, shared by every engine and the gateway."""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import orjson
import pytest

from backends.embeddings import (
    MAX_INPUTS,
    EmbeddingsError,
    EmbeddingsRequest,
    dimensions_error,
    embeddings_body,
    fitted,
    hashed_embedding,
    parse_embeddings,
)


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("hello", ("hello",), id="string"),
    pytest.param(["a", "b"], ("a", "b"), id="strings"),
    pytest.param([1, 2, 3], ((1, 2, 3),), id="token-ids"),
    pytest.param([[1, 2], [3]], ((1, 2), (3,)), id="token-id-arrays"),
])
def test_every_input_shape_is_read(value: Any, expected: tuple[Any, ...]) -> None:
    assert parse_embeddings({"model": "m", "input": value}).inputs == expected


@pytest.mark.parametrize(("body", "param", "needle"), [
    pytest.param({"input": "x"}, "model", "'model'", id="no-model"),
    pytest.param({"model": "m"}, "input", "Missing required parameter: 'input'", id="no-input"),
    pytest.param({"model": "m", "input": []}, "input", "not empty", id="empty-list"),
    pytest.param({"model": "m", "input": ""}, "input", "empty string", id="empty-string"),
    pytest.param({"model": "m", "input": ["a", 3]}, "input[1]", "one kind", id="mixed"),
    pytest.param({"model": "m", "input": ["a", [1]]}, "input", "mixes", id="text-and-ids"),
    pytest.param({"model": "m", "input": [[1], []]}, "input[1]", "non-empty", id="empty-ids"),
    pytest.param({"model": "m", "input": [-1]}, "input", "Invalid token id", id="negative-id"),
    pytest.param({"model": "m", "input": [True]}, "input[0]", "token ids", id="boolean-id"),
    pytest.param({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input", "at most",
                 id="too-many"),
    pytest.param({"model": "m", "input": "a", "encoding_format": "hex"}, "encoding_format",
                 "'base64'", id="bad-format"),
    pytest.param({"model": "m", "input": "a", "dimensions": 0}, "dimensions", "positive",
                 id="zero-dimensions"),
    pytest.param({"model": "m", "input": "a", "user": 5}, "user", "string", id="bad-user"),
])
def test_bad_bodies_name_what_to_change(body: dict[str, Any], param: str, needle: str) -> None:
    with pytest.raises(EmbeddingsError) as info:
        parse_embeddings(body)
    assert info.value.param == param
    assert needle in info.value.message
    assert info.value.status == 400


def test_an_engine_refuses_a_model_it_does_not_serve() -> None:
    with pytest.raises(EmbeddingsError) as info:
        parse_embeddings({"model": "other", "input": "a"}, models=("m",))
    assert (info.value.status, info.value.code) == (404, "model_not_found")


def test_hashed_embeddings_are_unit_vectors_fixed_by_the_text() -> None:
    first = hashed_embedding("the same text", 64)
    assert first == hashed_embedding("the same text", 64)
    assert first != hashed_embedding("another text", 64)
    assert len(first) == 64
    assert math.isclose(math.fsum(v * v for v in first), 1.0, rel_tol=1e-9)


def test_dimensions_shorten_and_renormalise() -> None:
    vector = hashed_embedding("x", 16)
    short = fitted(vector, 4)
    assert len(short) == 4
    assert math.isclose(math.fsum(v * v for v in short), 1.0, rel_tol=1e-9)
    assert all(math.copysign(1, a) == math.copysign(1, b) for a, b in zip(short, vector[:4],
                                                                            strict=True))
    assert fitted(vector, None) is vector
    request = parse_embeddings({"model": "m", "input": "a", "dimensions": 17})
    error = dimensions_error(request, 16)
    assert error is not None and error.param == "dimensions" and "at most" in error.message
    assert dimensions_error(request, 17) is None


def test_the_answer_in_floats_and_in_base64() -> None:
    vectors = [hashed_embedding("a", 8), hashed_embedding("b", 8)]
    as_floats = orjson.loads(embeddings_body(EmbeddingsRequest("m", ("a", "b")), vectors, 2))
    assert as_floats["object"] == "list" and as_floats["model"] == "m"
    assert as_floats["usage"] == {"prompt_tokens": 2, "total_tokens": 2}
    assert [d["index"] for d in as_floats["data"]] == [0, 1]
    assert as_floats["data"][1]["embedding"] == vectors[1]
    packed = orjson.loads(embeddings_body(EmbeddingsRequest("m", ("a",), "base64"),
                                          vectors[:1], 1))["data"][0]["embedding"]
    unpacked = struct.unpack("<8f", base64.b64decode(packed))
    assert unpacked == pytest.approx(vectors[0], rel=1e-6)
