"""The quota store's Lua script: acquire, settle, and a replica's lease count (schema and
algorithm in docs/redis.md).

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
"""

OPS = _PRELUDE + """
-- KEYS: req, tok, held (one tenant). ARGV: lease_ttl_ms, concurrency_hint_ms, replica, then
-- ops, each a letter and its arguments, applied in order on the same clock:
--   A rpm tpm max_concurrent tokens seq held need ret_req ret_tok ext_req ext_tok ext_slots
--       acquire: "allowed refused_code retry_after_ms(-1: none) remaining_requests
--       reset_requests_ms remaining_tokens reset_tokens_ms num_leases extra_requests
--       extra_tokens own_count"; held: this replica's count before it, need: its count with
--       it (held when the request takes a slot the replica already holds); ret_*: credit the
--       replica gives back first (µs of debt; negative: a charge owed); ext_*: the block it
--       asks for besides the request (admission/quota/budget.py), granted only if the
--       request is, and at most a quarter of the room left after it
--   S tpm reserved_tokens actual_tokens seq held   settle: "1"; held -1: no lease to count
--   H seq held                                    this replica's count: "1" if it was live
--   R seq held ret_req ret_tok                    credit given back, and the count (-1: kept)
--                                                 "1" if the count was live
-- The held hash has a field per gateway replica, "count seq expiry_us": how many leases
-- the replica holds, as of its op number seq (increasing per replica), live until the
-- expiry (lease_ttl on from its last write). An op with a seq no newer than the field's is
-- out of date (it waited in a socket, or was merged after a newer one): its count is
-- ignored. An acquire is judged on its own count, held, and the other replicas' live ones,
-- whatever its seq. Returns the ops' replies joined by newlines. Each
-- GCRA is read and written once per call and the held hash read and written once, whatever
-- the number of ops: an op costs arithmetic, not a Redis command.
local ttl, hint, replica = tonumber(ARGV[1]) * 1000, tonumber(ARGV[2]) * 1000, ARGV[3]
local EPS = 0.001
local debts, dirty = {}, {}
local function get_debt(i)
  if debts[i] == nil then debts[i] = debt(KEYS[i]) end
  return debts[i]
end
local function set_debt(i, d) debts[i] = d ; dirty[i] = true end
local loaded, others, own_seq, own_live, own_count, own_dirty = false, 0, -1, false, 0, false
local function load_held()
  if loaded then return end
  loaded = true
  local flat = redis.call('HGETALL', KEYS[3])
  local dead = {}
  for j = 1, #flat, 2 do
    local count, seq, expiry = string.match(flat[j + 1], '^(%d+) (%d+) (%d+)$')
    local live = count ~= nil and tonumber(expiry) > now
    if flat[j] == replica and count ~= nil then
      own_seq = tonumber(seq)
      if live then own_live, own_count = true, tonumber(count) end
    elseif live then
      others = others + tonumber(count)
    else
      dead[#dead + 1] = flat[j]
    end
  end
  if #dead > 0 then redis.call('HDEL', KEYS[3], unpack(dead)) end
end
local function set_own(seq, held)
  load_held()
  if seq > own_seq then own_seq, own_count, own_dirty, own_live = seq, held, true, true end
end
local function give_back(i, credit)
  if credit ~= 0 then set_debt(i, math.max(0, get_debt(i) - credit)) end
end
local function acquire(rpm, tpm, conc, tokens, seq, held, need, ext_req, ext_tok, ext_slots)
  if conc > 0 then load_held() end
  local code, wait = 0, 0
  local function refuse(c, w)
    if code ~= 4 and (code == 0 or w > wait) then code, wait = c, w end
  end
  local req_d, req_step, tok_d, tok_step, n = 0, 0, 0, 0, 0
  local e_req, e_tok, e_slots = 0, 0, 0
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
    n = others + held
    if need > held and others + need > conc then refuse(3, math.min(hint, ttl)) end
  end
  if code == 0 then
    if rpm > 0 then
      req_d = req_d + req_step
      if ext_req > 0 then
        e_req = math.min(ext_req, math.floor((WINDOW - req_d) / req_step / 4 + 1e-9))
        req_d = req_d + e_req * req_step
      end
      set_debt(1, req_d)
    end
    if tpm > 0 then
      tok_d = tok_d + tok_step
      if ext_tok > 0 then
        e_tok = math.min(ext_tok, math.floor((WINDOW - tok_d) * tpm / WINDOW / 4 + 1e-9))
        tok_d = tok_d + e_tok * WINDOW / tpm
      end
      set_debt(2, tok_d)
    end
    if conc > 0 then
      if ext_slots > 0 then
        e_slots = math.max(0, math.min(ext_slots, math.floor((conc - others - need) / 4)))
      end
      set_own(seq, need + e_slots)
      n = others + need
    end
  elseif conc > 0 then
    set_own(seq, held)
  end
  local rem_req, rem_tok = 0, 0
  if rpm > 0 then rem_req = math.max(0, math.floor((WINDOW - req_d) * rpm / WINDOW + 1e-6)) end
  if tpm > 0 then rem_tok = math.max(0, math.floor((WINDOW - tok_d) * tpm / WINDOW + 1e-6)) end
  local retry = -1
  if code ~= 0 and code ~= 4 then retry = math.max(1, math.ceil(wait / 1000)) end
  return string.format('%d %d %d %d %d %d %d %d %d %d %d', code == 0 and 1 or 0, code, retry,
                       rem_req, math.ceil(req_d / 1000), rem_tok, math.ceil(tok_d / 1000), n,
                       e_req, e_tok, own_count)
end
local replies, i, bad = {}, 4, nil
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'A' then
    give_back(1, tonumber(ARGV[i + 8]))
    give_back(2, tonumber(ARGV[i + 9]))
    replies[#replies + 1] = acquire(tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                                    tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]),
                                    tonumber(ARGV[i + 5]), tonumber(ARGV[i + 6]),
                                    tonumber(ARGV[i + 7]), tonumber(ARGV[i + 10]),
                                    tonumber(ARGV[i + 11]), tonumber(ARGV[i + 12]))
    i = i + 13
  elseif op == 'S' then
    local tpm, reserved, actual = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
                                  tonumber(ARGV[i + 3])
    if tpm > 0 and reserved ~= actual then
      set_debt(2, get_debt(2) + (actual - reserved) * WINDOW / tpm)
    end
    local held = tonumber(ARGV[i + 5])
    if held >= 0 then set_own(tonumber(ARGV[i + 4]), held) end
    replies[#replies + 1] = '1'
    i = i + 6
  elseif op == 'H' then
    load_held()
    local was_live = own_live
    set_own(tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
    replies[#replies + 1] = was_live and '1' or '0'
    i = i + 3
  elseif op == 'R' then
    give_back(1, tonumber(ARGV[i + 3]))
    give_back(2, tonumber(ARGV[i + 4]))
    local held, was_live = tonumber(ARGV[i + 2]), true
    if held >= 0 then
      load_held()
      was_live = own_live
      set_own(tonumber(ARGV[i + 1]), held)
    end
    replies[#replies + 1] = was_live and '1' or '0'
    i = i + 5
  else
    bad = op
    break
  end
end
for k in pairs(dirty) do put_debt(KEYS[k], debts[k]) end
if own_dirty then
  redis.call('HSET', KEYS[3], replica, string.format('%d %d %d', own_count, own_seq, now + ttl))
  if redis.call('PTTL', KEYS[3]) < ttl / 1000 then
    redis.call('PEXPIRE', KEYS[3], math.ceil(ttl / 1000) + 1)
  end
end
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


OPS_SCRIPT = LuaScript(OPS, num_header_args=3)
