"""Gateway configuration: one YAML file, validated by pydantic, overridable by environment.

Every field can be overridden by a ``SWITCHYARD_*`` variable: the rest of the name, lower-cased,
with ``__`` between nesting levels (``SWITCHYARD_LISTEN__PORT=9000``,
``SWITCHYARD_REDIS_URL=redis://10.0.0.5:6379/0``). Values are parsed as YAML scalars or flow
collections, so ``SWITCHYARD_BACKENDS='[{name: a, url: "http://h:8000", models: [m]}]'`` works.

Example::

    settings = load_settings("switchyard.yaml")
    settings.backends[0].url  # "http://127.0.0.1:19001"
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic import model_validator as _model_validator

from backends.redis_url import (
    RedisUrlError,
    cluster_parts,
    is_cluster_url,
    is_sentinel_url,
    sentinel_parts,
)
from routing.aliases import Alias, alias_problems

ENV_PREFIX = "SWITCHYARD_"
# Read by the CLI wrappers (and SWITCHYARD_NATIVE at import, by routing.native, and
# SWITCHYARD_WORKER by scripts/setup.sh), not settings of the gateway.
_CLI_ONLY_VARIABLES = frozenset({"SWITCHYARD_CONFIG", "SWITCHYARD_URL", "SWITCHYARD_NATIVE",
                                 "SWITCHYARD_WORKER", "SWITCHYARD_SUPERVISOR_PID"})
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    header_timeout_s: float = Field(
        30.0, gt=0, description="a request's head must arrive within this (slow clients)")
    body_timeout_s: float = Field(
        60.0, gt=0, description="a request's body must arrive within this once its head has")
    keepalive_timeout_s: float = Field(
        75.0, gt=0, description="an idle keep-alive connection is closed after this")
    workers: int = Field(
        1, ge=1, le=256, description="gateway processes on this port (SO_REUSEPORT), each a "
        "replica sharing state through Redis (gateway/workers.py); one uses one core")


class BackendProfileSettings(_Strict):
    """What an engine can hold and do, as the operator states it. Each field left out is
    discovered where the engine exposes it (vLLM's ``/metrics`` and ``/v1/models``, SGLang's
    ``/get_server_info``, llama.cpp's ``/props``); a stated field always wins."""

    max_batch: int | None = Field(
        None, ge=1, description="sequences it runs at once (vLLM --max-num-seqs, SGLang "
        "--max-running-requests, llama.cpp --parallel)")
    kv_capacity_tokens: int | None = Field(None, ge=1, description="tokens its KV cache holds")
    block_size: int | None = Field(None, ge=1, le=4096, description="tokens per KV block")
    max_context_tokens: int | None = Field(None, ge=1, description="longest prompt + output")
    device: str | None = Field(None, max_length=128, description="e.g. nvidia-h100, cpu")
    prefill_tokens_per_s: float | None = Field(None, gt=0)
    relative_speed: float | None = Field(
        None, gt=0, le=1000, description="against the fleet's typical backend (1.0)")


class BackendSettings(_Strict):
    """One upstream engine (a vLLM / SGLang server, or a switchyard worker)."""

    name: str
    url: str
    models: list[str] = Field(min_length=1)
    weight: float = Field(1.0, gt=0)
    health_path: str = "/health"
    api_key: SecretStr | None = Field(None, description="bearer token the engine expects, if any")
    profile: BackendProfileSettings = BackendProfileSettings()
    discover_profile: bool = Field(
        True, description="read what the engine exposes of its profile (fields not stated)")

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-128 characters of letters, digits and ._:/-")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return check_backend_url(value)

    @field_validator("health_path")
    @classmethod
    def _check_path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


def check_backend_url(value: str) -> str:
    """``value`` without a trailing slash, or ValueError when it is not an engine's URL."""
    if not re.match(r"^https?://[^/\s]+(/[^\s]*)?$", value):
        raise ValueError("must be an http:// or https:// URL such as http://10.0.0.7:8000")
    return value.rstrip("/")


class AliasTargetSettings(_Strict):
    model: str = Field(description="a model the backends serve")
    weight: float = Field(1.0, gt=0, description="its share of the alias's requests, "
                          "relative to the other targets' weights")

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        return _check_model_name(value)


class AliasSettings(_Strict):
    """A public model name clients send, standing for served models: weighted targets
    (canaries) and fallbacks tried in order when the picked one cannot serve
    (``routing/aliases.py``)."""

    name: str
    targets: list[AliasTargetSettings] = Field(
        default_factory=list, description="default: the served model of the alias's own name")
    fallbacks: list[str] = Field(default_factory=list)

    @_model_validator(mode="before")
    @classmethod
    def _targets_as_names(cls, data: Any) -> Any:
        """``targets: [a, b]`` is ``targets: [{model: a}, {model: b}]`` (equal weights)."""
        if isinstance(data, dict) and isinstance(data.get("targets"), list):
            data = {**data, "targets": [{"model": t} if isinstance(t, str) else t
                                        for t in data["targets"]]}
        return data

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        return _check_model_name(value)

    @field_validator("fallbacks")
    @classmethod
    def _check_fallbacks(cls, value: list[str]) -> list[str]:
        return [_check_model_name(name) for name in value]

    def to_alias(self) -> Alias:
        targets = tuple((t.model, t.weight) for t in self.targets) or ((self.name, 1.0),)
        return Alias(self.name, targets, tuple(self.fallbacks))


def _check_model_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a model name: use 1-128 characters of letters, "
                         "digits and ._:/-")
    return value


