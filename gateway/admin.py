"""The admin API under /admin: tenants and keys. Only the admin token opens it.

    POST   /admin/tenants              create        GET /admin/tenants            list
    GET    /admin/tenants/{id}         get           PATCH /admin/tenants/{id}     update
    DELETE /admin/tenants/{id}         disable
    POST   /admin/keys                 create (the plaintext key is in this response only)
    POST   /admin/keys/import          store an operator-supplied key (never echoed back)
    GET    /admin/keys?tenant_id=T     list          GET /admin/keys/{id}          get
    DELETE /admin/keys/{id}            revoke
    GET    /admin/usage?tenant=T&from=F&to=T2&group_by=key|model|tenant
                                       requests, tokens and cost (gateway/usage.py)
    GET    /admin/fleet                every backend as routing sees it
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from backends.fleet.registry import Backend
from gateway.context import GATEWAY, Gateway
from gateway.errors import APIError, unreadable_body
from gateway.tenancy import (
    ALL_MODELS,
    TENANT_ID_RE,
    Limits,
    Tenant,
    imported_key_problem,
    weight_problem,
)
from gateway.usage import BUCKET_S, MAX_QUERY_BUCKETS, UsageRow, totals

routes = web.RouteTableDef()


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LimitsBody(_Body):
    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)


class _WeightBody(_Body):
    @field_validator("weight", mode="before", check_fields=False)
    @classmethod
    def _check_weight(cls, value: object) -> object:
        problem = None if value is None else weight_problem(value)
        if problem is not None:
            raise PydanticCustomError("weight", problem)
        return value


class TenantCreate(_WeightBody):
    id: str | None = Field(None, pattern=TENANT_ID_RE.pattern)
    name: str = Field(min_length=1, max_length=200)
    tier: str | None = None
    models: list[str] = Field(default_factory=lambda: [ALL_MODELS])
    limits: LimitsBody | None = None
    enabled: bool = True
    weight: float = 1.0


class TenantUpdate(_WeightBody):
    name: str | None = Field(None, min_length=1, max_length=200)
    tier: str | None = None
    models: list[str] | None = None
    limits: LimitsBody | None = None
    enabled: bool | None = None
    weight: float | None = None


class KeyCreate(_Body):
    tenant_id: str
    name: str = Field("", max_length=200)
    expires_at: float | None = Field(None, description="unix time")
    expires_in_s: float | None = Field(None, gt=0)
    tier: str | None = None


class KeyImport(KeyCreate):
    key: SecretStr


def _admin(request: web.Request) -> Gateway:
    gw = request.config_dict[GATEWAY]
    token = gw.settings.admin_token
    if token is None:
        raise APIError.forbidden(
            "The admin API is disabled: set admin_token in the configuration or "
            "SWITCHYARD_ADMIN_TOKEN.", code="admin_disabled",
        )
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if presented.startswith("sy-"):
        raise APIError.forbidden("Tenant API keys cannot call the admin API.", code="not_admin")
    expected = token.get_secret_value().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), expected):
        raise APIError.unauthorized("Invalid admin token.", code="invalid_admin_token")
    return gw


async def _body(request: web.Request, model: type[_Body]) -> Any:
    try:
        raw = await request.read()
    except web.RequestPayloadError as exc:
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        raise unreadable_body(exc, encoding) from None
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        prefix = f"Invalid '{where}': " if where else "Invalid body: "
        raise APIError.bad_request(prefix + first["msg"], param=where) from None


def _check_tier(gw: Gateway, tier: str | None) -> None:
    if tier is not None and tier not in gw.settings.tier_names:
        raise APIError.bad_request(
            f"Unknown tier {tier!r}; configured tiers: {', '.join(gw.settings.tier_names)}.",
            param="tier",
        )


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@routes.post("/admin/tenants")
async def create_tenant(request: web.Request) -> web.Response:
    gw = _admin(request)
    body: TenantCreate = await _body(request, TenantCreate)
    _check_tier(gw, body.tier)
    limits = Limits(**body.limits.model_dump()) if body.limits else Limits(
        **gw.settings.default_limits.model_dump()
    )
    try:
        tenant = await gw.store.create_tenant(
            name=body.name, tier=body.tier or gw.settings.default_tier, models=body.models,
            limits=limits, tenant_id=body.id, enabled=body.enabled, weight=body.weight,
        )
    except KeyError:
        raise APIError(409, f"Tenant {body.id!r} already exists.", code="conflict") from None
    return _json(tenant.to_json(), 201)


@routes.get("/admin/tenants")
async def list_tenants(request: web.Request) -> web.Response:
    gw = _admin(request)
    tenants = await gw.store.list_tenants()
    return _json({"object": "list", "data": [t.to_json() for t in tenants]})


async def _tenant_or_404(gw: Gateway, tenant_id: str) -> Any:
    tenant = await gw.store.get_tenant(tenant_id)
    if tenant is None:
        raise APIError.not_found(f"No tenant {tenant_id!r}.", param="tenant_id")
    return tenant


@routes.get("/admin/tenants/{tenant_id}")
async def get_tenant(request: web.Request) -> web.Response:
    gw = _admin(request)
    tenant = await _tenant_or_404(gw, request.match_info["tenant_id"])
    return _json(tenant.to_json())


@routes.patch("/admin/tenants/{tenant_id}")
async def update_tenant(request: web.Request) -> web.Response:
    gw = _admin(request)
    tenant_id = request.match_info["tenant_id"]
    body: TenantUpdate = await _body(request, TenantUpdate)
    for field in sorted(body.model_fields_set):
        if getattr(body, field) is None:  # a stored null would break the tenant record
            raise APIError.bad_request(
                f"Invalid '{field}': it may not be null; leave it out to keep its value.",
                param=field,
            )
    _check_tier(gw, body.tier)
    changes = body.model_dump(exclude_unset=True, exclude={"limits"})
    if body.limits is not None:
        changes["limits"] = Limits(**body.limits.model_dump())
    tenant = await gw.store.update_tenant(tenant_id, **changes)
    if tenant is None:
        raise APIError.not_found(f"No tenant {tenant_id!r}.", param="tenant_id")
    return _json(tenant.to_json())


@routes.delete("/admin/tenants/{tenant_id}")
async def disable_tenant(request: web.Request) -> web.Response:
    gw = _admin(request)
    tenant_id = request.match_info["tenant_id"]
    tenant = await gw.store.update_tenant(tenant_id, enabled=False)
    if tenant is None:
        raise APIError.not_found(f"No tenant {tenant_id!r}.", param="tenant_id")
    return _json(tenant.to_json())


async def _key_tenant(gw: Gateway, body: KeyCreate) -> Tenant:
    """The tenant a new key is for, after checking the key's tier against it."""
    tenant: Tenant = await _tenant_or_404(gw, body.tenant_id)
    _check_tier(gw, body.tier)
    if body.tier is not None:
        priority = {t.name: t.priority for t in gw.settings.tiers}
        if priority[body.tier] < priority.get(tenant.tier, 0):
            raise APIError.bad_request(
                f"A key may narrow its tenant's tier ({tenant.tier!r}) but not raise it to "
                f"{body.tier!r}.", param="tier",
            )
    return tenant


