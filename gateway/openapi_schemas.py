"""The schemas of the gateway's OpenAPI document (``gateway.openapi``), built from the checks
that enforce them: the completion bodies from ``gateway.validation``'s field table, the admin
bodies from ``gateway.admin``'s pydantic models, so the document follows the code.

Example::

    schemas = component_schemas()
    schemas["ChatCompletionRequest"]["required"]  # ['model', 'messages']
"""

from __future__ import annotations

from backends.embeddings import ENCODING_FORMATS, MAX_INPUTS
from gateway.admin import KeyCreate, KeyImport, TenantCreate, TenantUpdate
from gateway.openapi_base import JSON_INT_MAX, JSON_INT_MIN, Schema, nullable, ref
from gateway.openapi_chat_apis import chat_api_schemas
from gateway.tenancy import MAX_WEIGHT, MIN_WEIGHT
from gateway.validation import _NUMERIC_FIELDS, _ROLES, MAX_TOKEN_ID

MAX_MODEL_CHARS = 256
MAX_STOP_STRINGS = 16


def _numeric_fields() -> dict[str, Schema]:
    fields: dict[str, Schema] = {}
    for name, (kind, low, high) in _NUMERIC_FIELDS.items():
        schema: Schema = {"type": "integer" if kind == "int" else "number"}
        if kind == "int":
            schema["minimum"] = JSON_INT_MIN if low is None else low
            schema["maximum"] = JSON_INT_MAX if high is None else high
            schema["description"] = "A JSON integer literal: 1.0 is refused."
        else:
            if low is not None:
                schema["minimum"] = low
            if high is not None:
                schema["maximum"] = high
        fields[name] = nullable(schema)
    return fields


def _common_fields() -> dict[str, Schema]:
    """The fields both completion bodies share; any other field is forwarded unchecked."""
    return {
        "model": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_CHARS,
                  "description": "A model GET /v1/models lists."},
        "stream": {"type": ["boolean", "null"], "description": "true: answer in SSE events."},
        "stream_options": nullable({
            "type": "object",
            "properties": {"include_usage": {"type": ["boolean", "null"]}},
        }),
        **_numeric_fields(),
        "stop": {"anyOf": [
            {"type": "null"}, {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP_STRINGS},
        ]},
        "user": {"type": ["string", "null"],
                 "description": "Requests with the same user stick to one backend when they can."},
        "cache_salt": {"type": ["string", "null"],
                       "description": "Salts the prefix-cache hashes (vLLM's cache_salt)."},
    }


def _completion_schemas() -> dict[str, Schema]:
    token_ids: Schema = {"type": "array", "minItems": 1,
                         "items": {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}}
    return {
        "ChatMessage": {
            "type": "object",
            "required": ["role"],
            "properties": {
                "role": {"type": "string", "enum": sorted(_ROLES)},
                "content": {"anyOf": [{"type": "null"}, {"type": "string"},
                                      {"type": "array", "items": {}}],
                            "description": "Text, or an array of content parts."},
                "name": {"type": "string"},
            },
        },
        "ChatCompletionRequest": {
            "type": "object",
            "required": ["model", "messages"],
            "properties": {
                **_common_fields(),
                "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
            },
            "additionalProperties": True,
        },
        "CompletionRequest": {
            "type": "object",
            "required": ["model", "prompt"],
            "properties": {
                **_common_fields(),
                "prompt": {"anyOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    token_ids,
                    {"type": "array", "minItems": 1, "items": {**token_ids, "minItems": 0}},
                ]},
            },
            "additionalProperties": True,
        },
        "EmbeddingsRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": {"type": "string", "minLength": 1, "maxLength": 256},
                "input": {"anyOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS,
                     "items": {"type": "string", "minLength": 1}},
                    token_ids,
                    {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": token_ids},
                ]},
                "encoding_format": {"type": "string", "enum": list(ENCODING_FORMATS)},
                "dimensions": {"type": "integer", "minimum": 1},
                "user": {"type": "string"},
            },
            "additionalProperties": True,
        },
        "TokenizeRequest": {
            "type": "object",
            "required": ["model"],
            "properties": {
                "model": {"type": "string", "minLength": 1, "maxLength": 256},
                "prompt": {"type": "string"},
                "messages": {"type": "array", "minItems": 1, "items": ref("ChatMessage")},
                "add_generation_prompt": {"type": "boolean"},
            },
            "additionalProperties": True,
        },
        "TokenizeAnswer": {
            "type": "object",
            "required": ["count", "tokens"],
            "properties": {"count": {"type": "integer"}, "max_model_len": {"type": "integer"},
                           "tokens": {"type": "array", "items": {"type": "integer"}}},
        },
        "DetokenizeRequest": {
            "type": "object",
            "required": ["model", "tokens"],
            "properties": {
                "model": {"type": "string", "minLength": 1, "maxLength": 256},
                "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            },
            "additionalProperties": True,
        },
        "DetokenizeAnswer": {
            "type": "object",
            "required": ["prompt"],
            "properties": {"prompt": {"type": "string"}},
        },
        "EmbeddingList": {
            "type": "object",
            "description": "The engine's OpenAI-format answer, relayed unchanged.",
            "required": ["object", "data"],
            "properties": {
                "object": {"type": "string", "enum": ["list"]},
                "model": {"type": "string"},
                "data": {"type": "array", "items": {"type": "object"}},
                "usage": {"type": "object"},
            },
        },
        "Completion": {
            "type": "object",
            "description": "The engine's OpenAI-format answer, relayed unchanged.",
            "required": ["object", "choices"],
            "properties": {
                "id": {"type": "string"},
                "object": {"type": "string",
                           "enum": ["chat.completion", "text_completion"]},
                "model": {"type": "string"},
                "choices": {"type": "array", "items": {"type": "object"}},
                "usage": {"type": "object"},
            },
        },
        "Model": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by"],
            "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                           "created": {"type": "integer"}, "owned_by": {"type": "string"}},
        },
        "ModelList": _list_of("Model"),
    }


