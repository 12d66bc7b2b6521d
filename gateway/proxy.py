"""The completion endpoints: authenticate, check, pick a backend, forward, relay.

The client's body bytes are forwarded unchanged (unknown fields pass through). Streams are
relayed chunk by chunk as they arrive; a client disconnect cancels the handler (the server runs
with ``handler_cancellation``), which closes the upstream connection at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from admission.hints import hints_from
from admission.tiers import TIER_HEADER, Tier
from admission.waiting_room import AdmissionRefused, Admitted
from backends.fleet.registry import Backend
from backends.fleet.upstream import RETRYABLE_STATUSES, Opened, UpstreamFailure
from gateway.admit import (
    QuotaTicket,
    admit_quota,
    finish_quota,
    overloaded,
    tier_for,
)
from gateway.apis import API_OF_ROUTE, OPENAI, Api
from gateway.auth import Principal, credentials
from gateway.context import CLIENT_LEFT, GATEWAY, REQUEST_ID, Gateway
from gateway.errors import APIError, unreadable_body
from gateway.front import own_request_id
from gateway.observe.request_log import add_routing, request_record
from gateway.observe.telemetry import REQUEST_TRACE, TELEMETRY
from gateway.relay import MODEL_HEADER, failed_on, relay_body, relay_stream
from gateway.router import RoutePlan
from gateway.routes import ROUTE_PATHS
from gateway.validation import (
    CompletionRequest,
    parse_chat_api_body,
    parse_completion_body,
    parse_embeddings_body,
    parse_tokenizer_body,
)
from routing.types import RouteRequest

log = logging.getLogger(__name__)

# Routed on load alone, without SLO admission: nothing waits for a first token.
_LOAD_ROUTED = frozenset({"embeddings", "tokenize", "detokenize", "count_tokens"})
# Answered without generating: no usage is charged.
_UNCHARGED_ROUTES = frozenset({"tokenize", "detokenize", "count_tokens"})
_TOKENIZER_ROUTES = frozenset({"tokenize", "detokenize"})
_CHAT_API_ROUTES = frozenset({"messages", "count_tokens", "responses"})
_FORWARDED_HEADERS = ("traceparent", "tracestate", "accept")
COUNTED_BY_HEADER = "x-switchyard-counted-by"  # "gateway": count_tokens answered here


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, "completions")


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's Messages API, passed to an engine that serves it (vLLM, SGLang, ours),
    with everything chat completions get; routed on its rendered system + messages, its
    errors in Anthropic's shape."""
    return await _handle(request, "messages")


async def count_tokens(request: web.Request) -> web.StreamResponse:
    """Anthropic's ``/v1/messages/count_tokens``, passed to an engine serving the model
    (auth, allowed models and the request quota apply; no usage is charged)."""
    return await _handle(request, "count_tokens")


async def responses(request: web.Request) -> web.StreamResponse:
    """OpenAI's Responses API, passed to an engine that serves it, as chat completions; routed
    on its rendered instructions + input."""
    return await _handle(request, "responses")


async def embeddings(request: web.Request) -> web.StreamResponse:
    """Auth, the tenant's quotas (the input's tokens), aliases and load-aware routing as for
    completions; no SLO admission (an embedding has no first token to wait for) and no
    prefix affinity (nothing of it stays cached)."""
    return await _handle(request, "embeddings")


async def tokenize(request: web.Request) -> web.StreamResponse:
    """vLLM's ``/tokenize``, passed to an engine serving the model (auth, the tenant's
    allowed models and its request quota apply; no usage is charged)."""
    return await _handle(request, "tokenize")


async def detokenize(request: web.Request) -> web.StreamResponse:
    """vLLM's ``/detokenize``, as ``tokenize``."""
    return await _handle(request, "detokenize")