class TierSettings(_Strict):
    """An SLO class. Admission control enforces the SLOs; here they are declared."""

    name: str
    priority: int = Field(ge=0)
    ttft_slo_ms: float = Field(gt=0)
    tpot_slo_ms: float = Field(200.0, gt=0)
    max_queue_wait_ms: float = Field(0.0, ge=0)
    on_overload: Literal["reject", "queue_until_deadline", "queue"] = "queue_until_deadline"


def default_tiers() -> list[TierSettings]:
    return [
        TierSettings(name="interactive", priority=0, ttft_slo_ms=500, on_overload="reject"),
        TierSettings(
            name="standard", priority=1, ttft_slo_ms=2_000, max_queue_wait_ms=2_000,
        ),
        TierSettings(
            name="batch", priority=2, ttft_slo_ms=60_000, max_queue_wait_ms=600_000,
            on_overload="queue",
        ),
    ]


class LimitSettings(_Strict):
    """Per-tenant limits; ``None`` means unlimited."""

    requests_per_minute: int | None = Field(None, ge=1)
    tokens_per_minute: int | None = Field(None, ge=1)
    max_concurrent: int | None = Field(None, ge=1)


class BreakerSettings(_Strict):
    """Outlier ejection per backend from what real requests met (backends/fleet/breaker.py)."""

    enabled: bool = True
    consecutive_failures: int = Field(5, ge=1, description="failures in a row that eject")
    error_rate: float = Field(0.5, gt=0, le=1,
                              description="share of failures over window_s that ejects")
    min_requests: int = Field(20, ge=1, description="results in the window before error_rate "
                              "or latency counts")
    window_s: float = Field(10.0, gt=0)
    ejection_s: float = Field(5.0, gt=0, description="the first ejection; doubled for each "
                              "one in a row, up to max_ejection_s, then a half-open probe")
    max_ejection_s: float = Field(60.0, gt=0)
    max_ejected_share: float = Field(
        0.5, ge=0, le=1, description="never eject more than this share of a model's backends")
    latency_factor: float = Field(
        10.0, ge=0, description="eject a backend whose median time to first byte is this many "
        "times the others' (0: off)")
    latency_min_s: float = Field(1.0, ge=0, description="and at least this long")
    latency_samples: int = Field(50, ge=1)


class UpstreamSettings(_Strict):
    connect_timeout_s: float = Field(3.0, gt=0)
    first_byte_timeout_s: float = Field(120.0, gt=0)
    request_timeout_s: float = Field(900.0, gt=0)
    idle_timeout_s: float = Field(60.0, gt=0)
    health_interval_s: float = Field(2.0, gt=0)
    health_timeout_s: float = Field(1.0, gt=0)
    retry_before_first_byte: bool = True
    max_connections_per_backend: int = Field(512, ge=1, le=100_000)
    breaker: BreakerSettings = BreakerSettings()