def _expires_at(body: KeyCreate) -> float | None:
    if body.expires_in_s is not None:
        return time.time() + body.expires_in_s
    return body.expires_at


@routes.post("/admin/keys")
async def create_key(request: web.Request) -> web.Response:
    gw = _admin(request)
    body: KeyCreate = await _body(request, KeyCreate)
    tenant = await _key_tenant(gw, body)
    record, plaintext = await gw.store.create_key(
        tenant.id, name=body.name, expires_at=_expires_at(body), tier=body.tier
    )
    return _json({**record.to_json(), "key": plaintext}, 201)


@routes.post("/admin/keys/import")
async def import_key(request: web.Request) -> web.Response:
    """Store the digest of a key the operator supplies; the response never holds the key."""
    gw = _admin(request)
    body: KeyImport = await _body(request, KeyImport)
    plaintext = body.key.get_secret_value()
    problem = imported_key_problem(plaintext)
    if problem is not None:
        raise APIError.bad_request(f"Invalid 'key': the key {problem}.", param="key")
    tenant = await _key_tenant(gw, body)
    try:
        record = await gw.store.import_key(
            tenant.id, plaintext, name=body.name, expires_at=_expires_at(body), tier=body.tier
        )
    except KeyError as exc:
        what = "This key's id" if plaintext.startswith("sy-") else "This key"
        raise APIError(
            409, f"{what} is already stored, as key {exc.args[0]!r}; a key is stored once, "
            "even after it is revoked, so import a different one.", code="conflict", param="key",
        ) from None
    return _json(record.to_json(), 201)