def _list_of(name: str) -> Schema:
    return {"type": "object", "required": ["object", "data"],
            "properties": {"object": {"const": "list"},
                           "data": {"type": "array", "items": ref(name)}}}


def _error_schema() -> Schema:
    return {
        "type": "object",
        "description": "Every error the gateway answers: OpenAI's format; the message says "
                       "what to change.",
        "required": ["error"],
        "properties": {"error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }},
    }


def _admin_body_schemas() -> dict[str, Schema]:
    """The admin bodies as pydantic states them (``extra="forbid"``: no other field), with
    the tenant weight's range, which a validator checks."""
    schemas: dict[str, Schema] = {}
    for model in (TenantCreate, TenantUpdate, KeyCreate, KeyImport):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        weight = schema["properties"].get("weight")
        if weight is not None:
            number = {"type": "number", "minimum": MIN_WEIGHT, "maximum": MAX_WEIGHT}
            weight.pop("anyOf", None)
            weight.pop("type", None)
            weight.update(number if model is TenantCreate else nullable(number))
        schemas[model.__name__] = schema
    return schemas


def _admin_record_schemas() -> dict[str, Schema]:
    limits = {name: {"type": ["integer", "null"]}
              for name in ("requests_per_minute", "tokens_per_minute", "max_concurrent")}
    key_fields: dict[str, Schema] = {
        "id": {"type": "string"}, "tenant_id": {"type": "string"}, "name": {"type": "string"},
        "hint": {"type": "string"}, "created_at": {"type": "number"},
        "expires_at": {"type": ["number", "null"]}, "revoked_at": {"type": ["number", "null"]},
        "tier": {"type": ["string", "null"]}, "imported": {"type": "boolean"},
        "object": {"const": "api_key"},
    }
    return {
        "Tenant": {
            "type": "object",
            "required": ["id", "name", "tier", "models", "limits", "enabled", "object"],
            "properties": {
                "id": {"type": "string"}, "name": {"type": "string"}, "tier": {"type": "string"},
                "models": {"type": "array", "items": {"type": "string"},
                           "description": "Model names; '*' for every model."},
                "limits": {"type": "object", "properties": limits},
                "enabled": {"type": "boolean"}, "created_at": {"type": "number"},
                "weight": {"type": "number"}, "object": {"const": "tenant"},
            },
        },
        "TenantList": _list_of("Tenant"),
        "ApiKey": {"type": "object", "required": ["id", "tenant_id", "hint", "object"],
                   "properties": key_fields},
        "NewApiKey": {"type": "object", "required": ["id", "tenant_id", "key", "object"],
                      "description": "A created key: the plaintext 'key' is in this "
                                     "response only.",
                      "properties": {**key_fields, "key": {"type": "string"}}},
        "ApiKeyList": _list_of("ApiKey"),
        "Usage": {"type": "object", "required": ["object", "from", "to", "data", "total"],
                  "properties": {"object": {"const": "usage"},
                                 "from": {"type": "string"}, "to": {"type": "string"},
                                 "group_by": {"type": "string"},
                                 "tenant": {"type": ["string", "null"]},
                                 "data": {"type": "array", "items": {"type": "object"}},
                                 "total": {"type": "object"},
                                 "flush_interval_s": {"type": "number"}}},
        "Fleet": {"type": "object", "required": ["object", "data"],
                  "properties": {"object": {"const": "list"},
                                 "routing_profile": {"type": "string"},
                                 "data": {"type": "array", "items": {"type": "object"}}}},
    }


def component_schemas() -> dict[str, Schema]:
    return {
        "Error": _error_schema(),
        **_completion_schemas(),
        **chat_api_schemas(),
        **_admin_body_schemas(),
        **_admin_record_schemas(),
        "Reload": {"type": "object", "required": ["reloaded", "applied", "needs_restart"],
                   "properties": {"reloaded": {"type": "boolean"},
                                  "applied": {"type": "array", "items": {"type": "string"}},
                                  "needs_restart": {"type": "array",
                                                    "items": {"type": "string"}}}},
        "Status": {"type": "object", "required": ["status"],
                   "properties": {"status": {"type": "string"},
                                  "healthy_backends": {"type": "array",
                                                       "items": {"type": "string"}}}},
    }
