"""Every client-visible error, in OpenAI's format: ``{"error": {message, type, param, code}}``.

Handlers raise :class:`APIError`; the error middleware turns it (and aiohttp's own HTTP
exceptions) into a JSON response. Example::

    raise APIError.bad_request("'messages' must be a non-empty array", param="messages")
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

JSON_CONTENT_TYPE = "application/json"


class APIError(Exception):
    """An error the client sees, with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})
        # Set when the request's body cannot be read to its end (the connection cannot be
        # reused).
        self.closes_connection = False

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code, self.param)

    def to_response(self, body: bytes | None = None) -> web.Response:
        """The error as a response: OpenAI's body, or ``body`` (another API's shape)."""
        response = web.Response(
            status=self.status,
            body=self.body() if body is None else body,
            content_type=JSON_CONTENT_TYPE,
            headers=self.headers,
        )
        if self.closes_connection:
            response.force_close()
        return response

    # -- constructors, one per status the gateway produces -------------------------------
    @classmethod
    def bad_request(
        cls, message: str, param: str | None = None, code: str | None = None
    ) -> APIError:
        return cls(400, message, param=param, code=code or "invalid_request")

    @classmethod
    def unauthorized(cls, message: str, code: str = "invalid_api_key") -> APIError:
        return cls(
            401, message, type="authentication_error", code=code,
            headers={"WWW-Authenticate": 'Bearer realm="switchyard"'},
        )

    @classmethod
    def forbidden(
        cls, message: str, code: str = "permission_denied", param: str | None = None
    ) -> APIError:
        return cls(403, message, type="permission_error", code=code, param=param)

    @classmethod
    def not_found(cls, message: str, code: str = "not_found", param: str | None = None) -> APIError:
        return cls(404, message, code=code, param=param)

    @classmethod
    def bad_gateway(cls, message: str) -> APIError:
        return cls(502, message, type="upstream_error", code="upstream_failed")

    @classmethod
    def unavailable(cls, message: str, retry_after_s: int = 1,
                    code: str = "no_healthy_backend") -> APIError:
        return cls(
            503, message, type="service_unavailable", code=code,
            headers={"Retry-After": str(retry_after_s)},
        )

    @classmethod
    def gateway_timeout(cls, message: str) -> APIError:
        return cls(504, message, type="timeout", code="upstream_timeout")


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    error = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": error})


_HTTP_MESSAGES: dict[int, tuple[str, str]] = {
    400: ("The request could not be parsed as HTTP.", "invalid_request"),
    404: ("Unknown path. The gateway serves /v1/chat/completions, /v1/completions, "
          "/v1/messages, /v1/messages/count_tokens, /v1/responses, /v1/embeddings, "
          "/v1/models, /tokenize and /detokenize.", "unknown_url"),
    405: ("Method not allowed for this path.", "method_not_allowed"),
    413: ("Request body too large.", "request_too_large"),
    414: ("Request URI too long.", "uri_too_long"),
    431: ("Request header fields too large.", "headers_too_large"),
}


def from_http_exception(exc: web.HTTPException, path: str, max_body_bytes: int) -> APIError:
    """Translate aiohttp's router and body errors into OpenAI-format errors."""
    status = exc.status
    message, code = _HTTP_MESSAGES.get(status, (exc.reason or "Request failed.", "http_error"))
    if status == 404:
        message = f"Unknown path {path!r}. {message.split('. ', 1)[1]}"
    elif status == 405 and isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"Method {exc.method} is not allowed on {path}; use {allowed}."
    elif status == 413:
        message = (
            f"Request body too large: the limit is {max_body_bytes} bytes. "
            "Send a shorter prompt or raise max_body_bytes in the gateway configuration."
        )
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return APIError(status, message, type=error_type, code=code, headers=headers)


def unreadable_body(exc: web.RequestPayloadError, encoding: str) -> APIError:
    """The 400 for a body aiohttp could not read; the rest of it is unread, so the
    connection closes after the answer."""
    if isinstance(exc.__cause__, ContentEncodingError):
        error = APIError.bad_request(
            f"The body is not {encoding}-compressed, though 'Content-Encoding: {encoding}' "
            "says it is: compress it, or drop the header.", code="invalid_content_encoding")
    else:
        error = APIError.bad_request(f"The request body could not be read ({exc}); send it "
                                     "again, complete.", code="invalid_body")
    error.closes_connection = True
    return error
