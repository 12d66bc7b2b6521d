"""The quota store's Lua script: acquire, settle, renew, cancel (schema and algorithm in
docs/redis.md).

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

OPS = _PRELUDE + """
-- KEYS: req, tok, leases, gone (one tenant). ARGV: lease_ttl_ms, concurrency_hint_ms, then
-- ops, each a letter and its arguments, applied in order on the same clock:
--   A rpm tpm max_concurrent tokens request_id   acquire: "allowed refused_code
--       retry_after_ms(-1: none) remaining_requests reset_requests_ms remaining_tokens
--       reset_tokens_ms num_leases"
--   S tpm reserved_tokens actual_tokens request_id   settle: "1" if a lease was released
--   R request_id                                  renew: "1" if the lease was live
--   C request_id                                  cancel (an acquire whose answer never
--       came): drop its lease and mark its id gone for lease_ttl_ms: "1"
-- Returns the ops' replies joined by newlines. Each GCRA is read and written once per call,
-- the lease count read once, and expired leases purged only when a count reaches its limit,
-- so a batch of one tenant's ops costs little more than one op.
local ttl, hint = tonumber(ARGV[1]) * 1000, tonumber(ARGV[2]) * 1000
local EPS = 0.001
local debts, dirty = {}, {}
local function get_debt(i)
  if debts[i] == nil then debts[i] = debt(KEYS[i]) end
  return debts[i]
end
local function set_debt(i, d) debts[i] = d ; dirty[i] = true end
local num_leases, purged, leases_set, gone_set = nil, false, false, false
local function count_leases()
  if num_leases == nil then num_leases = redis.call('ZCARD', KEYS[3]) end
  return num_leases
end
local function released(rid)
  local n = redis.call('ZREM', KEYS[3], rid)
  if num_leases ~= nil then num_leases = num_leases - n end
  return n
end
local function acquire(rpm, tpm, conc, tokens, rid)
  if redis.call('ZSCORE', KEYS[4], rid) then return '0 5 -1 0 0 0 0 0' end
  local code, wait = 0, 0
  local function refuse(c, w)
    if code ~= 4 and (code == 0 or w > wait) then code, wait = c, w end
  end
  local req_d, req_step, tok_d, tok_step, n = 0, 0, 0, 0, 0
  if rpm > 0 then
    req_d, req_step = get_debt(1), WINDOW / rpm
    if req_d + req_step - WINDOW > EPS then refuse(1, req_d + req_step - WINDOW) end
  end
  if tpm > 0 then
    tok_d, tok_step = get_debt(2), WINDOW / tpm * tokens
    if tokens > tpm then code, wait = 4, -1
    elseif tok_d + tok_step - WINDOW > EPS then refuse(2, tok_d + tok_step - WINDOW) end
  end
  if conc > 0 then
    n = count_leases()
    if n >= conc and not purged then
      redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', num(now))
      purged, num_leases = true, nil
      n = count_leases()
    end
    if n >= conc and redis.call('ZSCORE', KEYS[3], rid) then n = n - 1 end  -- its own slot
    if n >= conc then
      local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
      refuse(3, math.min(tonumber(first[2]) - now, hint))
    end
  end
  if code == 0 then
    if rpm > 0 then req_d = req_d + req_step ; set_debt(1, req_d) end
    if tpm > 0 then tok_d = tok_d + tok_step ; set_debt(2, tok_d) end
    if conc > 0 then
      num_leases = count_leases() + redis.call('ZADD', KEYS[3], num(now + ttl), rid)
      n, leases_set = num_leases, true
    end
  end
  local rem_req, rem_tok = 0, 0
  if rpm > 0 then rem_req = math.max(0, math.floor((WINDOW - req_d) * rpm / WINDOW + 1e-6)) end
  if tpm > 0 then rem_tok = math.max(0, math.floor((WINDOW - tok_d) * tpm / WINDOW + 1e-6)) end
  local retry = -1
  if code ~= 0 and code ~= 4 then retry = math.max(1, math.ceil(wait / 1000)) end
  return string.format('%d %d %d %d %d %d %d %d', code == 0 and 1 or 0, code, retry, rem_req,
                       math.ceil(req_d / 1000), rem_tok, math.ceil(tok_d / 1000), n)
end
local replies, i, bad = {}, 3, nil
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'A' then
    replies[#replies + 1] = acquire(tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                                    tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), ARGV[i + 5])
    i = i + 6
  elseif op == 'S' then
    local tpm, reserved, actual = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                                  tonumber(ARGV[i + 3])
    replies[#replies + 1] = tostring(released(ARGV[i + 4]))
    if tpm > 0 and reserved ~= actual then
      set_debt(2, get_debt(2) + (actual - reserved) * WINDOW / tpm)
    end
    i = i + 5
  elseif op == 'R' then
    local score = redis.call('ZSCORE', KEYS[3], ARGV[i + 1])
    if score and tonumber(score) > now then
      redis.call('ZADD', KEYS[3], 'XX', num(now + ttl), ARGV[i + 1])
      leases_set = true
      replies[#replies + 1] = '1'
    else
      replies[#replies + 1] = '0'
    end
    i = i + 2
  elseif op == 'C' then
    released(ARGV[i + 1])
    if not gone_set then redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', num(now)) end
    redis.call('ZADD', KEYS[4], num(now + ttl), ARGV[i + 1])
    gone_set = true
    replies[#replies + 1] = '1'
    i = i + 2
  else
    bad = op
    break
  end
end
for k in pairs(dirty) do put_debt(KEYS[k], debts[k]) end
if leases_set then expire_leases(KEYS[3]) end
if gone_set then expire_leases(KEYS[4]) end
if bad then return redis.error_reply('ERR unknown quota op ' .. tostring(bad)) end
return table.concat(replies, '\\n')
"""


@dataclass(frozen=True, slots=True)
class LuaScript:
    """A script and its SHA1, for ``EVALSHA`` with an ``EVAL`` fallback on ``NOSCRIPT``.

    ``num_header_args`` set: the script takes that many arguments first, then a sequence of
    ops, and returns one newline-separated reply per op. The transports then merge the calls of
    one write that have the same keys and header into one command (``merge_calls``), and give
    each caller its op's reply.
    """

    text: str
    num_header_args: int | None = None
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", digest)


OPS_SCRIPT = LuaScript(OPS, num_header_args=2)
