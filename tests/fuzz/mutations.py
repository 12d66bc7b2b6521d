"""Near-valid inputs: a valid body with one thing wrong, and bodies that are not JSON at all.

``near_valid(gen, schema)`` takes a body the schema accepts and breaks one field: a value of
the wrong type, a number out of range or beyond 64 bits, a required field dropped, junk
nested in it. ``encoded(values)`` writes values as request bytes the way careless clients do:
non-ASCII raw or escaped, NaN and Infinity literals, lone surrogates (raw or escaped), a BOM,
truncation, trailing garbage.

Example::

    raw = encoded(near_valid(gen, gen.component("CompletionRequest"))).example()
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.schema_strategies import TEXT, Schema, SchemaGen, integers, json_values

# Values a parser gets wrong: integers past 64 bits and at its edges, floats at theirs,
# the strings of special numbers, empty containers, deep nesting, control and surrogate
# characters.
ODD_VALUES: tuple[Any, ...] = (
    2**64, 2**64 - 1, 2**63, -(2**63) - 1, 2**100, -(2**100), 10**400, 0, -1, 1, 3,
    1e308, -1e308, 5e-324, -0.0, 0.5, 1.0, 2.0000001, 128.0,
    "NaN", "Infinity", "-Infinity", "1e400", "0x10", "1", "", " ", "\x00", "\ud800", "\udfff",
    "\u202e", "a" * 300, True, False, None, [], {}, [None], [[]], {"": {}}, [[[[[[[[1]]]]]]]],
)
SURROGATES = st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3)
ODD = st.sampled_from(ODD_VALUES) | SURROGATES | json_values(6) | TEXT


def near_valid(gen: SchemaGen, schema: Schema) -> st.SearchStrategy[Any]:
    """A body the schema accepts, with one field broken."""
    return gen.valid(schema).flatmap(lambda body: broken(gen, schema, body))


@st.composite
def broken(draw: st.DrawFn, gen: SchemaGen, schema: Schema, body: Any,
           rng: random.Random | None = None) -> Any:
    """``body`` with one field broken: an odd value, out of range, dropped, or junk nested
    in it; or no object at all. Which field and how: ``rng`` (or a seeded one drawn), so
    uniformly: hypothesis would favour the first field of the list."""
    rng = rng or draw(st.randoms(use_true_random=True))
    schema = gen.resolve(schema)
    properties: dict[str, Schema] = schema.get("properties", {})
    how = rng.choice(("odd-value", "odd-value", "out-of-range", "drop-required", "nested-odd",
                      "not-an-object"))
    if how == "not-an-object" or not isinstance(body, dict) or not properties:
        return draw(ODD)
    body = dict(body)
    if how == "drop-required" and schema.get("required"):
        body.pop(rng.choice(sorted(schema["required"])), None)
        return body
    name = rng.choice(sorted(properties))
    if how == "out-of-range":
        body[name] = rng.choice(_out_of_range(gen.resolve(properties[name])))
    elif how == "nested-odd" and isinstance(body.get(name), list | dict) and body[name]:
        body[name] = _replace_leaf(body[name], draw(ODD), draw(integers(0, 7)))
    else:
        body[name] = draw(ODD)
    return body


def _bounds(schema: Schema) -> list[float]:
    found: list[float] = []
    for option in schema.get("anyOf", [schema]):
        for key in ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength",
                    "minItems", "maxItems"):
            if key in option:
                found.append(option[key])
    return found


def _out_of_range(schema: Schema) -> list[Any]:
    """Values just past a bound the schema states, or numbers no field takes."""
    edges = [edge + step for edge in _bounds(schema) for step in (-1, -0.5, 0, 0.5, 1)]
    return edges or list(ODD_VALUES[:20])


def _replace_leaf(value: Any, leaf: Any, depth: int) -> Any:
    """``value`` with one nested element (chosen by ``depth``) replaced by ``leaf``."""
    if depth == 0 or not isinstance(value, list | dict) or not value:
        return leaf
    if isinstance(value, list):
        return [_replace_leaf(value[0], leaf, depth - 1), *value[1:]]
    first = sorted(value)[0]
    return {**value, first: _replace_leaf(value[first], leaf, depth - 1)}


def _dumps(value: Any, ensure_ascii: bool) -> bytes:
    # The standard library writes what orjson will not: big integers, NaN, lone surrogates.
    return json.dumps(value, ensure_ascii=ensure_ascii, allow_nan=True).encode(
        "utf-8", "surrogatepass")


DAMAGES = ("truncate", "bom", "trailing", "splice", "nan-literal", "deep")


@st.composite
def encoded(draw: st.DrawFn, values: st.SearchStrategy[Any], damaged_share: float = 0.4
            ) -> bytes:
    """``values`` as request bytes: mostly well-formed JSON, sometimes damaged."""
    return encode(draw, draw(values), draw(st.randoms(use_true_random=True)), damaged_share)


def encode(draw: st.DrawFn, value: Any, rng: random.Random, damaged_share: float) -> bytes:
    """``value`` as request bytes: well-formed JSON, or (``damaged_share`` of the time, the
    kind of damage chosen by ``rng``) damaged."""
    raw = _dumps(value, ensure_ascii=rng.random() < 0.5)
    how = rng.choice(DAMAGES) if rng.random() < damaged_share else "as-is"
    if how == "truncate" and raw:
        return raw[: draw(integers(0, len(raw) - 1))]
    if how == "bom":
        return b"\xef\xbb\xbf" + raw
    if how == "trailing":
        return raw + rng.choice((b"x", b" ,", b"}", b"\x00", b"\n{}", b"\xff"))
    if how == "splice" and raw:
        at = draw(integers(0, len(raw)))
        return raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    if how == "nan-literal":
        return raw.replace(b"1", b"NaN", 1) if b"1" in raw else b'{"model": Infinity}'
    if how == "deep":
        depth = rng.choice((64, 512, 1100, 5000))
        return b'{"model": "m", "messages": ' + b"[" * depth + b"]" * depth + b"}"
    return raw


def request_bytes(gen: SchemaGen, schema: Schema) -> st.SearchStrategy[bytes]:
    """Valid bodies, near-valid ones, any JSON at all, and arbitrary bytes."""
    return st.one_of(
        encoded(gen.valid(schema)),
        encoded(near_valid(gen, schema)),
        encoded(json_values()),
        st.binary(max_size=64),
    )
