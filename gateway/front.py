"""Around every route's handler: the request id in and out, and every error as an API-format
JSON body (``front``). Compiled with the request path (``routing.native``).

Request ids are ``req-`` and 24 hex digits: this process's random half (drawn again in a forked
child) and a counter, so making one needs no system call; they label requests and are not
secrets (the gateway keys nothing a client could claim by guessing one).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
from collections.abc import Awaitable, Callable

from aiohttp import web
from redis.exceptions import RedisClusterException, RedisError

from gateway.apis import ANTHROPIC
from gateway.context import GATEWAY, REQUEST_ID
from gateway.errors import APIError, from_http_exception
from gateway.routes import ANTHROPIC_PATH_PREFIX

log = logging.getLogger(__name__)

REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,128}$")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_MASK_48 = (1 << 48) - 1
_TOP_48 = 1 << 48


class _Ids:
    """This process's random half of every id, and the counter for the other."""

    def __init__(self) -> None:
        self.prefix = ""
        self.counter = 0
        self.reseed()

    def reseed(self) -> None:
        self.prefix = os.urandom(6).hex()
        self.counter = 0

    def next_hex(self) -> str:
        """The counter's next value as 12 hex digits (``hex`` of it over a 49th bit, which is
        cut off: three times quicker compiled than a format spec)."""
        self.counter = (self.counter + 1) & _MASK_48
        return hex(self.counter | _TOP_48)[3:]


_IDS = _Ids()
os.register_at_fork(after_in_child=_IDS.reseed)


def new_request_id() -> str:
    """``req-`` and 24 hex digits, unique across processes (their random halves) and within one
    (its counter)."""
    return "req-" + _IDS.prefix + _IDS.next_hex()


def own_request_id(request_id: str) -> str:
    """The id of this request's leases and queue places: a client's ``x-request-id`` is only a
    label, and two requests that share one must not share a concurrency slot."""
    return request_id + "#" + _IDS.prefix + _IDS.next_hex()


async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id in and out, and every error as an OpenAI-format JSON body: around every
    route's handler (``with_front``), and the 404 / 405 answers of paths and methods no route
    takes. Not an aiohttp middleware: one costs a wrapper coroutine and a cache lookup per
    request on top of this."""
    presented = request.headers.get("x-request-id")
    request_id = presented or new_request_id()
    try:
        if presented is not None and not REQUEST_ID_RE.match(presented):
            request_id = new_request_id()
            raise APIError.bad_request(
                "Invalid 'x-request-id' header: use 1-128 characters of letters, digits and "
                "._:@/+=-", param="x-request-id", code="invalid_header",
            )
        request[REQUEST_ID] = request_id
        response = await handler(request)
    except APIError as api_error:
        response = error_response(request, api_error)
    except web.HTTPException as http_exc:
        max_body = request.config_dict[GATEWAY].settings.max_body_bytes
        response = error_response(request, from_http_exception(http_exc, request.path, max_body))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    # The admin API, or any path that needs Redis while it is away.
    except (RedisError, RedisClusterException) as redis_error:
        log.warning("Redis unreachable serving %s %s: %s", request.method, request.path,
                    redis_error)
        response = error_response(request, APIError.unavailable(
            "The gateway's state store (Redis) is unreachable; retry shortly.", 2,
            code="state_store_unavailable"))
    except Exception:
        log.exception("unhandled error serving %s %s", request.method, request.path)
        response = error_response(request, APIError(
            500, "Internal gateway error; the request id identifies it in the gateway's log.",
            type="server_error", code="internal_error",
        ))
    if not response.prepared:
        response.headers["x-request-id"] = request_id
    return response


def error_response(request: web.Request, exc: APIError) -> web.Response:
    """``exc`` in the shape of the API the path belongs to: Anthropic's under /v1/messages,
    OpenAI's elsewhere."""
    if not request.path.startswith(ANTHROPIC_PATH_PREFIX):
        return exc.to_response()
    return exc.to_response(ANTHROPIC.error_body(exc.status, exc.message, exc.type, exc.code,
                                                exc.param))


def with_front(handler: Handler) -> Handler:
    """``handler`` inside ``front``."""
    return functools.partial(front, handler=handler)
