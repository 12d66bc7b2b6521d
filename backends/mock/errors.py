"""The one exception of the mock engine and the OpenAI error body it renders to."""

from __future__ import annotations

from typing import Any


def error_type_for_status(status: int) -> str:
    """The OpenAI ``error.type`` that goes with an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


class RequestError(Exception):
    """A request the engine refuses; ``body()`` is the OpenAI-format JSON error.

    Example::

        raise RequestError(400, "'stream' must be a boolean", param="stream")
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": error_type_for_status(self.status),
                "param": self.param,
                "code": self.code,
            }
        }
