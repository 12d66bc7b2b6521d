"""The app factory: ``create_app(settings)`` wires the subsystems, each through one cleanup_ctx.

Example::

    app = create_app(load_settings("switchyard.yaml"))
    web.run_app(app)  # or gateway.server.serve(settings), which adds graceful draining
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Iterator

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractMatchInfo
from aiohttp.web_urldispatcher import MatchInfoError

from admission.fair_queue import FairQueueConfig
from admission.quota.types import QuotaStoreLike
from admission.waiting_room import SloAdmission
from backends.fleet.approx_sync import ApproxIndexSync
from backends.fleet.breaker import BreakerConfig
from backends.fleet.health import HealthChecker
from backends.fleet.peer_load import PeerLoad
from backends.fleet.registry import BackendRegistry
from backends.fleet.scrape_share import FRESH_SHARE, ScrapeShare
from backends.fleet.sync import SCRAPE_INTERVAL_S, FleetSync
from backends.fleet.upstream import UpstreamClient
from backends.redis_url import REDIS_ERRORS
from gateway import admin, handlers, openapi, proxy
from gateway.context import GATEWAY, Gateway
from gateway.errors import APIError
from gateway.front import Handler, error_response, new_request_id, with_front
from gateway.observe.hooks import admin_waits, setup_telemetry
from gateway.observe.memory import HeapTrimmer
from gateway.observe.metrics import GatewayMetrics, counter_family, gauge_family
from gateway.observe.request_log import RequestLog
from gateway.reload import admin_reload, backend_from_settings
from gateway.router import Router
from gateway.settings import RoutingSettings, Settings
from gateway.state import open_state
from gateway.usage import UsageBook
from routing.aliases import ModelAliases
from routing.index_approx import ApproxPrefixIndex
from routing.index_exact import ExactPrefixIndex
from routing.plugins.pickers import RoundRobinPicker
from routing.profile import SchedulingProfile, build_profile
from routing.profiles import profile_by_name

log = logging.getLogger(__name__)

def create_app(settings: Settings) -> web.Application:
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        handler_args={"max_field_size": 16_384, "max_line_size": 16_384},
    )
    setup_gateway(app, settings)
    setup_telemetry(app)
    setup_routes(app)
    return app


def setup_routes(app: web.Application) -> None:
    routes: list[tuple[str, str, Handler]] = [
        ("POST", "/v1/chat/completions", proxy.chat_completions),
        ("POST", "/v1/completions", proxy.completions),
        ("POST", "/v1/messages", proxy.messages),
        ("POST", "/v1/messages/count_tokens", proxy.count_tokens),
        ("POST", "/v1/responses", proxy.responses),
        ("POST", "/v1/embeddings", proxy.embeddings),
        ("POST", "/tokenize", proxy.tokenize),
        ("POST", "/detokenize", proxy.detokenize),
        ("GET", "/v1/models", handlers.list_models),
        ("GET", "/v1/models/{model}", handlers.get_model),
        ("GET", "/healthz", handlers.healthz),
        ("GET", "/readyz", handlers.readyz),
        ("GET", "/metrics", handlers.metrics),
        ("GET", "/openapi.json", openapi.serve_document),
        ("GET", "/admin/waits", admin_waits),
        ("POST", "/admin/reload", admin_reload),
    ]
    routes += [(r.method, r.path, r.handler) for r in admin.routes
               if isinstance(r, web.RouteDef)]
    for method, path, handler in routes:
        app.router.add_route(method, path, with_front(handler), expect_handler=_expect)
    # A path no route matches, or a method its route does not take, is answered by a route
    # aiohttp makes per request, which raises its 404 or 405 and has aiohttp's plain-text 417
    # for an unusual Expect: ``front`` and ours instead.
    resolve = app.router.resolve

    async def resolve_with_expect(request: web.Request) -> AbstractMatchInfo:
        match_info = await resolve(request)
        if isinstance(match_info, MatchInfoError):
            route = match_info.route
            route._expect_handler = _expect
            route._handler = with_front(route._handler)  # type: ignore[assignment]
        return match_info

    app.router.resolve = resolve_with_expect  # type: ignore[method-assign,assignment]


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` as aiohttp answers it; any other expectation gets an
    OpenAI-format 417 (aiohttp's own is plain text, sent before any middleware runs)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() == "100-continue":
        if request.version == aiohttp.HttpVersion11:
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # the body's head has not started yet
        return None
    response = error_response(request, APIError(
        417, f"Unsupported 'Expect: {expect[:64]}' header: the only expectation supported is "
        "'Expect: 100-continue'; drop the header or send that.", code="expectation_failed",
    ))
    response.headers["x-request-id"] = new_request_id()
    return response


def setup_gateway(app: web.Application, settings: Settings) -> None:
    """State (Redis or memory: key store, auth cache, quotas), upstream pool, health checks
    and fleet sync: up before serving."""

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        backends = [backend_from_settings(b) for b in settings.backends]
        registry = BackendRegistry(
            backends, breaker=BreakerConfig(**settings.upstream.breaker.model_dump()))
        state = open_state(settings)
        redis, quotas = state.redis, state.quotas
        upstream = UpstreamClient(settings.upstream)
        await upstream.start()
        metrics = GatewayMetrics([b.name for b in backends])
        router = make_router(settings.routing, registry,
                             default_output_tokens=settings.admission.default_output_tokens)
        admission = settings.admission
        slo = SloAdmission(
            settings.tiers, router, is_enabled=admission.slo_enabled,
            headroom_factor=admission.headroom_factor,
            headroom_max_share=admission.headroom_max_share,
            queue_config=FairQueueConfig(lower_tier_share=admission.lower_tier_share,
                                         max_total=admission.max_queue_len,
                                         max_per_tier=admission.max_queue_len),
        )
        metrics.add_source(lambda: _admission_metrics(slo))
        metrics.add_source(lambda: _quota_metrics(quotas))
        metrics.add_source(lambda: _prefix_cache_metrics(registry, router))
        log_settings = settings.request_log
        app[GATEWAY] = Gateway(
            settings=settings, registry=registry, metrics=metrics, redis=redis, store=state.store,
            auth=state.auth, upstream=upstream, router=router, quotas=quotas, slo=slo,
            request_log=RequestLog(log_settings.mode, log_settings.sample_rate,
                                   log_settings.path, include_prompt=log_settings.include_prompt,
                                   prompt_max_chars=log_settings.prompt_max_chars,
                                   route_detail=log_settings.route_detail),
            usage=(usage := UsageBook(redis, settings.usage)),
            aliases=ModelAliases([alias.to_alias() for alias in settings.aliases]),
        )
        metrics.add_source(lambda: _usage_metrics(usage))
        checker = HealthChecker(
            registry, upstream.session, interval_s=settings.upstream.health_interval_s,
            timeout_s=settings.upstream.health_timeout_s,
        )
        await checker.probe_all()  # know the fleet before the first request
        tasks = [
            asyncio.create_task(slo.run_dispatcher(), name="admission-dispatcher"),
            asyncio.create_task(checker.run(), name="health-checks"),
            asyncio.create_task(usage.run(), name="usage-flush"),
            asyncio.create_task(HeapTrimmer().run(), name="heap-trim"),
        ]
        scrapes: ScrapeShare | None = None  # the replicas' shared /metrics scrapes
        if redis is not None:  # in memory there is one replica: nothing to share or hear
            tasks.append(asyncio.create_task(state.auth.listen_for_invalidations(),
                                             name="auth-invalidation"))
            replica_id = new_request_id()
            if settings.routing.share_scrapes:
                scrapes = ScrapeShare(replica_id, fresh_s=FRESH_SHARE * SCRAPE_INTERVAL_S)
            approx_sync = ApproxIndexSync(redis, router.approx_index, replica_id,
                                          ttl_s=settings.routing.approx_ttl_s,
                                          peers=PeerLoad(registry, replica_id),
                                          push_interval_s=settings.routing.share_push_ms / 1000,
                                          lazy_interval_s=settings.routing.share_lazy_ms / 1000,
                                          scrapes=scrapes)
            router.on_record = approx_sync.record
            router.on_lesson = approx_sync.lesson
            router.on_booked = approx_sync.notify
            router.urgent_prefill_tokens = settings.routing.share_urgent_prefill_tokens
            try:
                await approx_sync.catch_up()
            except REDIS_ERRORS as exc:
                log.warning("approximate index: cannot catch up from Redis yet: %s", exc)
            tasks.append(asyncio.create_task(approx_sync.run(), name="approx-index-sync"))
        discover_workers = settings.routing.discover_workers and redis is not None
        fleet = FleetSync(registry, redis, upstream.session, index=router.exact_index,
                          scrape_interval_s=SCRAPE_INTERVAL_S,
                          discover_workers=discover_workers, scrapes=scrapes)
        metrics.add_source(lambda: _scrape_metrics(fleet, scrapes))
        if discover_workers:
            await fleet.poll_members_once()  # workers already beating are known at start
        await fleet.first_look()  # listed engines' load source and profile, before serving
        tasks += fleet.start()
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            # Bounded: a task that swallows its cancellation (a client library's retry loop,
            # say) must not keep the process from exiting.
            _, stuck = await asyncio.wait(tasks, timeout=2.0)
            for task in stuck:
                log.warning("background task %s did not stop within 2 s of shutdown",
                            task.get_name())
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    log.warning("background task %s failed: %r", task.get_name(),
                                task.exception())
            await upstream.close()
            app[GATEWAY].request_log.close()
            await state.aclose()

    app.cleanup_ctx.append(lifecycle)


def _scrape_metrics(fleet: FleetSync, scrapes: ScrapeShare | None) -> Iterator[object]:
    """The listed engines' load figures this replica read itself and those it took from the
    other replicas' scrapes (``routing.share_scrapes``)."""
    yield counter_family(
        "switchyard_fleet_scrapes",
        "Listed engines' /metrics figures: read by this replica, or heard from another's scrape.",
        "how", {"read": float(fleet.num_scrapes_read),
                "heard": float(scrapes.num_heard if scrapes is not None else 0)})