async def _handle(request: web.Request, route: str) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    started = time.perf_counter()
    trace = request.app[TELEMETRY].start(request, route, started)
    model = ""
    served: str | None = None  # the model that serves it: the one asked for, or an alias's
    parsed_body: dict[str, Any] | None = None
    status = 500
    error: str | None = None
    principal: Principal | None = None
    plan: RoutePlan | None = None
    ticket: QuotaTicket | None = None
    gw.num_in_flight += 1
    try:
        try:
            principal = await gw.auth.authenticate(credentials(request.headers))
        except APIError as exc:
            if exc.status in (401, 403):
                gw.metrics.auth_failures.labels(exc.code or "unknown").inc()
            raise
        trace.waited("auth", started)
        raw = await _read_json_body(request, gw)
        num_input_tokens = 0
        if route == "embeddings":
            parsed, num_input_tokens = parse_embeddings_body(raw)
        elif route in _TOKENIZER_ROUTES:
            parsed = parse_tokenizer_body(raw, route=route)
        elif route in _CHAT_API_ROUTES:
            parsed = parse_chat_api_body(raw, route=route)
        else:
            parsed = parse_completion_body(raw, route=route)
        parsed_body = parsed.routing_body
        model = parsed.model
        candidates = gw.aliases.candidates(model) if gw.aliases else None
        if candidates is None:
            if not gw.registry.serves(model):
                raise APIError.not_found(
                    f"The model {model!r} does not exist on this gateway; GET /v1/models lists "
                    "the models you may use.", code="model_not_found", param="model",
                )
            candidates = (model,)
        if not principal.tenant.may_use(model):  # the name it asked for, alias or not
            raise APIError.forbidden(
                f"Your tenant may not use the model {model!r}; GET /v1/models lists the models "
                "you may use.", code="model_not_allowed", param="model",
            )
        # The first model the prompt fits; a later one is checked when its turn comes.
        plan, candidates = _first_fitting(gw, route, parsed, num_input_tokens, principal,
                                          candidates)
        served = candidates[0]
        tier = tier_for(gw.slo, principal, request.headers.get(TIER_HEADER),
                        hints_from(request.headers, parsed.body))
        trace.admitted(tier.name, principal.tenant.id, model, plan)
        waited_s = time.perf_counter()
        own_id = own_request_id(request[REQUEST_ID])
        ticket = await admit_quota(gw.quotas, principal, plan, own_id)
        if ticket.is_limited:
            trace.waited("quota", waited_s)
        try:
            first_error: APIError | None = None
            for index, served in enumerate(candidates):
                if index:
                    fitting = _plan_for(gw, route, parsed, num_input_tokens, principal, served)
                    if isinstance(fitting, str):
                        continue  # the prompt does not fit this model
                    plan = fitting
                try:
                    response = await _serve_model(request, gw, route, parsed, raw, plan, ticket,
                                                  tier, principal, own_id, served)
                    break
                except APIError as exc:
                    counted = (_counted_here(request, gw, parsed, served)
                               if exc.code == "unsupported_endpoint" and route == "count_tokens"
                               else None)
                    if counted is not None:
                        response = counted
                        break
                    if index + 1 == len(candidates) or not _falls_back(exc):
                        raise (first_error or exc) from None
                    first_error = first_error or exc
                    gw.metrics.fallbacks.labels(model, candidates[index + 1]).inc()
            else:
                assert first_error is not None  # the last candidate was too small for it
                raise first_error
        finally:
            finish_quota(ticket)
        status = 499 if request.get(CLIENT_LEFT) else response.status
        return response
    except APIError as exc:
        status, error = exc.status, exc.code
        raise
    except web.HTTPException as http_exc:  # aiohttp's own (413 for a body over the limit...)
        status, error = http_exc.status, f"http_{http_exc.status}"
        raise
    except (asyncio.CancelledError, ConnectionResetError, aiohttp.ClientConnectionResetError):
        status, error = 499, "client_closed"  # the client closed the connection
        gw.metrics.client_disconnects.inc()
        raise
    finally:
        gw.num_in_flight -= 1
        if gw.is_draining and not gw.num_in_flight:
            gw.drained.set()
        served_label = served if served is not None and gw.registry.serves(served) else None
        gw.metrics.observe_request(route, served_label, status, time.perf_counter() - started)
        trace.finish(status)
        if trace.backend is not None and status in (200, 499) and principal is not None \
                and plan is not None and ticket is not None and route not in _UNCHARGED_ROUTES:
            _charge(gw, API_OF_ROUTE[route], principal, served or model, trace.tail,
                    plan.request.num_prompt_tokens, ticket.num_output_tokens)
        if gw.request_log.wants(status):
            record = request_record(
                request[REQUEST_ID], trace, started, status, error, served_label,
                principal, plan.request.num_prompt_tokens if plan is not None else None,
                ticket.num_output_tokens if ticket is not None else None)
            if plan is not None and trace.backend is not None:
                add_routing(record, plan, is_detailed=gw.request_log.route_detail)
            if gw.request_log.include_prompt:
                record["prompt"] = gw.request_log.prompt_of(parsed_body)
            gw.request_log.write(record)


