"""What the OpenAPI schema modules share: the schema type, JSON's integer bounds, ``$ref`` and
nullable wrappers.

Example::

    nullable(ref("ChatMessage"))   # {"anyOf": [{"$ref": ...}, {"type": "null"}]}
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

# orjson reads an integer outside these bounds as a float, which an integer field refuses.
JSON_INT_MIN = -(2**63)
JSON_INT_MAX = 2**64 - 1


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}