@routes.get("/admin/keys")
async def list_keys(request: web.Request) -> web.Response:
    gw = _admin(request)
    tenant_id = request.query.get("tenant_id")
    tenant_ids = [tenant_id] if tenant_id else [t.id for t in await gw.store.list_tenants()]
    keys = [k.to_json() for tid in tenant_ids for k in await gw.store.list_keys(tid)]
    return _json({"object": "list", "data": keys})


@routes.get("/admin/keys/{key_id}")
async def get_key(request: web.Request) -> web.Response:
    gw = _admin(request)
    key = await gw.store.get_key(request.match_info["key_id"])
    if key is None:
        raise APIError.not_found(f"No key {request.match_info['key_id']!r}.", param="key_id")
    return _json(key.to_json())


@routes.delete("/admin/keys/{key_id}")
async def revoke_key(request: web.Request) -> web.Response:
    gw = _admin(request)
    key = await gw.store.revoke_key(request.match_info["key_id"])
    if key is None:
        raise APIError.not_found(f"No key {request.match_info['key_id']!r}.", param="key_id")
    return _json(key.to_json())


def _profile_json(backend: Backend) -> dict[str, Any]:
    """Each profile field with its value and where it came from (None: nobody said)."""
    profile = backend.profile
    values = {**asdict(profile), "kv_capacity_tokens": profile.kv_capacity_tokens}
    sources = backend.profile_sources
    fields = {name: {"value": value, "source": sources.get(name)}
              for name, value in values.items()}
    if "kv_capacity_tokens" in sources:
        fields["num_kv_blocks"]["source"] = sources["kv_capacity_tokens"]
    return fields


def _prefix_cache_json(backend: Backend, ttl_for: Callable[[str], float]) -> dict[str, Any]:
    """Expected against reported cached tokens of its responses, and its claim lifetime."""
    feedback = backend.cache_feedback
    expected, reported = feedback.hit_ratios()
    return {"num_responses": feedback.num_responses,
            "expected_hit_ratio": round(expected, 4), "reported_hit_ratio": round(reported, 4),
            "approx_claim_ttl_s": round(ttl_for(backend.name), 3),
            "is_affinity_broken": feedback.is_broken()}


@routes.get("/admin/fleet")
async def get_fleet(request: web.Request) -> web.Response:
    """Every backend as routing sees it now: membership source, health, load and its age."""
    gw = _admin(request)
    now_s = time.monotonic()
    data = []
    for backend in gw.registry.backends:
        state = backend.state(now_s)
        data.append({
            "name": backend.name, "url": backend.url, "models": sorted(backend.models),
            "source": backend.source, "is_healthy": backend.is_healthy,
            "last_error": backend.last_error or None,
            "load_age_s": round(state.age_s, 3) if state.age_s != float("inf") else None,
            "num_running": backend.num_running, "num_waiting": backend.num_waiting,
            "kv_usage": backend.kv_usage,
            "num_queued_prefill_tokens": backend.num_queued_prefill_tokens,
            "num_prefix_kv_blocks": backend.num_prefix_kv_blocks,
            "num_in_flight": backend.num_in_flight, "num_ending": backend.num_ending,
            "peer_in_flight": backend.peer_in_flight, "peer_ending": backend.peer_ending,
            "load_source": backend.load_source,
            "breaker": {"state": backend.breaker.state, "reason": backend.breaker.reason or None,
                        "num_ejections": backend.breaker.num_ejections_total},
            "profile": _profile_json(backend),
            "prefix_cache": _prefix_cache_json(backend, gw.router.approx_index.ttl_for),
        })
    return _json({"object": "list", "routing_profile": gw.router.profile.name, "data": data})


