"""OpenAI's embeddings API, as every engine here serves it and the gateway checks it.

``parse_embeddings`` checks a ``POST /v1/embeddings`` body (``input``: a string, an array of
strings, an array of token ids or an array of token-id arrays; ``encoding_format``: ``float``
or ``base64``; ``dimensions``), ``embeddings_body`` writes the answer. Engines compute the
vectors their own way: the PyTorch worker pools its model's hidden states, the simulator and
the mock derive a fixed vector from each input's text (``hashed_embedding``), the same text
always the same unit vector, so clients and tests see real shapes and stable values.

Example::

    request = parse_embeddings(body, models=("m",))          # or EmbeddingsError(message, param)
    vectors = [hashed_embedding(text, 64) for text in request.texts]
    body = embeddings_body(request, vectors, num_prompt_tokens=12)
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from backends.engine_core.request import EngineRequestError

MAX_INPUTS = 2048  # OpenAI's limit on the items of one request
HASHED_DIMS = 64  # the length of the simulator's and the mock's vectors
MAX_TOKEN_ID = 2**32 - 1
ENCODING_FORMATS = ("float", "base64")


class EmbeddingsError(EngineRequestError):
    """A body the embeddings API refuses: HTTP 400 with ``param`` named (404 ``model_not_found``
    when ``code`` says so)."""

    def __init__(self, message: str, param: str | None, code: str | None = None,
                 status: int = 400) -> None:
        super().__init__(status, message, param, code)


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """A checked embeddings request: each input as text or as token ids."""

    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    encoding_format: str = "float"
    dimensions: int | None = None

    @property
    def texts(self) -> list[str]:
        """Each input as text: token ids written out, space-separated (what a hashed vector
        is derived from)."""
        return [" ".join(map(str, i)) if isinstance(i, tuple) else i for i in self.inputs]

    @property
    def num_estimated_tokens(self) -> int:
        """Tokens the inputs hold: counted for token ids, about four characters each for text."""
        return sum(len(i) if isinstance(i, tuple) else max(1, len(i) // 4) for i in self.inputs)


def parse_embeddings(body: Any, models: tuple[str, ...] | None = None) -> EmbeddingsRequest:
    """``body`` (parsed JSON) checked; ``models``: what this engine serves (None: any)."""
    if not isinstance(body, dict):
        raise EmbeddingsError("The request body must be a JSON object.", None, "invalid_json")
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > 256:
        raise EmbeddingsError("'model' must be a non-empty string of at most 256 characters.",
                              "model")
    if models is not None and model not in models:
        raise EmbeddingsError(f"The model {model!r} does not exist on this engine; it serves: "
                              f"{', '.join(models)}.", "model", "model_not_found", 404)
    inputs = _inputs(body.get("input"))
    encoding_format = body.get("encoding_format")
    if encoding_format is None:
        encoding_format = "float"
    if encoding_format not in ENCODING_FORMATS:
        raise EmbeddingsError(f"Invalid 'encoding_format': {encoding_format!r}; use 'float' or "
                              "'base64'.", "encoding_format", "invalid_value")
    dimensions = body.get("dimensions")
    if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                   or dimensions < 1):
        raise EmbeddingsError("'dimensions' must be a positive integer.", "dimensions",
                              "invalid_value")
    if "user" in body and not isinstance(body["user"], str | None):
        raise EmbeddingsError("'user' must be a string.", "user", "invalid_type")
    return EmbeddingsRequest(model, inputs, encoding_format, dimensions)


def _inputs(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if value is None:
        raise EmbeddingsError("Missing required parameter: 'input'.", "input")
    if isinstance(value, str):
        return (_text(value, "input"),)
    if not isinstance(value, list) or not value:
        raise EmbeddingsError("'input' must be a string, an array of strings, an array of token "
                              "ids or an array of token-id arrays, and not empty.", "input",
                              "invalid_type")
    if len(value) > MAX_INPUTS:
        raise EmbeddingsError(f"'input' holds {len(value)} items; send at most {MAX_INPUTS} per "
                              "request.", "input", "invalid_value")
    if all(_is_token(t) for t in value):
        return (_token_ids(value, "input"),)
    items: list[str | tuple[int, ...]] = []
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if isinstance(item, str):
            items.append(_text(item, param))
        elif isinstance(item, list) and item and all(_is_token(t) for t in item):
            items.append(_token_ids(item, param))
        else:
            raise EmbeddingsError(f"'{param}' must be a non-empty string or a non-empty array of "
                                  "token ids; all items of 'input' must be of one kind.", param,
                                  "invalid_type")
    if len({type(i) for i in items}) > 1:
        raise EmbeddingsError("'input' mixes strings and token-id arrays; send one kind.",
                              "input", "invalid_type")
    return tuple(items)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: str, param: str) -> str:
    if not value:
        raise EmbeddingsError(f"'{param}' is an empty string; send some text.", param,
                              "invalid_value")
    return value


def _token_ids(ids: list[int], param: str) -> tuple[int, ...]:
    for token in ids:
        if not 0 <= token <= MAX_TOKEN_ID:
            raise EmbeddingsError(f"Invalid token id in '{param}': {token}.", param,
                                  "invalid_value")
    return tuple(ids)


def hashed_embedding(text: str, num_dims: int) -> list[float]:
    """A unit vector of ``num_dims`` derived from ``text`` alone (SHAKE-256 of its bytes)."""
    raw = hashlib.shake_256(text.encode("utf-8", "surrogatepass")).digest(4 * num_dims)
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{num_dims}I", raw)]
    return normalized(values)


def normalized(values: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


def fitted(vector: list[float], dimensions: int | None) -> list[float]:
    """The first ``dimensions`` components, unit length again (how OpenAI's text-embedding-3
    models shorten a vector); the vector unchanged without ``dimensions``."""
    if dimensions is None or dimensions >= len(vector):
        return vector
    return normalized(vector[:dimensions])


def embeddings_body(request: EmbeddingsRequest, vectors: list[list[float]],
                    num_prompt_tokens: int) -> bytes:
    """The answer: one embedding object per input, in order, and the tokens read."""
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(vectors):
        vector = fitted(vector, request.dimensions)
        embedding: list[float] | str = vector
        if request.encoding_format == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    return orjson.dumps({"object": "list", "data": data, "model": request.model,
                         "usage": {"prompt_tokens": num_prompt_tokens,
                                   "total_tokens": num_prompt_tokens}})


def dimensions_error(request: EmbeddingsRequest, num_dims: int) -> EmbeddingsError | None:
    """The 400 for asking more ``dimensions`` than the model's ``num_dims``, or None."""
    if request.dimensions is not None and request.dimensions > num_dims:
        return EmbeddingsError(f"'dimensions' is {request.dimensions}, but {request.model!r} "
                               f"gives {num_dims}; ask for at most that.", "dimensions",
                               "invalid_value")
    return None
