"""HTTP requests drawn from the gateway's OpenAPI document, in the manner of schemathesis.

Each documented operation yields requests: path and query parameters, a body from its schema,
and an envelope around it (credential, content type and encoding, ``x-request-id``, tier,
``Accept``, ``traceparent``, ``Expect``). Most requests have one thing wrong, so that the rest
of the request is still checked: the body (a field broken, its JSON damaged, bytes that are not
JSON), one part of the envelope (a wrong, missing or foreign credential, a content type that is
not JSON, a bad encoding, an odd header), or the method or path; some have nothing wrong, and
some several things. ``tests.fuzz.wire.raw_cases`` adds bytes no HTTP client would send.

Example::

    batches = operation_cases(document(), credentials)["POST /v1/completions"]
    case = batches.example()[0]
    case.method, case.target, case.headers
"""

from __future__ import annotations

import gzip
import random
import string
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
from hypothesis import strategies as st

from tests.fuzz.mutations import broken, encode
from tests.fuzz.schema_strategies import SchemaGen, json_values

SMALL_MAX_TOKENS = st.integers(1, 6)  # the engine answers in a few steps
SAFE_TEXT = st.text(string.printable.strip() + " é中🙂", max_size=48)  # no CR, LF or NUL
LIMIT_FIELDS = {"max_tokens", "max_completion_tokens", "max_output_tokens"}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@dataclass(frozen=True, slots=True)
class Credentials:
    """What the fuzzed fleet has: keys of each kind and ids the admin API knows."""

    tenant_key: str  # may use every model
    restricted_key: str  # its tenant may use no model the fleet serves
    disabled_key: str  # its tenant is disabled
    revoked_key: str
    limited_key: str  # its tenant may send a few requests a minute
    admin_token: str
    models: tuple[str, ...]  # served
    tenant_ids: tuple[str, ...]  # tenants the admin API may change at will
    key_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Case:
    """One request: sent with an HTTP client, or as ``raw`` bytes over a socket."""

    operation: str  # "POST /v1/chat/completions": what it was drawn from
    method: str = "GET"
    target: str = "/"  # path and query, percent-encoded
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    raw: bytes | None = None
    is_documented: bool = True  # False: a wrong method or an unknown path, on purpose

    def reproducer(self) -> str:
        if self.raw is not None:
            return f"raw socket bytes: {self.raw[:600]!r}"
        head = " ".join(f"-H {f'{k}: {v}'!r}" for k, v in self.headers)
        return (f"curl -X {self.method} 'http://GATEWAY{self.target}' {head} "
                f"--data-binary {self.body[:600]!r}")


def _wrong_authorizations(creds: Credentials, right: str, other: str) -> tuple[str | None, ...]:
    return (
        None, other, "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", right[7:], right + "x",
        right.lower(), "bearer " + right[7:], "Bearer  " + right[7:],
        "Bearer sy-0123456789abcdef-" + "Q" * 43, "Bearer " + "k" * 300,
        *(f"Bearer {k}" for k in (creds.restricted_key, creds.disabled_key,
                                  creds.revoked_key, creds.limited_key)),
    )


# The envelope's values, chosen with the batch's seeded ``random.Random`` (uniform, where
# hypothesis's own choices favour the first of a list).
CONTENT_TYPES = (
    None, "application/json; charset=utf-8", "application/merge-patch+json", "text/plain",
    "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "APPLICATION/JSON",
    "application/json;;;", "*/*", "", "json",
)
ENCODINGS = ("gzip", "deflate", "gzip-bomb", "gzip-not-compressed", "odd")
# header -> (values a client may send, odd values)
HEADERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "x-request-id": (("req-1", "a" * 128, "ok._:@/+=-"),
                     ("a" * 129, "", " ", "has space", "tab\there", "é", "../../etc")),
    "x-switchyard-tier": (("standard", "batch"), ("interactive", "", "gold", "STANDARD")),
    "Accept": (("application/json", "text/event-stream", "*/*"), ("image/png",)),
    "traceparent": (("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",),
                    ("garbage", "", "00-" + "0" * 32 + "-" + "0" * 16 + "-00")),
    "Expect": ((), ("the-unusual", "100-continue-please", "")),
}
# What is wrong with a request (one thing, so the rest of it is checked too): nothing, its
# body, one part of its envelope, its method or path, or any of them at once.
FAULTS = ("none",) * 8 + ("body",) * 6 + ("envelope",) * 4 + ("route", "any")