class RoutingSettings(_Strict):
    """How requests are placed on backends (routing.profiles names the built-in profiles)."""

    profile: str = "prefix_affinity"
    plugins: dict[str, Any] | None = Field(
        None, description="a custom profile: filters, scorers with weights, picker")
    tokenizers: dict[str, Literal["real", "approx"]] = Field(
        default_factory=dict,
        description="model -> tokenizer for the exact prefix index (the workers' tokenizer)",
    )
    block_chars: int = Field(64, ge=8, le=4096)
    block_size: int = Field(16, ge=1, le=1024)
    approx_ttl_s: float = Field(600.0, gt=0)
    approx_max_blocks: int = Field(
        1 << 18, ge=1024, le=1 << 26,
        description="blocks the approximate prefix index keeps (LRU; ~300 bytes each)")
    segment_cache_mib: float = Field(
        16.0, ge=0.0, le=4096.0,
        description="MiB of token ids of chat segments kept, so a repeated system prompt or "
                    "an earlier turn is not tokenized again (LRU; 0 turns it off)")
    share_push_ms: float = Field(
        1.0, ge=0.0, le=1000.0,
        description="with several replicas: each sends a change of its in-flight counts or "
                    "index at once, and its next flush at least this many ms later (through "
                    "redis-py: after the last one's reply and this); more costs Redis and each "
                    "replica less CPU, and the others route on older counts")
    share_lazy_ms: float = Field(
        50.0, ge=0.0, le=1000.0,
        description="with several replicas: a change that only lowers a replica's in-flight "
                    "counts (a first token, a finish) waits up to this many ms for a dispatch "
                    "to go out with; 0 sends it as a dispatch is sent")
    share_urgent_prefill_tokens: int = Field(
        512, ge=0,
        description="with several replicas: a first token (or an end before one) that takes "
                    "at least this many prompt tokens of prefill off a backend's books, a "
                    "cache miss's, goes out at once, not after share_lazy_ms: the others "
                    "would route away from that backend on a backlog it no longer has; 0: "
                    "every first token goes at once")
    share_scrapes: bool = Field(
        False,
        description="with several replicas: a listed engine's /metrics is scraped by the "
                    "first replica whose tick finds nobody's figures fresh, and the others "
                    "take its figures from Redis, so an engine answers about one scrape a "
                    "second however many replicas there are (each replica's view of it then "
                    "changes at the same moment: in the simulator TTFT p99 rose by 1-2 %); "
                    "false: each replica scrapes every engine itself")
    max_load_age_s: float = Field(5.0, gt=0)
    discover_workers: bool = True
    expose_backend_header: bool = True

    @field_validator("profile")
    @classmethod
    def _check_profile(cls, value: str) -> str:
        from routing.profiles import PROFILES

        if value not in PROFILES:
            raise ValueError(f"unknown profile {value!r}; built-in: {', '.join(PROFILES)}")
        return value


class RequestLogSettings(_Strict):
    mode: Literal["off", "sampled", "all"] = Field(
        "off", description="one JSON line per request: off, sampled (sample_rate of the "
        "successes, every failure) or all")
    sample_rate: float = Field(0.01, ge=0, le=1)
    path: str | None = Field(None, description="append to this file (mode 0600); default stdout")
    include_prompt: bool = Field(
        False, description="also write the prompt's text (its first prompt_max_chars): off "
        "by default, since prompts may hold what tenants would not have logged")
    prompt_max_chars: int = Field(2000, ge=1, le=1_000_000)
    route_detail: bool = Field(
        False, description="routed lines also list every backend the decision saw "
        "(route_candidates: its matched prefix tokens, load figures and their age), to tell "
        "why a request went where it did")


class PriceSettings(_Strict):
    """A model's price in currency units per million tokens."""

    prompt: float = Field(0.0, ge=0, description="per million uncached prompt tokens")
    cached: float | None = Field(
        None, ge=0, description="per million cached prompt tokens (default: the prompt price)")
    output: float = Field(0.0, ge=0, description="per million output tokens")


class UsageSettings(_Strict):
    """Usage accounting (gateway/usage.py): tokens and cost per tenant, key and model."""

    enabled: bool = Field(True, description="charge every answered request")
    flush_interval_s: float = Field(
        1.0, gt=0, le=60, description="how often this replica adds its charges to Redis")
    retention_days: int = Field(90, ge=1, le=3660, description="hourly buckets expire after")
    currency: str = Field("USD", min_length=1, max_length=16)
    prices: dict[str, PriceSettings] = Field(
        default_factory=dict, description="per model; a model without one costs 0")