def _prefix_cache_metrics(registry: BackendRegistry, router: Router) -> Iterator[object]:
    """Per backend: prompt tokens of responses that reported their cache use, the cached
    tokens routing expected there and those the engine reported, and the approximate index's
    claim lifetime (shortened by reported misses). And the router's per-prompt caches, each
    against its bound."""
    yield gauge_family("switchyard_router_segment_cache_bytes",
                       "Bytes of token ids the router's segment cache holds (bounded).",
                       None, float(router.segment_cache_bytes))
    yield gauge_family("switchyard_router_approx_index_blocks",
                       "Prefix blocks the approximate index holds (bounded by max_entries).",
                       None, float(len(router.approx_index)))
    backends = registry.backends
    for name, help_text, attribute in (
            ("switchyard_backend_reported_prompt_tokens",
             "Prompt tokens of responses that reported their cached tokens.", "num_prompt_tokens"),
            ("switchyard_backend_expected_cached_tokens",
             "Cached prompt tokens routing expected on the backend (those responses).",
             "num_expected_cached_tokens"),
            ("switchyard_backend_reported_cached_tokens",
             "Cached prompt tokens the backend reported (usage.prompt_tokens_details).",
             "num_reported_cached_tokens")):
        yield counter_family(name, help_text, "backend",
                             {b.name: float(getattr(b.cache_feedback, attribute))
                              for b in backends})
    yield gauge_family("switchyard_backend_approx_claim_ttl_seconds",
                       "How long the approximate prefix index trusts the backend's claims.",
                       "backend", {b.name: router.approx_index.ttl_for(b.name) for b in backends})


