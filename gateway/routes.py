"""The routes the proxy serves, by the name the gateway's code and metrics use for each."""

from __future__ import annotations

ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
               "embeddings": "/v1/embeddings", "tokenize": "/tokenize",
               "detokenize": "/detokenize"}
