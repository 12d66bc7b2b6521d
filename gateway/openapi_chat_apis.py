"""The OpenAPI schemas of the Anthropic Messages and OpenAI Responses bodies, as
``backends.chat_apis`` checks them (what the gateway accepts, the document accepts), and of
their answers and Anthropic's error.

Example::

    schemas = chat_api_schemas()
    schemas["MessagesRequest"]["required"]  # ['model', 'max_tokens', 'messages']
"""

from __future__ import annotations

from backends.chat_apis import MAX_MODEL_CHARS
from gateway.openapi_base import JSON_INT_MAX, Schema, nullable


def _count(low: int) -> Schema:
    return {"type": "integer", "minimum": low, "maximum": JSON_INT_MAX,
            "description": "A JSON integer literal: 1.0 is refused."}


def _unit(high: float) -> Schema:
    return nullable({"type": "number", "minimum": 0, "maximum": high})


_MODEL: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_CHARS,
                  "description": "A model GET /v1/models lists."}
_STREAM: Schema = {"type": ["boolean", "null"], "description": "true: answer in SSE events."}


def chat_api_schemas() -> dict[str, Schema]:
    # A block the gateway reads as text, or any other typed block (an image, a tool call, a
    # kind added later): passed on, and left out of the text routing reads.
    text_block: Schema = {"type": "object", "required": ["type", "text"],
                          "properties": {"type": {"enum": ["text", "input_text", "output_text"]},
                                         "text": {"type": "string"}}}
    other_block: Schema = {"type": "object", "required": ["type"],
                           "properties": {"type": {"type": "string"}}}
    blocks: Schema = {"type": "array", "items": {"anyOf": [text_block, other_block]}}
    content: Schema = {"anyOf": [{"type": "string"}, blocks]}
    user_id: Schema = {"type": ["string", "null"],
                       "description": "Requests with the same user_id stick to one backend "
                                      "when they can."}
    messages_fields: Schema = {
        "model": _MODEL,
        "messages": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["role", "content"],
            "properties": {"role": {"enum": ["user", "assistant"]}, "content": content}}},
        "system": {"anyOf": [{"type": "null"}, {"type": "string"}, blocks]},
        "stream": _STREAM,
        "temperature": _unit(1),
        "top_p": _unit(1),
        "top_k": nullable(_count(0)),
        "stop_sequences": nullable({"type": "array", "items": {"type": "string"}}),
        "metadata": nullable({"type": "object", "properties": {"user_id": user_id}}),
    }
    message_item: Schema = {
        "type": "object", "required": ["role", "content"],
        "properties": {"type": {"enum": ["message"]},
                       "role": {"enum": ["user", "assistant", "system", "developer"]},
                       "content": content}}
    other_item: Schema = {"type": "object", "required": ["type"],
                          "properties": {"type": {"type": "string"}}}
    return {
        "MessagesRequest": {
            "type": "object", "required": ["model", "max_tokens", "messages"],
            "properties": {**messages_fields, "max_tokens": _count(1)},
            "additionalProperties": True},
        "MessagesCountTokensRequest": {
            "type": "object", "required": ["model", "messages"],
            "properties": {**messages_fields, "max_tokens": nullable(_count(1))},
            "additionalProperties": True},
        "ResponsesRequest": {
            "type": "object", "required": ["model"],
            "description": "'input' is required unless 'previous_response_id' is given.",
            "properties": {
                "model": _MODEL,
                "input": {"anyOf": [{"type": "string"},
                                    {"type": "array", "items": {"anyOf": [message_item,
                                                                          other_item]}}]},
                "instructions": {"type": ["string", "null"]},
                "max_output_tokens": nullable(_count(1)),
                "stream": _STREAM,
                "temperature": _unit(2),
                "top_p": _unit(1),
                "previous_response_id": {"type": ["string", "null"]},
                "prompt_cache_key": {"type": ["string", "null"], "description":
                                     "Requests with the same key stick to one backend when "
                                     "they can (before safety_identifier and user)."},
                "safety_identifier": {"type": ["string", "null"]},
                "user": {"type": ["string", "null"]},
            },
            "additionalProperties": True},
        "Message": {"type": "object", "required": ["id", "type", "role", "content"],
                    "properties": {"id": {"type": "string"}, "type": {"const": "message"},
                                   "role": {"const": "assistant"},
                                   "content": {"type": "array"}, "usage": {"type": "object"}}},
        "InputTokens": {"type": "object", "required": ["input_tokens"],
                        "properties": {"input_tokens": {"type": "integer", "minimum": 0}}},
        "Response": {"type": "object", "required": ["id", "object", "status", "output"],
                     "properties": {"id": {"type": "string"}, "object": {"const": "response"},
                                    "status": {"type": "string"},
                                    "output": {"type": "array"},
                                    "usage": nullable({"type": "object"})}},
        "AnthropicError": {
            "type": "object", "required": ["type", "error"],
            "properties": {"type": {"const": "error"}, "error": {
                "type": "object", "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"},
                               "code": {"type": ["string", "null"]},
                               "param": {"type": ["string", "null"]}}}}},
    }