def _admission_metrics(slo: SloAdmission) -> Iterator[object]:
    """Queue lengths, refusals by reason code, the predictor's error: read at scrape time."""
    yield gauge_family("switchyard_admission_queue_length",
                       "Requests waiting in the gateway's admission queue.", "tier",
                       {name: float(n) for name, n in slo.queue.lengths().items()})
    yield counter_family("switchyard_admission_rejections",
                         "Requests refused by SLO admission, by reason.", "reason",
                         {k: float(v) for k, v in slo.num_rejected.items()})
    yield counter_family("switchyard_admission_queued",
                         "Requests that waited in the admission queue.", None,
                         float(slo.num_queued))
    yield counter_family("switchyard_admission_retry_tickets_issued",
                         "Refusals whose return was booked (admission/retry_book.py).",
                         None, float(slo.retries.num_issued))
    yield counter_family("switchyard_admission_retry_tickets_redeemed",
                         "Refused requests that came back in their booked window and "
                         "waited at the front of their tier's queue.", None,
                         float(slo.retries.num_redeemed))
    errors = slo.predictor.error_stats()
    yield gauge_family("switchyard_ttft_predictor_mape",
                       "Mean absolute percentage error of recent TTFT predictions.", None,
                       errors.mape)
    yield gauge_family("switchyard_ttft_predictor_bias_seconds",
                       "Mean predicted minus observed TTFT over recent predictions.", None,
                       errors.bias_s)


