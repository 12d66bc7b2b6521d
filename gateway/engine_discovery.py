"""Engines given by URL alone (``switchyard serve --backend URL``): a name and the models.

Each URL is checked as ``backends[].url`` is; its name is derived from it (``host:port``, made
to fit the backend-name rule, unique); its models are what the engine lists on
``GET /v1/models`` (``data[].id``). An engine that refuses connections, times out or answers
5xx is still starting: it is asked again until ``wait_s`` has passed. An answer that waiting
will not change (401, 404, a body without models) fails at once.

Example::

    engines = discover_engines(["http://10.0.0.7:8000"], wait_s=30)
    engines[0].name, engines[0].models   # "10.0.0.7:8000", ("meta-llama/Llama-3.1-8B-Instruct",)
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from gateway.settings import check_backend_url

_NAME_CHARS_RE = re.compile(r"[^A-Za-z0-9._:/-]+")
_MAX_NAME_CHARS = 128
_REQUEST_TIMEOUT_S = 5.0
_RETRY_INTERVAL_S = 0.5
_CHECK = ("Check that the engine is running and listening on that host and port, that this "
          "machine can reach it, and that the URL is the engine's base URL (http://host:port, "
          "without /v1).")


@dataclass(frozen=True, slots=True)
class DiscoveredEngine:
    url: str
    name: str
    models: tuple[str, ...]


class DiscoveryError(Exception):
    """An engine given by URL that cannot be used; the message names it, the error and what
    to check."""


class _StillStarting(Exception):
    """An answer (or its absence) that a later try may change."""


def check_urls(urls: Sequence[str]) -> list[str]:
    """The URLs normalised as ``backends[].url`` is, or DiscoveryError for a bad or repeated one."""
    checked: list[str] = []
    for raw in urls:
        try:
            url = check_backend_url(raw.strip())
        except ValueError as exc:
            raise DiscoveryError(f"--backend {raw!r}: {exc}") from None
        if url in checked:
            raise DiscoveryError(f"--backend {url} is given twice; list each engine once")
        checked.append(url)
    return checked


def backend_name(url: str, taken: set[str]) -> str:
    """``host:port`` (and the path, if any) of ``url`` in the name alphabet, unique in
    ``taken`` (which it joins)."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2].replace("[", "").replace("]", "")
    base = _NAME_CHARS_RE.sub("-", netloc + parts.path.rstrip("/"))
    base = base.lstrip("._:/-")[:_MAX_NAME_CHARS] or "backend"
    name, number = base, 1
    while name in taken:
        number += 1
        suffix = f"-{number}"
        name = base[:_MAX_NAME_CHARS - len(suffix)] + suffix
    taken.add(name)
    return name


def discover_engines(
    urls: Sequence[str], *, wait_s: float = 30.0,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> list[DiscoveredEngine]:
    """Name each engine and read its models, asking again for up to ``wait_s`` while one is
    still starting (``say`` reports what it waits for); DiscoveryError when one cannot be used."""
    checked = check_urls(urls)
    taken: set[str] = set()
    names = {url: backend_name(url, taken) for url in checked}
    models: dict[str, tuple[str, ...]] = {}
    waiting: dict[str, str] = {}  # url -> why it is not there yet
    deadline_s = time.monotonic() + wait_s
    with httpx.Client() as client:
        while True:
            for url in [u for u in checked if u not in models]:
                timeout_s = min(_REQUEST_TIMEOUT_S, max(0.2, deadline_s - time.monotonic()))
                try:
                    models[url] = _list_models(client, url, timeout_s)
                except _StillStarting as exc:
                    if url not in waiting:
                        say(f"waiting for the engine at {url} (GET /v1/models: {exc}); "
                            f"up to {wait_s:g} s")
                    waiting[url] = str(exc)
                    continue
                if url in waiting:
                    say(f"the engine at {url} answers now")
            missing = [u for u in checked if u not in models]
            if not missing:
                break
            if time.monotonic() >= deadline_s:
                url = missing[0]
                raise DiscoveryError(
                    f"the engine at {url} did not answer GET {url}/v1/models within "
                    f"{wait_s:g} s ({waiting[url]}). {_CHECK}")
            time.sleep(min(_RETRY_INTERVAL_S, max(0.0, deadline_s - time.monotonic())))
    return [DiscoveredEngine(url=u, name=names[u], models=models[u]) for u in checked]


def _list_models(client: httpx.Client, url: str, timeout_s: float) -> tuple[str, ...]:
    try:
        response = client.get(url + "/v1/models", timeout=timeout_s)
    except httpx.TimeoutException:
        raise _StillStarting(f"no answer within {timeout_s:.1f} s") from None
    except httpx.HTTPError as exc:
        text = str(exc)
        raise _StillStarting("connection refused" if "refused" in text.lower()
                             else text or type(exc).__name__) from None
    status = response.status_code
    if status >= 500:
        raise _StillStarting(f"HTTP {status}")
    where = f"the engine at {url} answered GET {url}/v1/models with"
    if status in (401, 403):
        raise DiscoveryError(
            f"{where} HTTP {status}: it wants an API key. List it in a configuration file "
            "(backends[].api_key) and run 'switchyard serve --config FILE'.")
    if status == 404:
        hint = (" Drop the trailing /v1: give the engine's base URL." if url.endswith("/v1")
                else f" {_CHECK}")
        raise DiscoveryError(f"{where} HTTP 404.{hint}")
    if status != 200:
        raise DiscoveryError(f"{where} HTTP {status}: {response.text[:200]!r}. {_CHECK}")
    try:
        listed = response.json().get("data")
        ids = tuple(dict.fromkeys(str(m["id"]) for m in listed if m.get("id")))
    except (ValueError, AttributeError, TypeError, KeyError):
        ids = ()
        listed = None
    if not ids:
        shape = "no models" if isinstance(listed, list) else "a body that is not a model list"
        raise DiscoveryError(
            f"{where} {shape} (expected OpenAI's {{\"data\": [{{\"id\": ...}}]}}). To name its "
            "models yourself, list it in a configuration file (backends[].models) and run "
            "'switchyard serve --config FILE'.")
    return ids
