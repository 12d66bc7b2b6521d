"""Configuration reload without a restart: ``SIGHUP`` or ``POST /admin/reload``.

The file the gateway started from is read and validated again. An invalid file changes nothing:
the caller gets every problem with its ``file:line`` and the running configuration stays. A
valid one is applied at once, between two requests (the event loop runs one thing at a time):

- **backends** listed in the file: new ones join the fleet, removed ones leave it (a request
  already on one finishes there), a changed URL or model list replaces the backend, a changed
  weight, profile, API key, health path or discovery flag is updated in place;
- **aliases**, **the routing profile** (``routing.profile`` / ``routing.plugins``), the
  **default tier and limits**, and the **SLO values of the tiers** (``ttft_slo_ms``,
  ``tpot_slo_ms``, ``max_queue_wait_ms``, ``on_overload``; the same tiers with the same
  priorities);
- a request reads the configuration as it goes, so one that started before a reload finishes
  with what it had read.

What this process built its structure on (where it listens, its state store and secrets, the
set of tiers and their priorities, the prefix indexes' block sizes and tokenizers, quotas,
usage, logging, timeouts) is not changed: those differences are reported as needing a restart,
and the rest is applied.

Example::

    result = reload_gateway(gw, Path("switchyard.yaml"))
    result.applied           # ["aliases", "backends"]
    result.needs_restart     # ["listen.port"]
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from admission.tiers import Tier
from backends.fleet.profiles import stated_facts
from backends.fleet.registry import Backend
from gateway.admin import _admin as require_admin
from gateway.context import CONFIG_PATH, GATEWAY, Gateway
from gateway.errors import APIError
from gateway.settings import BackendSettings, ConfigError, Settings, load_settings
from gateway.workers import ask_supervisor_to_reload
from routing.aliases import ModelAliases

log = logging.getLogger(__name__)

# Changed live; every other top-level field needs a restart.
_LIVE_FIELDS = frozenset({"backends", "aliases", "tiers", "default_tier", "default_limits",
                          "routing"})
_LIVE_ROUTING_FIELDS = frozenset({"profile", "plugins", "expose_backend_header"})
_TIER_SLO_FIELDS = ("ttft_slo_ms", "tpot_slo_ms", "max_queue_wait_ms", "on_overload")


@dataclass
class ReloadResult:
    """What a reload changed (``applied``: the settings applied live) and what it left for a
    restart (``needs_restart``: dotted field paths)."""

    applied: list[str] = field(default_factory=list)
    needs_restart: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"reloaded": True, "applied": self.applied, "needs_restart": self.needs_restart}


def reload_gateway(gw: Gateway, path: Path, environ: dict[str, str] | None = None
                   ) -> ReloadResult:
    """Read ``path`` again and apply what can change live; raises ``ConfigError`` (nothing
    changed) when the file is invalid."""
    new = load_settings(path, environ)
    old = gw.settings
    result = ReloadResult()
    old_data, new_data = old.model_dump(), new.model_dump()
    for name in sorted(new_data):
        if old_data[name] == new_data[name]:
            continue
        if name not in _LIVE_FIELDS:
            result.needs_restart.append(name)
        elif name == "routing":
            result.needs_restart += [f"routing.{key}" for key in sorted(new_data[name])
                                     if key not in _LIVE_ROUTING_FIELDS
                                     and old_data[name][key] != new_data[name][key]]
    tier_problem = _tier_structure_change(old, new)
    if tier_problem is not None:
        result.needs_restart.append(tier_problem)
    # Apply, each part only when it changed.
    if old_data["backends"] != new_data["backends"]:
        _apply_backends(gw, old.backends, new.backends)
        result.applied.append("backends")
    if old_data["aliases"] != new_data["aliases"]:
        gw.aliases = ModelAliases([alias.to_alias() for alias in new.aliases])
        result.applied.append("aliases")
    routing_live = {k: new_data["routing"][k] for k in _LIVE_ROUTING_FIELDS}
    if routing_live != {k: old_data["routing"][k] for k in _LIVE_ROUTING_FIELDS}:
        from gateway.app import scheduling_profile  # the app module imports this one

        gw.router.profile = scheduling_profile(new.routing)
        result.applied.append("routing")
    if tier_problem is None and old_data["tiers"] != new_data["tiers"]:
        slo = gw.slo
        for config in new.tiers:
            slo.tiers[config.name] = Tier.from_config(config)
        slo._ranked = sorted(slo.tiers.values(), key=lambda t: t.priority)
        result.applied.append("tiers")
    if tier_problem is not None and new.default_tier not in {t.name for t in old.tiers}:
        result.needs_restart.append("default_tier")  # a tier that comes with the restart
    for name in ("default_tier", "default_limits"):
        if old_data[name] != new_data[name] and name not in result.needs_restart:
            result.applied.append(name)
    gw.settings = _merged(old, new, result.needs_restart)
    log.info("configuration reloaded from %s: applied %s%s", path,
             ", ".join(result.applied) or "nothing (unchanged)",
             f"; needs a restart: {', '.join(result.needs_restart)}"
             if result.needs_restart else "")
    return result


def _tier_structure_change(old: Settings, new: Settings) -> str | None:
    """Why the new tiers cannot replace the old ones live (added, removed or re-prioritised
    tiers), or None."""
    before = {t.name: t.priority for t in old.tiers}
    after = {t.name: t.priority for t in new.tiers}
    if before == after:
        return None
    return "tiers (their names or priorities)"


def _merged(old: Settings, new: Settings, needs_restart: list[str]) -> Settings:
    """The settings the gateway runs on now: the new file's, but the old value of every field
    that needs a restart (so what the process runs and what it reports agree)."""
    data = new.model_dump()
    old_data = old.model_dump()
    for path in needs_restart:
        if path.startswith("tiers"):
            data["tiers"] = old_data["tiers"]
            continue
        parts = path.split(".")
        target, source = data, old_data
        for part in parts[:-1]:
            target, source = target[part], source[part]
        target[parts[-1]] = source[parts[-1]]
    return Settings.model_validate(data)


def _apply_backends(gw: Gateway, old: list[BackendSettings], new: list[BackendSettings]
                    ) -> None:
    registry = gw.registry
    before = {b.name: b for b in old}
    after = {b.name: b for b in new}
    for name in before.keys() - after.keys():
        registry.remove(name)
    for name, config in after.items():
        current = registry.get(name)
        previous = before.get(name)
        if current is None or previous is None:
            if current is None:
                registry.add(backend_from_settings(config))
            continue
        if config == previous:
            continue
        if config.url != previous.url or config.models != previous.models:
            registry.remove(name)
            registry.add(backend_from_settings(config))
            continue
        current.configure(
            weight=config.weight, health_path=config.health_path,
            api_key=config.api_key.get_secret_value() if config.api_key else None,
            stated_profile=stated_facts(config.profile.model_dump()),
            discover_profile=config.discover_profile)


def backend_from_settings(config: BackendSettings) -> Backend:
    """The fleet's backend for a listed engine."""
    return Backend(
        name=config.name, url=config.url, models=frozenset(config.models), weight=config.weight,
        health_path=config.health_path,
        api_key=config.api_key.get_secret_value() if config.api_key else None,
        stated_profile=stated_facts(config.profile.model_dump()),
        discover_profile=config.discover_profile,
    )