class AdmissionSettings(_Strict):
    """Quota enforcement (per-tenant limits live on the tenant, in Redis)."""

    fail_mode: Literal["open", "closed"] = Field(
        "open", description="when Redis is unreachable: local limits only (open) or 503 (closed)")
    lease_ttl_s: float = Field(60.0, gt=0, description="a crashed gateway's leases expire after")
    redis_timeout_s: float = Field(0.25, gt=0)
    quota_block_s: float = Field(
        0.1, ge=0, le=10,
        description="a busy tenant's quota credit is drawn from Redis in blocks lasting about "
                    "this long and spent in the replica (0: every request judged in Redis)")
    default_output_tokens: int = Field(
        256, ge=1, description="output tokens reserved when a request sets no max_tokens")
    slo_enabled: bool = Field(
        True, description="admit / queue / reject by predicted TTFT against the tier's SLO")
    lower_tier_share: float = Field(0.05, ge=0, lt=1,
                                    description="share of dispatch guaranteed to lower tiers")
    max_queue_len: int = Field(10_000, ge=1)
    headroom_factor: float = Field(
        0.5, ge=0, description="free batch slots kept for higher tiers: this times their "
        "expected arrivals within their TTFT SLO, to the nearest slot, at least one (0: none); "
        "see admission/headroom.py")
    headroom_max_share: float = Field(
        0.25, ge=0, lt=1, description="at most this share of the fleet's batch slots is kept")


class Settings(_Strict):
    listen: ListenSettings = ListenSettings()
    state: Literal["redis", "memory"] = Field(
        "redis", description="where tenants, keys and quotas live: Redis, shared by every "
        "replica, or this process (a single replica; tenants and keys are lost at exit; no "
        "worker discovery or approximate-index sharing; redis_url unused)")
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="redis://, rediss://, unix://, or "
        "redis+sentinel://HOST[:PORT],.../SERVICE[/DB] for a Sentinel-managed primary, or "
        "redis+cluster://HOST[:PORT],... for a Redis Cluster (rediss+ for TLS)")
    admin_token: SecretStr | None = None
    key_secret: SecretStr | None = Field(
        None, description="HMAC secret for API key hashes; without it keys are hashed with SHA-256"
    )
    backends: list[BackendSettings] = Field(default_factory=list)
    aliases: list[AliasSettings] = Field(default_factory=list)
    tiers: list[TierSettings] = Field(default_factory=default_tiers)
    default_tier: str = "standard"
    default_limits: LimitSettings = LimitSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    routing: RoutingSettings = RoutingSettings()
    admission: AdmissionSettings = AdmissionSettings()
    request_log: RequestLogSettings = RequestLogSettings()
    usage: UsageSettings = UsageSettings()
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    drain_timeout_s: float = Field(30.0, ge=0)
    key_cache_ttl_s: float = Field(30.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str) -> str:
        try:
            if is_sentinel_url(value):
                sentinel_parts(value)
            elif is_cluster_url(value):
                cluster_parts(value)
        except RedisUrlError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("admin_token")
    @classmethod
    def _check_admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().strip():
            # An empty token would let an empty bearer in: leave it unset to disable the API.
            raise ValueError("must not be empty or blank: set a secret token, or leave "
                             "admin_token unset to disable the admin API")
        return value

    @_model_validator(mode="after")
    def _check_references(self) -> Settings:
        problems = _cross_field_problems(self.model_dump())
        if problems:
            raise ValueError("; ".join(message for _, message in problems))
        return self

    @property
    def tier_names(self) -> list[str]:
        return [t.name for t in self.tiers]


