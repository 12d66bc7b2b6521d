"""Tenants and API keys: the records, the key formats, and the store interface.

A key looks like ``sy-<key id>-<secret>``: the key id (16 hex characters) finds the record in
O(1); the secret (32 random bytes, base64url) is never stored, only the HMAC-SHA256 of the whole
key under the server's ``key_secret`` (or its SHA-256 when no secret is configured). An imported
key (an operator-supplied string) is stored the same way; one in the ``sy-`` shape keeps its
embedded id, any other gets a random id and is found through its digest.

Two stores implement :class:`KeyStoreLike`: ``gateway.keystore.KeyStore`` (Redis, shared by every
replica) and ``gateway.keystore_memory.MemoryKeyStore`` (one process). Both build their records
with the helpers here, so a key minted by either has the same shape and digest.

Example::

    record, plaintext = mint_key("acme", digest=store.digest)   # plaintext is shown once
    assert key_digest(b"secret", plaintext) == record.digest
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

ALL_MODELS = "*"

_KEY_RE = re.compile(r"^sy-([0-9a-f]{16})-([A-Za-z0-9_-]{43})$")
TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")

MIN_WEIGHT = 0.001  # a smaller weight drives finish tags so high that float precision is lost
MAX_WEIGHT = 1000.0
MIN_IMPORTED_KEY_CHARS = 20
MAX_IMPORTED_KEY_CHARS = 256
MIN_IMPORTED_KEY_BITS = 80
_IMPORTED_SHAPE_RE = re.compile(
    rf"^[\x21-\x7e]{{{MIN_IMPORTED_KEY_CHARS},{MAX_IMPORTED_KEY_CHARS}}}$")


@dataclass(frozen=True, slots=True)
class Limits:
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    id: str
    name: str
    tier: str
    models: tuple[str, ...]
    limits: Limits
    enabled: bool
    created_at: float
    weight: float = 1.0  # share of its tier's queue, relative to the tier's other tenants

    def may_use(self, model: str) -> bool:
        return ALL_MODELS in self.models or model in self.models

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["models"] = list(self.models)
        data["object"] = "tenant"
        return data


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    tenant_id: str
    name: str
    digest: str
    hint: str
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    tier: str | None
    imported: bool = False

    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def is_expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["digest"]
        data["object"] = "api_key"
        return data


def parse_key(presented: str) -> tuple[str, str] | None:
    """Split ``sy-<id>-<secret>`` into (key id, secret), or None when malformed."""
    match = _KEY_RE.match(presented)
    return (match.group(1), match.group(2)) if match else None


def weight_problem(weight: object) -> str | None:
    """Why ``weight`` cannot be a tenant's weight, or None when it can."""
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        got = f"got {type(weight).__name__}"
    elif not (math.isfinite(weight) and MIN_WEIGHT <= weight <= MAX_WEIGHT):
        got = f"got {weight}"
    else:
        return None
    return (f"must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g} ({got}); the default is 1, "
            "and a tenant of weight 2 gets twice the queue share of a tenant of weight 1")


def is_imported_shape(presented: str) -> bool:
    """Whether ``presented`` could be an imported key: cheap enough for every request."""
    return not presented.startswith("sy-") and _IMPORTED_SHAPE_RE.match(presented) is not None


def imported_key_problem(key: str) -> str | None:
    """Why ``key`` may not be imported, or None when it may. The message never quotes the key."""
    if any(c.isspace() for c in key):
        return ("contains whitespace (a space, tab or line break); send the key alone, "
                "without a trailing newline")
    if not all("\x21" <= c <= "\x7e" for c in key):
        return "may hold only printable ASCII characters (letters, digits and punctuation)"
    if len(key) < MIN_IMPORTED_KEY_CHARS:
        return f"is {len(key)} characters long; it needs at least {MIN_IMPORTED_KEY_CHARS}"
    if len(key) > MAX_IMPORTED_KEY_CHARS:
        return f"is {len(key)} characters long; it may have at most {MAX_IMPORTED_KEY_CHARS}"
    parsed = parse_key(key)
    if key.startswith("sy-") and parsed is None:
        return ("starts with 'sy-' but is not a switchyard key ('sy-<16 hex>-<43 characters>'); "
                "the gateway reads every 'sy-' key in that shape")
    material = parsed[1] if parsed else key  # a switchyard key's id is not secret
    steps = [ord(b) - ord(a) for a, b in itertools.pairwise(material)]
    if not any(steps):
        return "is one character repeated; import a random key"
    if sum(abs(step) <= 1 for step in steps) * 2 >= len(steps):
        return ("is mostly a run of neighbouring characters (like 'abcd' or '1234'); "
                "import a random key")
    num_trigrams = len(material) - 2
    if len({material[i:i + 3] for i in range(num_trigrams)}) < 0.75 * num_trigrams:
        return "repeats parts of itself (like 'abc1abc1'); import a random key"
    bits = entropy_bits(material)
    if bits < MIN_IMPORTED_KEY_BITS:
        return (f"looks guessable: its characters carry about {bits:.0f} bits by a Shannon "
                f"estimate, and at least {MIN_IMPORTED_KEY_BITS} are needed; import a longer "
                "random key (a random key of 32 characters or more passes)")
    return None