def reload_from_signal(app: web.Application) -> None:
    """``SIGHUP``: reload, and log what happened (an invalid file: every problem)."""
    path = app.get(CONFIG_PATH)
    if path is None:
        log.warning("SIGHUP: the gateway was started without a configuration file; nothing "
                    "to reload")
        return
    try:
        reload_gateway(app[GATEWAY], path)
    except ConfigError as exc:
        log.error("SIGHUP: %s is invalid, the running configuration stays:\n%s", path, exc)


async def admin_reload(request: web.Request) -> web.Response:
    """``POST /admin/reload``: 200 with what was applied and what needs a restart; 400 with
    every problem of an invalid file (nothing changed); 409 without a file to reload."""
    gw = require_admin(request)
    path = request.app.get(CONFIG_PATH)
    if path is None:
        raise APIError(409, "The gateway was started without a configuration file "
                       "(`switchyard serve --config FILE`); there is nothing to reload.",
                       type="invalid_request_error", code="no_config_file")
    try:
        result = reload_gateway(gw, path)
    except ConfigError as exc:
        problems = "; ".join(f"{where}: {message}" for where, message in exc.errors)
        raise APIError.bad_request(
            f"The configuration file is invalid, so nothing changed: {problems}. Fix it and "
            "reload again.", code="invalid_config") from None
    if ask_supervisor_to_reload():  # one of `serve --workers`: the others read it too
        log.info("reload: asked the supervisor to reload every worker")
    return web.json_response(result.to_json())