def _usage_metrics(usage: UsageBook) -> Iterator[object]:
    yield gauge_family("switchyard_usage_unsent_fields",
                       "Usage charge fields waiting for Redis (flushed every flush_interval_s).",
                       None, float(usage.num_pending_fields))
    yield counter_family("switchyard_usage_flush_failures",
                         "Usage flushes that could not reach Redis (retried).",
                         None, float(usage.num_flush_failures))
    yield counter_family("switchyard_usage_dropped_fields",
                         "Usage charge fields dropped after waiting too long for Redis.",
                         None, float(usage.num_dropped_fields))


def _quota_metrics(quotas: QuotaStoreLike) -> Iterator[object]:
    counters = quotas.counters()
    yield counter_family("switchyard_quota_checks", "Quota checks (one Redis script each).",
                         None, float(counters.get("num_acquires", 0)))
    yield counter_family("switchyard_quota_refusals", "Requests refused by tenant quotas.",
                         None, float(counters.get("num_refused", 0)))
    yield counter_family("switchyard_quota_fail_open",
                         "Requests admitted on local limits because Redis was unreachable.",
                         None, float(counters.get("num_fail_open", 0)))
    yield counter_family("switchyard_quota_fail_closed",
                         "Requests refused because Redis was unreachable (fail-closed).",
                         None, float(counters.get("num_fail_closed", 0)))
    yield counter_family("switchyard_quota_redis_round_trips",
                         "Redis round trips of the quota scripts (concurrent calls share one).",
                         None, float(counters.get("num_redis_round_trips", 0)))


def scheduling_profile(settings: RoutingSettings) -> SchedulingProfile:
    if settings.plugins is not None:
        profile = build_profile(settings.plugins, name="custom")
    else:
        profile = profile_by_name(settings.profile)
    if isinstance(profile.picker, RoundRobinPicker):
        profile.picker.start_at(secrets.randbelow(1 << 30))  # not in step with other replicas
    return profile


def make_router(
    settings: RoutingSettings, registry: BackendRegistry, *, default_output_tokens: int = 256
) -> Router:
    from backends.tokenizer import get_tokenizer

    return Router(
        registry,
        scheduling_profile(settings),
        ExactPrefixIndex(block_size=settings.block_size),
        ApproxPrefixIndex(ttl_s=settings.approx_ttl_s, max_entries=settings.approx_max_blocks,
                          block_tokens=max(1, settings.block_chars // 4)),
        {model: get_tokenizer(kind) for model, kind in settings.tokenizers.items()},
        block_chars=settings.block_chars,
        block_size=settings.block_size,
        max_age_s=settings.max_load_age_s,
        default_output_tokens=default_output_tokens,
        segment_cache_bytes=int(settings.segment_cache_mib * 1024 * 1024),
    )