def _counted_here(request: web.Request, gw: Gateway, parsed: CompletionRequest,
                  served: str) -> web.Response | None:
    """Anthropic's ``count_tokens`` answered by the gateway, for an engine without it, when
    ``routing.tokenizers`` gives the model's tokenizer: the rendered system + messages, counted
    as routing counts them (and as switchyard's engines do); None without a tokenizer."""
    if served not in gw.router.tokenizers:
        return None
    request_plan = gw.router.describe(served, parsed.routing_body, None).request
    if not request_plan.is_exact_count:
        return None  # too long to tokenize here: the engine's to count
    return web.json_response(
        {"input_tokens": request_plan.num_prompt_tokens},
        headers={MODEL_HEADER: served, "x-request-id": request[REQUEST_ID],
                 COUNTED_BY_HEADER: "gateway"})


def _plan_for(gw: Gateway, route: str, parsed: CompletionRequest, num_input_tokens: int,
              principal: Principal, served: str) -> RoutePlan | str:
    """The request's plan on model ``served``, or why its prompt can never fit there."""
    if route in _LOAD_ROUTED:
        return _input_plan(served, num_input_tokens, principal)
    plan = gw.router.describe(served, parsed.routing_body, principal.tenant.id)
    why = gw.router.unservable(plan.request)
    return plan if why is None else why


def _first_fitting(gw: Gateway, route: str, parsed: CompletionRequest, num_input_tokens: int,
                   principal: Principal, candidates: tuple[str, ...]
                   ) -> tuple[RoutePlan, tuple[str, ...]]:
    """The plan for the first candidate model whose context the prompt fits, and the
    candidates from it on; the first one's 400 when it fits none."""
    first_why: str | None = None
    for index, served in enumerate(candidates):
        fitting = _plan_for(gw, route, parsed, num_input_tokens, principal, served)
        if not isinstance(fitting, str):
            return fitting, candidates[index:]
        first_why = first_why or fitting
    assert first_why is not None
    raise APIError.bad_request(first_why, param=_PROMPT_PARAM.get(route, "prompt"),
                               code="context_length_exceeded")


_PROMPT_PARAM = {"chat": "messages", "messages": "messages", "responses": "input"}


async def _serve_model(
    request: web.Request, gw: Gateway, route: str, parsed: CompletionRequest, raw: bytes,
    plan: RoutePlan, ticket: QuotaTicket, tier: Tier, principal: Principal, own_id: str,
    served: str,
) -> web.StreamResponse:
    """SLO admission, then forward to a backend of ``served`` and relay its answer."""
    trace = request[REQUEST_TRACE]
    if route in _LOAD_ROUTED:  # nothing to admit: routed on load alone
        return await _forward(request, gw, route, parsed, _for_model(parsed, raw, served),
                              plan, ticket, Admitted(principal.tenant.id), served)
    admitted: Admitted | None = None
    try:
        trace.waiting("admission_queue")
        plan.needs_free_slot = gw.slo.is_enabled
        try:
            admitted = await gw.slo.admit(tier, principal.tenant, plan, own_id, body=raw)
        except AdmissionRefused as refused:
            raise overloaded(refused) from None
        if admitted.snapshot is not None:  # routing reuses it: no second snapshot
            plan.snapshot, plan.snapshot_taken_s = admitted.snapshot, admitted.snapshot_taken_s
        trace.waited("admission_queue")
        return await _forward(request, gw, route, parsed, _for_model(parsed, raw, served), plan,
                              ticket, admitted, served)
    finally:
        gw.slo.finished(admitted, plan.request.num_prompt_tokens + ticket.num_output_tokens)


def _for_model(parsed: CompletionRequest, raw: bytes, served: str) -> bytes:
    """The body for the engine: the client's bytes, or, when an alias's target serves it,
    with the model the engine serves."""
    return raw if served == parsed.model else orjson.dumps({**parsed.body, "model": served})


def _input_plan(served: str, num_input_tokens: int, principal: Principal) -> RoutePlan:
    """An embeddings request's plan: its input tokens, no prefix (nothing stays cached), no
    output (the quota reserves the input alone)."""
    request = RouteRequest(model=served, num_prompt_tokens=max(1, num_input_tokens),
                           tenant_id=principal.tenant.id, max_tokens=0)
    return RoutePlan(request, request.num_prompt_tokens)