def _encode_body(body: bytes, how: str) -> tuple[bytes, dict[str, str]]:
    if how == "gzip":
        return gzip.compress(body, mtime=0), {"Content-Encoding": "gzip"}
    if how == "deflate":
        return zlib.compress(body), {"Content-Encoding": "deflate"}
    if how == "gzip-bomb":  # 9 MiB once inflated: over max_body_bytes
        return GZIP_BOMB, {"Content-Encoding": "gzip"}
    if how == "gzip-not-compressed":
        return body, {"Content-Encoding": "gzip"}
    if how == "odd":
        return body, {"Content-Encoding": "br, zstd"}
    return body, {}


GZIP_BOMB = gzip.compress(b" " * (9 * 1024 * 1024), mtime=0)


def _envelope(draw: st.DrawFn, rng: random.Random, auth: tuple[str, tuple[str | None, ...]],
              body: bytes | None, faults: set[str]) -> tuple[dict[str, str], bytes]:
    """The headers around a request (``body`` None: it has none), and its body as sent
    (compressed, perhaps). ``faults`` names the parts to get wrong; free text from
    hypothesis stands in for a fixed odd value now and then."""
    headers: dict[str, str] = {}
    right, wrong = auth
    authorization: str | None = right
    if "auth" in faults:
        authorization = (f"Bearer {draw(SAFE_TEXT)}" if rng.random() < 0.2
                         else rng.choice(wrong))
    if authorization is not None:
        headers["Authorization"] = authorization
    if body is not None:
        content_type = rng.choice(CONTENT_TYPES) if "content-type" in faults else \
            "application/json"
        if content_type is not None:
            headers["Content-Type"] = content_type
        if "encoding" in faults:
            body, encoding = _encode_body(body, rng.choice(ENCODINGS))
            headers |= encoding
        elif rng.random() < 0.05:  # compressed, as a client may send it
            body, encoding = _encode_body(body, "gzip")
            headers |= encoding
    for name, (fine, odd) in HEADERS.items():
        if name in faults:
            headers[name] = draw(SAFE_TEXT) if rng.random() < 0.2 else rng.choice(odd)
        elif fine and rng.random() < 0.2:
            headers[name] = rng.choice(fine)
    return headers, body or b""


ENVELOPE_PARTS = ("auth", "auth", "content-type", "encoding", *HEADERS)


def _path_value(gen: SchemaGen, name: str) -> st.SearchStrategy[str]:
    return (gen.hints.get(name, st.nothing()) | SAFE_TEXT.filter(bool)
            | st.sampled_from(("..", "%2e%2e", "a/b", " ", "\x7f")))


def _query_value(gen: SchemaGen, parameter: dict[str, Any]) -> st.SearchStrategy[str]:
    hint = gen.hints.get(parameter["name"], st.nothing())
    valid = gen.valid(parameter["schema"]).map(lambda v: v if isinstance(v, str) else
                                               orjson.dumps(v).decode())
    return hint | valid | SAFE_TEXT | st.sampled_from(("nan", "inf", "-1", "1e400", "", "0"))


def _variant(draw: st.DrawFn, rng: random.Random, gen: SchemaGen, schema: dict[str, Any],
             value: Any, models: tuple[str, ...] | None, is_broken: bool) -> bytes:
    """The body of one request of a batch: ``value`` as it is or, when ``is_broken``, with a
    field broken, its JSON damaged, or replaced by bytes that are not JSON. ``models``: a
    completion's, one of which it asks for nine times in ten when nothing else is wrong."""
    how = rng.choice(("broken",) * 6 + ("damaged", "bytes")) if is_broken else "as-is"
    if how == "bytes":
        return draw(st.binary(max_size=48))
    if how == "broken":
        value = draw(broken(gen, schema, value, rng))
    if models is not None and isinstance(value, dict):
        if how == "as-is" and rng.random() < 0.9:
            value = {**value, "model": rng.choice(models)}
        if how == "as-is" and "stream" in gen.resolve(schema).get("properties", {}):
            # Streamed or not per request, not per batch: a few batches' base bodies would
            # otherwise decide how many streams the whole run sends.
            value = {**value, "stream": rng.random() < 0.5}
        if not value.keys() & LIMIT_FIELDS:  # not the engine's 256
            limit = ("max_output_tokens" if "max_output_tokens" in gen.resolve(schema).get(
                "properties", {}) else "max_tokens")
            value = {**value, limit: draw(SMALL_MAX_TOKENS)}
    return encode(draw, value, rng, damaged_share=1.0 if how == "damaged" else 0.0)