USAGE_GROUPS = ("key", "model", "tenant")
MAX_INSTANT_S = 253_402_297_200  # 9999-12-31T23:00:00Z: the last hour whose end is a date


def _instant(request: web.Request, name: str, default_s: float) -> float:
    """A query bound: Unix seconds, or an ISO 8601 date or time (UTC unless it says)."""
    text = request.query.get(name)
    if text is None or not text.strip():
        return default_s
    text = text.strip()
    try:
        value = float(text)
    except ValueError:
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise APIError.bad_request(
                f"Invalid {name!r}: {text[:64]!r} is neither Unix seconds nor an ISO 8601 "
                "time; send e.g. 1764756000 or 2026-12-03T10:00:00Z.", param=name) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        value = moment.timestamp()
    if not math.isfinite(value) or not 0 <= value < MAX_INSTANT_S:
        raise APIError.bad_request(
            f"Invalid {name!r}: {text[:64]!r} is not between 1970 and 9999.", param=name)
    return value


def _grouped(rows: list[UsageRow], group_by: str) -> list[UsageRow]:
    """Rows per (tenant, key, model) summed over what ``group_by`` leaves out."""
    if group_by == "key":
        return rows
    merged: dict[tuple[str, str], UsageRow] = {}
    for row in rows:
        name = (row.tenant, row.model if group_by == "model" else "*")
        target = merged.get(name)
        if target is None:
            target = merged[name] = UsageRow(row.tenant, "*", name[1])
        for kind in ("requests", "prompt_tokens", "cached_tokens", "output_tokens",
                     "cost_nano"):
            target.add(kind, getattr(row, kind))
    return list(merged.values())


@routes.get("/admin/usage")
async def get_usage(request: web.Request) -> web.Response:
    """Requests, tokens and cost per tenant, key and model over ``[from, to)`` (default: the
    last 24 hours), in hourly buckets: the bounds are widened to whole hours."""
    gw = _admin(request)
    now_s = time.time()
    to_s = _instant(request, "to", now_s)
    from_s = _instant(request, "from", to_s - 86_400)
    if from_s >= to_s:
        raise APIError.bad_request("'from' must be before 'to'.", param="from")
    if (to_s - from_s) / BUCKET_S > MAX_QUERY_BUCKETS:
        raise APIError.bad_request(
            f"The range is over {MAX_QUERY_BUCKETS // 24} days; ask for a shorter one.",
            param="from")
    group_by = request.query.get("group_by", "key")
    if group_by not in USAGE_GROUPS:
        raise APIError.bad_request(
            f"Invalid 'group_by' {group_by[:32]!r}; one of: {', '.join(USAGE_GROUPS)}.",
            param="group_by")
    tenant_id = request.query.get("tenant")
    if tenant_id:
        tenant_ids = [(await _tenant_or_404(gw, tenant_id)).id]
    else:
        tenant_ids = [t.id for t in await gw.store.list_tenants()]
    usage = gw.usage
    await usage.flush()  # this replica's last charges first: a query here sees them
    rows = _grouped(await usage.query(tenant_ids, from_s, to_s), group_by)
    model = request.query.get("model")
    if model:
        rows = [r for r in rows if r.model == model]
    key_id = request.query.get("key_id")
    if key_id and group_by == "key":
        rows = [r for r in rows if r.key_id == key_id]
    currency = usage.settings.currency
    first_s = from_s // BUCKET_S * BUCKET_S
    last_s = math.ceil(to_s / BUCKET_S) * BUCKET_S
    return _json({
        "object": "usage",
        "from": _iso(first_s), "to": _iso(last_s), "group_by": group_by,
        "tenant": tenant_id or None,
        "data": [r.as_json(currency) for r in rows],
        "total": {k: v for k, v in totals(rows).as_json(currency).items()
                  if k not in ("tenant", "key_id", "model")},
        "flush_interval_s": usage.settings.flush_interval_s,
    })


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
