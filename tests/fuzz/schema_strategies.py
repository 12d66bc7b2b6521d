"""Hypothesis strategies from the JSON Schemas of the gateway's OpenAPI document.

A small generator for the subset the document uses (type, const, enum, anyOf, $ref, object,
array, string with length or pattern, bounded numbers), in the manner of schemathesis:
``valid(schema)`` draws instances the schema accepts; ``hints`` put known values (a served
model, an existing tenant id) in the mix, so generated requests get past the 404s and reach
the code behind them.

Example::

    gen = SchemaGen(document())
    body = gen.valid(gen.component("ChatCompletionRequest")).example()
"""

from __future__ import annotations

import functools
import string
from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]

# Kept small: a value is sent over HTTP, and the engine prices its prompt.
MAX_TEXT_CHARS = 40
MAX_ITEMS = 3
# Letters, digits, punctuation, and characters from far planes (CJK, emoji, combining marks).
TEXT = st.text(st.characters(codec="utf-8"), max_size=MAX_TEXT_CHARS)
ASCII = st.text(string.ascii_letters + string.digits + "-_.", max_size=MAX_TEXT_CHARS)


@functools.cache
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    """``st.integers``, built once per range: building a strategy costs more than a draw."""
    return st.integers(low, high)


@functools.cache
def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value: nested arrays and objects of strings, numbers, booleans and null."""
    scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
               | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=MAX_ITEMS)
        | st.dictionaries(TEXT, children, max_size=MAX_ITEMS),
        max_leaves=max_leaves,
    )


class SchemaGen:
    """Valid instances of the document's schemas; ``hints`` maps a property or parameter
    name to a strategy mixed into what the schema would draw for it."""

    def __init__(self, document: Mapping[str, Any],
                 hints: Mapping[str, st.SearchStrategy[Any]] | None = None) -> None:
        self.document = document
        self.hints = dict(hints or {})
        # Built once per schema node: building a strategy costs more than drawing from it.
        self._built: dict[tuple[int, str | None], st.SearchStrategy[Any]] = {}

    def component(self, name: str) -> Schema:
        schema: Schema = self.document["components"]["schemas"][name]
        return schema

    def resolve(self, schema: Schema) -> Schema:
        while "$ref" in schema:
            node: Any = self.document
            for part in schema["$ref"].removeprefix("#/").split("/"):
                node = node[part]
            schema = node
        return schema

    def valid(self, schema: Schema, name: str | None = None) -> st.SearchStrategy[Any]:
        """Instances of ``schema`` (a node of the document); ``name``: the property's."""
        key = (id(schema), name)
        built = self._built.get(key)
        if built is None:
            built = self._valid(self.resolve(schema))
            hint = self.hints.get(name) if name is not None else None
            if hint is not None:
                built = hint | built
            self._built[key] = built
        return built

    def _valid(self, schema: Schema) -> st.SearchStrategy[Any]:
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        if "anyOf" in schema:
            return st.one_of([self.valid(s) for s in schema["anyOf"]])
        kind = schema.get("type")
        if kind is None:
            return json_values()
        if isinstance(kind, list):
            return st.one_of([self._valid({**schema, "type": k}) for k in kind])
        return getattr(self, f"_{kind}")(schema)

    def _null(self, schema: Schema) -> st.SearchStrategy[Any]:
        return st.none()

    def _boolean(self, schema: Schema) -> st.SearchStrategy[Any]:
        return st.booleans()

    def _integer(self, schema: Schema) -> st.SearchStrategy[Any]:
        return st.integers(schema.get("minimum"), schema.get("maximum"))

    def _number(self, schema: Schema) -> st.SearchStrategy[Any]:
        low, high = schema.get("minimum"), schema.get("maximum")
        exclusive_low = schema.get("exclusiveMinimum")
        floats = st.floats(exclusive_low if low is None else low, high,
                           exclude_min=exclusive_low is not None,
                           allow_nan=False, allow_infinity=False)
        if exclusive_low is not None:
            return floats
        low_int = None if low is None else int(-(-low // 1))
        high_int = None if high is None else int(high // 1)
        return floats | st.integers(low_int, high_int)

    def _string(self, schema: Schema) -> st.SearchStrategy[Any]:
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        low = schema.get("minLength", 0)
        high = min(schema.get("maxLength", MAX_TEXT_CHARS), max(low, MAX_TEXT_CHARS))
        return st.text(st.characters(codec="utf-8"), min_size=low, max_size=high)

    def _array(self, schema: Schema) -> st.SearchStrategy[Any]:
        low = schema.get("minItems", 0)
        high = min(schema.get("maxItems", MAX_ITEMS), max(low, MAX_ITEMS))
        return st.lists(self.valid(schema.get("items", {})), min_size=low, max_size=high)

    def _object(self, schema: Schema) -> st.SearchStrategy[Any]:
        properties: dict[str, Schema] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = st.fixed_dictionaries(
            {name: self.valid(properties[name], name) for name in sorted(required)},
            optional={name: self.valid(s, name) for name, s in properties.items()
                      if name not in required},
        )
        if schema.get("additionalProperties", True) is False:
            return fixed
        extra = st.dictionaries(ASCII.filter(lambda k: k not in properties), json_values(4),
                                max_size=2)
        return st.builds(lambda known, more: {**more, **known}, fixed, extra)
