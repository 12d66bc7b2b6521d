"""The routes the proxy serves, by the name the gateway's code and metrics use for each."""

from __future__ import annotations

ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
               "embeddings": "/v1/embeddings", "tokenize": "/tokenize",
               "detokenize": "/detokenize", "messages": "/v1/messages",
               "count_tokens": "/v1/messages/count_tokens", "responses": "/v1/responses"}
ANTHROPIC_PATH_PREFIX = "/v1/messages"  # its errors are Anthropic's shape