def _cross_field_problems(data: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """Checks across fields, run on raw data too so they are reported with field errors."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    backends = data.get("backends")
    if isinstance(backends, list):
        seen: set[str] = set()
        for index, backend in enumerate(backends):
            name = backend.get("name") if isinstance(backend, dict) else None
            if isinstance(name, str) and name in seen:
                problems.append((("backends", index, "name"),
                                 f"backend names must be unique; {name!r} is repeated"))
            if isinstance(name, str):
                seen.add(name)
    aliases = data.get("aliases")
    if isinstance(aliases, list):
        try:
            built = [AliasSettings.model_validate(a).to_alias() for a in aliases]
        except ValidationError:
            built = []  # reported as field errors
        problems += [(("aliases", index, "name"), message)
                     for index, message in alias_problems(built)]
    tiers = data.get("tiers")
    if tiers is None:
        tier_names = [t.name for t in default_tiers()]
    elif isinstance(tiers, list):
        tier_names = [str(t.get("name")) for t in tiers if isinstance(t, dict)]
    else:
        return problems
    default_tier = data.get("default_tier", "standard")
    if default_tier not in tier_names:
        problems.append((("default_tier",),
                         f"{default_tier!r} is not one of the tiers: {tier_names}"))
    return problems


class ConfigError(Exception):
    """Raised with every problem found; ``errors`` holds one ``(location, message)`` per problem."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("\n".join(f"{loc}: {msg}" for loc, msg in errors))


def load_settings(path: str | Path | None, environ: Mapping[str, str] | None = None, *,
                  overrides: Mapping[str, Any] | None = None,
                  strict_secrets: bool = False) -> Settings:
    """Read ``path`` (optional), overlay ``SWITCHYARD_*`` variables, then ``overrides`` (top-level
    fields; a mapping is merged one level deep), validate; or ConfigError. ``strict_secrets``:
    also refuse placeholder or short secrets (``secret_problems``), as ``config check`` does."""
    environ = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    lines: dict[tuple[str | int, ...], int] = {}
    source = "<defaults>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError([(source, f"cannot read the file: {exc.strerror}")]) from exc
        try:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{source}:{mark.line + 1}" if mark else source
            raise ConfigError([(where, f"not valid YAML: {exc}")]) from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError([(source, "the top level must be a mapping of settings")])
        data = loaded
        if node is not None:
            _collect_lines(node, (), lines)
    env_sources = _overlay_env(data, environ)
    for name, value in (overrides or {}).items():
        current = data.get(name)
        if isinstance(value, Mapping) and isinstance(current, dict):
            data[name] = {**current, **value}
        else:
            data[name] = value
        env_sources = {k: v for k, v in env_sources.items() if k[0] != name or
                       (isinstance(value, Mapping) and len(k) > 1 and k[1] not in value)}
    def located(loc: tuple[str | int, ...]) -> str:
        env_name = _env_source(loc, env_sources)
        if env_name:
            return f"{_format_loc(loc)} (from ${env_name})"
        if loc in lines:
            return f"{source}:{lines[loc]}: {_format_loc(loc)}"
        return f"{source}: {_format_loc(loc)}"

    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            where = _format_loc(loc)
            env_name = _env_source(loc, env_sources)
            if env_name:
                where = f"{where} (from ${env_name})"
            elif loc in lines or loc[:-1] in lines:
                where = f"{source}:{lines.get(loc, lines.get(loc[:-1]))}: {where}"
            else:
                where = f"{source}: {where or '<top level>'}"
            if not loc:  # a cross-field check: reported below with its own location
                continue
            problems.append((where, err["msg"]))
        problems += [(located(loc), message) for loc, message in _cross_field_problems(data)]
        raise ConfigError(problems) from exc
    if strict_secrets and (weak := secret_problems(settings)):
        raise ConfigError([(located(loc), message) for loc, message in weak])
    return settings


# Secrets shorter than these are refused by `config check` (outside --dev).
MIN_SECRET_CHARS = {"admin_token": 16, "key_secret": 32}
_PLACEHOLDER_MARKS = ("change-me", "changeme", "change_me", "placeholder", "replace-me")


def secret_problems(settings: Settings) -> list[tuple[tuple[str | int, ...], str]]:
    """Placeholder or short secrets: what a production configuration must not carry."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for name, minimum in MIN_SECRET_CHARS.items():
        secret = getattr(settings, name)
        if secret is None:
            continue
        value = secret.get_secret_value()
        if any(mark in value.lower() for mark in _PLACEHOLDER_MARKS):
            problems.append(((name,), "is a placeholder from an example; set a random secret "
                             f"of at least {minimum} characters (e.g. `openssl rand -hex "
                             f"{minimum}`), or check a development file with --dev"))
        elif len(value) < minimum:
            problems.append(((name,), f"is {len(value)} characters; use at least {minimum} "
                             f"random characters (e.g. `openssl rand -hex {minimum}`), or "
                             "check a development file with --dev"))
    return problems


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _collect_lines(
    node: yaml.Node, path: tuple[str | int, ...], out: dict[tuple[str | int, ...], int]
) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            out[(*path, key)] = key_node.start_mark.line + 1
            _collect_lines(value_node, (*path, key), out)
            out[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _collect_lines(item, (*path, index), out)


def _overlay_env(data: dict[str, Any], environ: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    sources: dict[tuple[str, ...], str] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or name in _CLI_ONLY_VARIABLES:
            continue
        path = tuple(part for part in name[len(ENV_PREFIX):].lower().split("__") if part)
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        if path[-1] in {"admin_token", "key_secret", "redis_url"}:
            value = raw  # secrets and URLs are strings, never reinterpreted
        target = data
        for part in path[:-1]:
            child = target.get(part)
            if not isinstance(child, dict):
                child = {}
                target[part] = child
            target = child
        target[path[-1]] = value
        sources[path] = name
    return sources


def _env_source(loc: tuple[Any, ...], sources: dict[tuple[str, ...], str]) -> str | None:
    for length in range(len(loc), 0, -1):
        prefix = tuple(str(p) for p in loc[:length])
        if prefix in sources:
            return sources[prefix]
    return None