def entropy_bits(text: str) -> float:
    """Shannon entropy of ``text``'s character frequencies times its length, in bits."""
    counts = Counter(text).values()
    return -sum(n * math.log2(n / len(text)) for n in counts)


def new_secret(nbytes: int) -> str:
    """A random URL-safe token of ``nbytes`` bytes that does not start with ``-``, so that it
    can follow an option on a command line (``--admin-token TOKEN``) without being read as
    an option itself (``secrets.token_urlsafe`` starts one in 64 that way)."""
    while (token := secrets.token_urlsafe(nbytes)).startswith("-"):
        pass
    return token


def key_digest(key_secret: bytes | None, presented_key: str) -> str:
    """The stored form of a key: HMAC-SHA256 under ``key_secret``, else plain SHA-256 (hex)."""
    data = presented_key.encode()
    if key_secret:
        return hmac.digest(key_secret, data, "sha256").hex()  # one-shot C path
    return hashlib.sha256(data).hexdigest()


def check_weight(weight: object) -> None:
    """Raise ValueError when ``weight`` cannot be a tenant's weight."""
    problem = weight_problem(weight)
    if problem is not None:
        raise ValueError(f"weight {problem}")


def new_tenant(*, name: str, tier: str, models: list[str], limits: Limits | None,
               tenant_id: str | None, enabled: bool, weight: float) -> Tenant:
    """A tenant record as ``create_tenant`` stores it (ValueError for a bad weight)."""
    check_weight(weight)
    return Tenant(
        id=tenant_id or f"t-{secrets.token_hex(6)}", name=name, tier=tier, models=tuple(models),
        limits=limits or Limits(), enabled=enabled, created_at=time.time(), weight=weight,
    )


def mint_key(tenant_id: str, *, digest: Callable[[str], str], name: str = "",
             expires_at: float | None = None, tier: str | None = None) -> tuple[ApiKey, str]:
    """A new random key: its record (holding only the digest) and the plaintext."""
    key_id = secrets.token_hex(8)
    plaintext = f"sy-{key_id}-{secrets.token_urlsafe(32)}"
    record = ApiKey(
        id=key_id, tenant_id=tenant_id, name=name, digest=digest(plaintext),
        hint=f"sy-{key_id}-...{plaintext[-4:]}", created_at=time.time(), expires_at=expires_at,
        revoked_at=None, tier=tier,
    )
    return record, plaintext


def imported_key_record(tenant_id: str, plaintext: str, *, digest: Callable[[str], str],
                        name: str = "", expires_at: float | None = None,
                        tier: str | None = None) -> ApiKey:
    """The record of an imported key: its embedded id when it has the ``sy-`` shape, else a
    random one (found through the digest)."""
    parsed = parse_key(plaintext)
    key_id = parsed[0] if parsed else secrets.token_hex(8)
    return ApiKey(
        id=key_id, tenant_id=tenant_id, name=name, digest=digest(plaintext),
        hint=f"sy-{key_id}-...{plaintext[-4:]}" if parsed else f"...{plaintext[-4:]}",
        created_at=time.time(), expires_at=expires_at, revoked_at=None, tier=tier,
        imported=True,
    )


class KeyStoreLike(Protocol):
    """What the gateway asks of a tenant and key store.

    Contracts both stores keep: ``create_tenant`` raises KeyError(id) when the id is taken and
    ValueError for a bad weight (so does ``update_tenant``); ``import_key`` raises KeyError with
    the id of the key already stored; the getters return None for an unknown id; listings are
    sorted by id; ``lookup``/``lookup_digest`` return ``(None, None)`` for an unknown key.
    """

    def digest(self, presented_key: str) -> str: ...

    async def create_tenant(self, *, name: str, tier: str, models: list[str],
                            limits: Limits | None = None, tenant_id: str | None = None,
                            enabled: bool = True, weight: float = 1.0) -> Tenant: ...

    async def get_tenant(self, tenant_id: str) -> Tenant | None: ...

    async def list_tenants(self) -> list[Tenant]: ...

    async def update_tenant(self, tenant_id: str, **changes: Any) -> Tenant | None: ...

    async def create_key(self, tenant_id: str, *, name: str = "", expires_at: float | None = None,
                         tier: str | None = None) -> tuple[ApiKey, str]: ...

    async def import_key(self, tenant_id: str, plaintext: str, *, name: str = "",
                         expires_at: float | None = None, tier: str | None = None) -> ApiKey: ...

    async def get_key(self, key_id: str) -> ApiKey | None: ...

    async def list_keys(self, tenant_id: str) -> list[ApiKey]: ...

    async def revoke_key(self, key_id: str) -> ApiKey | None: ...

    async def lookup(self, key_id: str) -> tuple[ApiKey | None, Tenant | None]: ...

    async def lookup_digest(self, digest: str) -> tuple[ApiKey | None, Tenant | None]: ...
