"""The quota store's Lua scripts: acquire, settle, renew (schema and algorithm in docs/redis.md).

Kept as Python strings rather than ``.lua`` files so they ship inside any wheel without
package-data configuration. Each script touches only its KEYS, which share one tenant's hash tag,
so it runs on Redis Cluster; the clock is the server's ``TIME``, in microseconds.

A rate limit N per minute is a GCRA: the key holds the *debt* ``d`` (µs of refill still owed)
anchored at server time ``t``. Now the debt is ``max(0, d - (now - t))``; a charge adds
``cost * 60 s / N``; it fits while the debt stays within 60 s. So a full bucket admits a burst
of exactly N, then one every ``60 s / N``, and a refusal knows exactly when room returns.
Debt is stored relative to ``t`` (not as an absolute arrival time) so doubles stay exact.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

_PRELUDE = """
if redis.replicate_commands then pcall(redis.replicate_commands) end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local WINDOW = 60000000
local function num(x) return string.format('%.17g', x) end
local function debt(key)
  local v = redis.call('HMGET', key, 'd', 't')
  if not v[1] then return 0 end
  return math.max(0, tonumber(v[1]) - (now - tonumber(v[2])))
end
local function put_debt(key, d)
  if d <= 0 then redis.call('DEL', key) return end
  redis.call('HSET', key, 'd', num(d), 't', num(now))
  redis.call('PEXPIRE', key, math.ceil(d / 1000) + 1)
end
local function expire_leases(key)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - now) / 1000) + 1) end
end
"""

ACQUIRE = _PRELUDE + """
-- KEYS: req, tok, leases, gone. ARGV: rpm, tpm, max_concurrent, tokens, request_id,
-- lease_ttl_ms, concurrency_hint_ms. Returns "allowed refused_code retry_after_ms(-1: none)
-- remaining_requests reset_requests_ms remaining_tokens reset_tokens_ms num_leases".
-- A request id in ``gone`` was given up by its gateway (its acquire timed out): an acquire
-- that reaches Redis after that (queued while Redis was paused) charges and holds nothing.
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens, rid = tonumber(ARGV[4]), ARGV[5]
if redis.call('ZSCORE', KEYS[4], rid) then return '0 5 -1 0 0 0 0 0' end
local ttl, hint = tonumber(ARGV[6]) * 1000, tonumber(ARGV[7]) * 1000
local EPS = 0.001
local code, wait = 0, 0
local function refuse(c, w)
  if code ~= 4 and (code == 0 or w > wait) then code, wait = c, w end
end
local req_d, req_step, tok_d, tok_step, held, n = 0, 0, 0, 0, false, 0
if rpm > 0 then
  req_d, req_step = debt(KEYS[1]), WINDOW / rpm
  if req_d + req_step - WINDOW > EPS then refuse(1, req_d + req_step - WINDOW) end
end
if tpm > 0 then
  tok_d, tok_step = debt(KEYS[2]), WINDOW / tpm * tokens
  if tokens > tpm then code, wait = 4, -1
  elseif tok_d + tok_step - WINDOW > EPS then refuse(2, tok_d + tok_step - WINDOW) end
end
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', num(now))
  n = redis.call('ZCARD', KEYS[3])
  held = redis.call('ZSCORE', KEYS[3], rid)
  if held then n = n - 1 end
  if n >= conc then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    refuse(3, math.min(tonumber(first[2]) - now, hint))
  end
end
if code == 0 then
  if rpm > 0 then req_d = req_d + req_step ; put_debt(KEYS[1], req_d) end
  if tpm > 0 then tok_d = tok_d + tok_step ; put_debt(KEYS[2], tok_d) end
  if conc > 0 then
    redis.call('ZADD', KEYS[3], num(now + ttl), rid)
    expire_leases(KEYS[3])
    n = n + 1
  end
end
local rem_req, rem_tok = 0, 0
if rpm > 0 then rem_req = math.max(0, math.floor((WINDOW - req_d) * rpm / WINDOW + 1e-6)) end
if tpm > 0 then rem_tok = math.max(0, math.floor((WINDOW - tok_d) * tpm / WINDOW + 1e-6)) end
local retry = -1
if code ~= 0 and code ~= 4 then retry = math.max(1, math.ceil(wait / 1000)) end
-- One bulk string rather than an array: the client parses one reply instead of nine.
return string.format('%d %d %d %d %d %d %d %d', code == 0 and 1 or 0, code, retry, rem_req,
                     math.ceil(req_d / 1000), rem_tok, math.ceil(tok_d / 1000), n)
"""

SETTLE = _PRELUDE + """
-- KEYS: tok, leases. ARGV: tpm, reserved_tokens, actual_tokens, request_id.
-- Releases the lease and moves the token debt by (actual - reserved). Returns 1 if a lease was
-- held, else 0.
local tpm, reserved, actual = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local released = redis.call('ZREM', KEYS[2], ARGV[4])
if tpm > 0 and reserved ~= actual then
  put_debt(KEYS[1], debt(KEYS[1]) + (actual - reserved) * WINDOW / tpm)
end
return released
"""

CANCEL = _PRELUDE + """
-- KEYS: leases, gone. ARGV: request_id, ttl_ms. An acquire whose answer never came: drop its
-- lease if it ran, and mark its id gone for ttl_ms so that it charges nothing if it runs later.
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', num(now))
redis.call('ZADD', KEYS[2], num(now + tonumber(ARGV[2]) * 1000), ARGV[1])
expire_leases(KEYS[2])
return 1
"""

RENEW = _PRELUDE + """
-- KEYS: leases. ARGV: request_id, lease_ttl_ms. Extends a live lease; 1 if held, else 0.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', num(now))
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', num(now + tonumber(ARGV[2]) * 1000), ARGV[1])
expire_leases(KEYS[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script and its SHA1, for ``EVALSHA`` with an ``EVAL`` fallback on ``NOSCRIPT``."""

    text: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


ACQUIRE_SCRIPT = LuaScript(ACQUIRE)
SETTLE_SCRIPT = LuaScript(SETTLE)
RENEW_SCRIPT = LuaScript(RENEW)
CANCEL_SCRIPT = LuaScript(CANCEL)
