"""The one exception of the mock engine and the OpenAI error body it renders to."""

from __future__ import annotations

from typing import Any

from backends.engine_http import error_body


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
        return error_body(self.status, self.message, self.param, self.code)
