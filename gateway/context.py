"""The gateway's shared objects, kept on the app under one typed key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis
from aiohttp import web

from admission.quota.types import QuotaStoreLike
from admission.waiting_room import SloAdmission
from backends.fleet.http1 import Response
from backends.fleet.registry import BackendRegistry
from backends.fleet.upstream import UpstreamClient
from gateway.auth import Authenticator
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.request_log import RequestLog
from gateway.router import Router
from gateway.settings import Settings
from gateway.tenancy import KeyStoreLike
from gateway.usage import UsageBook
from routing.aliases import ModelAliases


@dataclass(slots=True)
class Gateway:
    settings: Settings
    registry: BackendRegistry
    metrics: GatewayMetrics
    redis: aioredis.Redis | None  # None: state in memory, a single replica
    store: KeyStoreLike
    auth: Authenticator
    upstream: UpstreamClient
    router: Router
    quotas: QuotaStoreLike
    slo: SloAdmission
    num_in_flight: int = 0
    is_draining: bool = False
    # The upstream responses of the streams being relayed: ended with an error event when a
    # drain's deadline passes (``gateway.server``).
    streams: set[Response] = field(default_factory=set)
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # draining, none in flight
    request_log: RequestLog = field(default_factory=RequestLog)  # off unless configured
    usage: UsageBook = field(default_factory=lambda: UsageBook(None))  # in memory unless set
    # Public model names standing for served ones (weighted targets, fallbacks).
    aliases: ModelAliases = field(default_factory=ModelAliases)


GATEWAY = web.AppKey("gateway", Gateway)
# The file the gateway was started from (`serve --config FILE`), which a reload reads again.
CONFIG_PATH = web.AppKey("switchyard_config_path", Path)
REQUEST_ID = web.RequestKey("switchyard_request_id", str)
# Set when the client went away before its response was complete (counted as 499).
CLIENT_LEFT = web.RequestKey("switchyard_client_left", bool)