def _falls_back(exc: APIError) -> bool:
    """Whether another model may serve a request this error refused: no backend, none
    admissible, or an upstream that failed before the client had a byte."""
    return exc.status in (502, 503, 504) and exc.code != "gateway_shutting_down"


def _charge(gw: Gateway, api: Api, principal: Principal, model: str, tail: bytes,
            num_counted_prompt_tokens: int, num_output_tokens: int) -> None:
    """Book a request a backend answered: the engine's prompt and cached tokens when its
    usage said them, else the gateway's count (and none cached)."""
    usage = gw.usage
    if not usage.is_enabled:
        return
    reported_prompt, reported_cached = api.reported_usage(tail) if tail else (None, None)
    prompt = num_counted_prompt_tokens if reported_prompt is None else reported_prompt
    cached = min(prompt, reported_cached or 0)
    tenant = principal.tenant.id
    cost = usage.charge(tenant, principal.key.id, model, prompt_tokens=prompt,
                        cached_tokens=cached, output_tokens=num_output_tokens)
    gw.metrics.observe_charge(tenant, model, usage.settings.currency, prompt, cached,
                              num_output_tokens, cost)


async def _read_json_body(request: web.Request, gw: Gateway) -> bytes:
    content_type = request.headers.get("Content-Type")
    if content_type is not None:
        media = content_type.partition(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise APIError(
                415,
                f"Unsupported Content-Type {media!r}: send the body as JSON with "
                "'Content-Type: application/json'.",
                code="unsupported_media_type",
            )
    limit = gw.settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    timeout_s = gw.settings.listen.body_timeout_s
    try:
        content = request.content
        if content.is_eof():  # all of it came with the head: taken as it is, no waiting
            body = content.read_nowait()
            if len(body) > limit:  # chunked, so no Content-Length said so before
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
            return body
        async with asyncio.timeout(timeout_s):
            return await request.read()  # aiohttp inflates gzip and deflate bodies as it reads
    except TimeoutError:
        raise APIError(408, f"The request body did not arrive within {timeout_s:g} s; send it "
                       "at once, complete.", type="invalid_request_error",
                       code="request_timeout") from None
    except web.RequestPayloadError as exc:
        raise unreadable_body(exc, encoding) from None


async def _forward(
    request: web.Request, gw: Gateway, route: str, parsed: CompletionRequest, raw: bytes,
    plan: RoutePlan, ticket: QuotaTicket, admitted: Admitted, served: str,
) -> web.StreamResponse:
    router = gw.router
    trace = request[REQUEST_TRACE]
    max_attempts = 2 if gw.settings.upstream.retry_before_first_byte else 1
    routed_s = time.perf_counter()
    ranked = router.rank(plan, max_ranked=max_attempts)
    trace.routed(routed_s, ranked, plan.request.num_prompt_tokens)
    if not ranked:
        raise APIError.unavailable(
            f"No healthy backend serves {served!r} right now; retry shortly.", 2
        )
    gw.metrics.observe_routing(plan.request.num_prompt_tokens, ranked[0][1].expected_cached_tokens)
    headers = {"Content-Type": "application/json", "X-Request-Id": request[REQUEST_ID]}
    for name in _FORWARDED_HEADERS:
        value = request.headers.get(name)
        if value is not None:
            headers[name] = value
    trace.inject(headers)
    failure: UpstreamFailure | None = None
    opened: Opened | None = None
    first_sent_s = time.perf_counter()
    for index, (backend, choice) in enumerate(ranked[:max_attempts]):
        if index:
            gw.metrics.retries.inc()
        router.started(backend, plan, choice.expected_cached_tokens)
        sent_s = time.perf_counter()
        try:
            opened = await gw.upstream.open(
                backend, ROUTE_PATHS[route], raw, headers, is_stream=parsed.is_stream,
                timer=trace.waited,
            )
        except UpstreamFailure as exc:
            router.finished(backend, plan, had_first_token=False)
            failure = exc
            gw.metrics.upstream_errors.labels(backend.name, exc.reason).inc()
            if exc.reason == "connect":
                backend.mark_failure(str(exc))
            if exc.reason not in ("pool_timeout", "backend_down"):  # busy, or already out
                failed_on(gw, backend, exc.reason)
            continue
        except BaseException:
            router.finished(backend, plan, had_first_token=False)
            raise
        status = opened.response.status
        malformed = _malformed(parsed, opened)
        if malformed is not None:
            router.finished(backend, plan, had_first_token=False)
            gw.metrics.upstream_errors.labels(backend.name, malformed[0]).inc()
            failed_on(gw, backend, malformed[0])
            opened.response.close()
            opened = None
            failure = UpstreamFailure(backend, malformed[0], malformed[1])
            continue
        if status >= 500:
            failed_on(gw, backend, f"http_{status}")
        else:
            gw.registry.request_succeeded(
                backend, time.monotonic(),
                time.perf_counter() - sent_s if parsed.is_stream and status == 200 else None)
        if status in RETRYABLE_STATUSES and index + 1 < len(ranked):
            router.finished(backend, plan, had_first_token=False)
            gw.metrics.upstream_errors.labels(backend.name, f"http_{opened.response.status}").inc()
            opened.response.close()
            opened = None
            continue
        break
    if opened is None:
        assert failure is not None
        if failure.is_timeout:
            raise APIError.gateway_timeout(f"Upstream timeout: {failure}.")
        raise APIError.bad_gateway(f"Upstream failed: {failure}.")
    upstream = opened.response
    is_sse = parsed.is_stream and upstream.status == 200 and \
        upstream.content_type == "text/event-stream"
    trace.responded(opened.backend.name, first_sent_s, index + 1, is_sse)
    if is_sse:
        router.first_token(opened.backend, plan)
        gw.slo.observe_first_token(admitted, opened.backend.name, plan.snapshot,
                                   plan.pending_prefill_tokens, time.perf_counter() - sent_s)
    api = API_OF_ROUTE[route]
    try:
        if is_sse:
            ending_at = _ending_at_events(parsed, plan, api)
            on_ending = (None if ending_at is None
                         else functools.partial(_stream_ending, gw, opened.backend, plan))
            return await relay_stream(request, gw, opened, ticket, served, ending_at, on_ending,
                                       api)
        return await relay_body(request, gw, route, opened, ticket, served)
    finally:
        if upstream.status == 200:
            usage = api.cache_usage(trace.tail)
            if usage is not None:
                router.learn(opened.backend, plan, *usage)
        router.finished(opened.backend, plan, had_first_token=is_sse)
        opened.response.close()


_SSE_FIELDS = (b"data:", b":", b"event:", b"id:", b"retry:")


def _malformed(parsed: CompletionRequest, opened: Opened) -> tuple[str, str] | None:
    """(reason, message) when a 200 is not what it says, judged before the client sees a
    byte so that the request can go elsewhere: a stream whose first bytes are no SSE field,
    or a JSON body that does not parse."""
    response = opened.response
    if response.status != 200:
        return None
    name = opened.backend.name
    if parsed.is_stream and response.content_type == "text/event-stream":
        if not opened.first_chunk.lstrip(b"\r\n ").startswith(_SSE_FIELDS):
            return "bad_sse", (f"backend {name!r} answered a stream whose first bytes are not "
                               "server-sent events")
        return None
    if "json" in response.content_type and response.is_eof():
        try:
            orjson.loads(opened.first_chunk)
        except orjson.JSONDecodeError:
            return "bad_json", f"backend {name!r} answered 200 with a body that is not JSON"
    return None


def _ending_at_events(parsed: CompletionRequest, plan: RoutePlan, api: Api = OPENAI
                      ) -> int | None:
    """The SSE event count at which a stream has at most one token left, so that its slot
    can take the next request (``Router.nearly_done``); None when that is not known.

    A chat stream's first event carries the role, then one event per token: its
    ``max_tokens``-th event leaves one token to come. A completions stream has no role
    event, so that count comes with its last token, as it ends. An engine that puts several
    tokens in one event (speculative decoding) reaches the count later, never earlier; ``n``
    choices interleave ``n`` streams, so only a single choice is counted. Messages and
    Responses streams send ``api.num_lead_events`` events before their first token."""
    max_tokens = plan.request.max_tokens
    num_choices = parsed.body.get("n")
    if max_tokens is None or max_tokens < 1 or num_choices not in (None, 1):
        return None
    return max_tokens if api.is_openai else max_tokens + api.num_lead_events - 1


def _stream_ending(gw: Gateway, backend: Backend, plan: RoutePlan) -> None:
    gw.router.nearly_done(backend, plan)
    gw.slo.stream_ending()


