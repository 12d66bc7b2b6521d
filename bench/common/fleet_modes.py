"""The two ways a benchmark fleet meets its gateway: **own** and **third-party**.

- ``own``: switchyard's simulated workers run with ``--redis-url``; they join the gateway by
  heartbeat (load, resource profile) and publish KV-cache events, so the exact prefix index is
  possible. The gateway lists no backends.
- ``third-party``: the same simulated engines run without Redis, as a vLLM or SGLang server
  would: no heartbeats, no KV events. The gateway lists them in ``backends:`` (name, URL,
  models; no ``profile:``) with ``routing: {discover_workers: false}``, scrapes their load from
  ``/metrics`` and discovers their block size and KV capacity (``vllm:cache_config_info``) and
  context length (``/v1/models``). Only the approximate prefix index exists.

Example::

    modes = parse_modes("both")                       # ("own", "third-party")
    backends = static_backends(["http://127.0.0.1:19001"], "switchyard-sim")
    fleet = wait_for_backends(origin, admin_token, 1, "third-party", group)
    [b["load_source"] for b in fleet]                 # ["metrics"]
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

import httpx

from gateway.cli.localproc import ProcessGroup

Mode = Literal["own", "third-party"]
MODES: tuple[Mode, ...] = get_args(Mode)
MODE_CHOICES = (*MODES, "both")
# What /admin/fleet must say of a backend in each mode before a run may start.
_SOURCES: dict[Mode, tuple[str, str]] = {"own": ("heartbeat", "heartbeat"),
                                         "third-party": ("config", "metrics")}
_DISCOVERED = ("block_size", "kv_capacity_tokens", "max_context_tokens")


def parse_modes(text: str) -> tuple[Mode, ...]:
    """``--mode`` as the modes to run, own first: ``both`` is both."""
    if text == "both":
        return MODES
    if text not in MODES:
        raise ValueError(f"--mode takes {', '.join(MODE_CHOICES)}, not {text!r}")
    return (text,)


def key_of(mode: Mode) -> str:
    """The results key of a mode: ``own``, ``third_party``."""
    return mode.replace("-", "_")


def static_backends(worker_urls: Sequence[str], model: str) -> list[dict[str, Any]]:
    """``backends:`` entries for engines the gateway did not start: name, URL, models only.
    Each is named ``sim-PORT``, as the same sim names itself in its heartbeat, so both modes'
    ``x-switchyard-backend`` values read alike."""
    return [{"name": f"sim-{urlsplit(url).port}", "url": url, "models": [model]}
            for url in worker_urls]


def fleet_snapshot(origin: str, admin_token: str) -> list[dict[str, Any]]:
    """``GET /admin/fleet``'s backends."""
    response = httpx.get(origin + "/admin/fleet", timeout=5,
                         headers={"Authorization": f"Bearer {admin_token}"})
    response.raise_for_status()
    return list(response.json()["data"])


def is_ready(backend: Mapping[str, Any], mode: Mode) -> bool:
    """Healthy, with fresh load from the mode's source; third-party: its profile discovered
    from the engine's own pages."""
    source, load_source = _SOURCES[mode]
    age_s = backend.get("load_age_s")
    if not (backend.get("is_healthy") and age_s is not None and age_s < 3
            and backend.get("source") == source and backend.get("load_source") == load_source):
        return False
    if mode == "own":
        return True
    profile = backend.get("profile") or {}
    return all((profile.get(name) or {}).get("source") not in (None, "config")
               for name in _DISCOVERED)


def wait_for_backends(origin: str, admin_token: str, count: int, mode: Mode,
                      group: ProcessGroup, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Poll ``/admin/fleet`` until ``count`` backends are ready (`is_ready`); those."""
    deadline = time.monotonic() + timeout_s
    data: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if dead := group.dead_child():
            raise RuntimeError(f"{dead} exited while the fleet was coming up")
        try:
            data = fleet_snapshot(origin, admin_token)
        except (httpx.HTTPError, ValueError, KeyError):
            data = []
        ready = [b for b in data if is_ready(b, mode)]
        if len(ready) >= count:
            return ready
        time.sleep(0.1)
    raise RuntimeError(f"{mode} fleet: only {sum(is_ready(b, mode) for b in data)} of {count} "
                       f"backends ready in {timeout_s} s; /admin/fleet says {data}")


def describe(snapshot: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a snapshot says of how the gateway knows its backends: membership source, load
    source, and where each discovered profile field came from."""
    profile_sources = sorted({f"{name}: {(b.get('profile') or {}).get(name, {}).get('source')}"
                              for b in snapshot for name in _DISCOVERED})
    return {"num_backends": len(snapshot),
            "sources": sorted({str(b.get("source")) for b in snapshot}),
            "load_sources": sorted({str(b.get("load_source")) for b in snapshot}),
            "profile_sources": profile_sources,
            "backends": [dict(b) for b in snapshot]}