@st.composite
def _batch(draw: st.DrawFn, gen: SchemaGen, creds: Credentials, template: str, method: str,
           operation: dict[str, Any], parameters: list[dict[str, Any]],
           documented: frozenset[str]) -> list[Case]:
    """Requests to one operation: shared parameters and base body, each with its own
    variant of the body and its own envelope (a batch costs one draw of the expensive
    parts)."""
    rng = draw(st.randoms(use_true_random=True))  # seeded by a draw: reproducible
    path = template
    query: list[tuple[str, str]] = []
    for parameter in [*parameters, *operation.get("parameters", [])]:
        if "$ref" in parameter:
            continue  # a header; the envelope draws those
        name = parameter["name"]
        if parameter["in"] == "path":
            path = path.replace("{" + name + "}", quote(draw(_path_value(gen, name)), safe=""))
        elif parameter["in"] == "query" and draw(st.booleans()):
            query.append((name, draw(_query_value(gen, parameter))))
    if rng.random() < 0.1:  # a parameter nobody reads
        query.append((draw(SAFE_TEXT), draw(SAFE_TEXT)))
    target = path + ("?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}"
                                    for k, v in query) if query else "")
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    value = None
    if schema is not None:  # valid most often (so the request gets far), else any JSON
        value = draw(json_values() if rng.random() < 1 / 16 else gen.valid(schema))
    is_admin = template.startswith("/admin")
    right = f"Bearer {creds.admin_token if is_admin else creds.tenant_key}"
    other = f"Bearer {creds.tenant_key if is_admin else creds.admin_token}"
    auth = (right, _wrong_authorizations(creds, right, other))
    odd_paths = (path + "/", path + "x", "/v2" + path, "/" + path, path.upper(),
                 "/v1/nothing-here", "/admin/nothing-here")
    cases = []
    for _ in range(CASES_PER_BATCH):
        fault = rng.choice(FAULTS)
        faults = {"body", "route", *rng.sample(ENVELOPE_PARTS, 3)} if fault == "any" else \
            {rng.choice(ENVELOPE_PARTS)} if fault == "envelope" else {fault}
        body = None if schema is None else _variant(
            draw, rng, gen, schema, value,
            creds.models if template.startswith("/v1/") else None, "body" in faults)
        headers, sent_body = _envelope(draw, rng, auth, body, faults)
        sent_method, sent_target, is_documented = method.upper(), target, True
        if "route" in faults and rng.random() < 0.5:
            sent_method = rng.choice(METHODS)
            is_documented = sent_method.lower() in documented
        elif "route" in faults:
            sent_target = rng.choice(odd_paths)
            is_documented = False
        # A method swapped for another the path documents is judged as that operation.
        judged_as = sent_method if is_documented and sent_target == target else method.upper()
        cases.append(Case(f"{judged_as} {template}", sent_method, sent_target,
                          tuple(headers.items()), sent_body, is_documented=is_documented))
    return cases


CASES_PER_BATCH = 8
# Shares of a run: the completions get most (they reach the engine), the rest split what is
# left evenly; "raw" is ``tests.fuzz.wire.raw_cases``.
SHARES = {"POST /v1/chat/completions": 0.30, "POST /v1/completions": 0.25, "raw": 0.05}


def operation_cases(document: dict[str, Any], creds: Credentials
                    ) -> dict[str, st.SearchStrategy[list[Case]]]:
    """Per documented operation ("POST /v1/completions"), batches of requests to it."""
    gen = SchemaGen(document, hints={
        "model": st.sampled_from(creds.models),
        "max_tokens": SMALL_MAX_TOKENS, "max_completion_tokens": SMALL_MAX_TOKENS,
        "max_output_tokens": SMALL_MAX_TOKENS,
        "tenant_id": st.sampled_from(creds.tenant_ids), "tenant": st.sampled_from(creds.tenant_ids),
        "key_id": st.sampled_from(creds.key_ids),
        "from": st.datetimes().map(lambda t: t.isoformat()) | st.floats().map(str),
        "to": st.datetimes().map(lambda t: t.isoformat()) | st.floats().map(str),
    })
    batches = {}
    for template, item in document["paths"].items():
        parameters = item.get("parameters", [])
        documented = frozenset(item) - {"parameters"}
        for method in sorted(documented):
            batches[f"{method.upper()} {template}"] = _batch(
                gen, creds, template, method, item[method], parameters, documented)
    return batches


def budget(operations: list[str], total: int) -> dict[str, int]:
    """How many of ``total`` requests go to each operation (``SHARES``, the rest evenly)."""
    counts = {name: round(total * share) for name, share in SHARES.items()
              if name in operations}
    others = [name for name in operations if name not in counts]
    left = total - sum(counts.values())
    for index, name in enumerate(others):
        counts[name] = left // len(others) + (index < left % len(others))
    return counts
