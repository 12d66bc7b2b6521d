"""A gateway replica's quota budget per tenant: credit drawn from Redis in blocks, spent here.

Pure bookkeeping, no I/O: ``QuotaStore`` (admission/quota/store.py) sends the ops. A busy
tenant's acquire draws, besides its own cost, a *block*: rate-limit credit (µs of GCRA debt
charged in Redis ahead of use, for requests and for tokens) and spare concurrency slots (this
replica's count in Redis above its requests in flight). Later acquires spend the block here
with no Redis call; a settle puts its lease's slot and its unused reserved tokens back into
the budget. Every op sent returns the credit held, so Redis always holds the whole truth, less
what a replica keeps for its next requests.

A block is never more than ``BLOCK_SHARE`` of a rate limit (1/128: none at all for limits under
128) or ``SLOT_SHARE`` of ``max_concurrent`` (1/32: in-flight counts swing more than rates;
none under 32), nor a quarter of the room Redis has left (the script's own cap): near a limit
blocks shrink to nothing and every request is judged in Redis exactly as without blocks. A
budget holds at most ``KEEP_BLOCKS`` of its last block. Credit held by one replica is not
available to another: it is returned when the tenant has been idle for ``idle_s``, or with the
tenant's next op, so it can only make a tenant be refused early, never let it over its limit.
Block sizes follow this replica's rate for the tenant: a block lasts about ``block_s``,
doubling while it is used up faster.

Example::

    budget = Budget((60_000, 10**7, 500), now_s=0.0)
    if not budget.can_spend(tokens=300, num_in_flight=12):
        ...  # an acquire op, drawing budget.want(now_s, block_s) more
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from admission.quota.types import WINDOW_MS

WINDOW_US = WINDOW_MS * 1000
BLOCK_SHARE = 128  # a block of rate credit is at most limit // BLOCK_SHARE
SLOT_SHARE = 32  # a block of spare slots is at most max_concurrent // SLOT_SHARE
MAX_BLOCK = 1024  # requests (and as many slots) per block, whatever the limit
KEEP_BLOCKS = 2  # a budget may hold up to this many of its last block before giving back
EPS_US = 0.001

Limits3 = tuple[int, int, int]  # requests/min, tokens/min, max concurrent; 0 = unlimited


@dataclass(slots=True)
class Budget:
    """One tenant's budget on this replica.

    ``req_us`` / ``tok_us``: credit, µs of request / token debt already charged in Redis and
    not yet spent (``tok_us`` goes negative when answers ran over their reservation: a charge
    owed). ``reserved``: this replica's count of concurrency slots in Redis as confirmed by the
    newest op's reply (never more than Redis holds; what requests may take here); ``sent``:
    the count the newest op gives Redis (at least what it holds once the op lands).
    ``keep_*``: twice what the last block granted, which the budget may hold; a settle that
    leaves more makes the excess go back.
    """

    limits: Limits3
    now_s: float
    req_us: float = 0.0
    tok_us: float = 0.0
    reserved: int = 0
    sent: int = 0  # the count the newest op gives Redis (at most, until its reply)
    keep_req_us: float = 0.0
    keep_tok_us: float = 0.0
    keep_slots: int = 0
    last_seq: int = 0  # the newest op sent that sets this replica's count
    num_since: int = 0  # acquires since the last draw
    tokens_since: int = 0
    drawn_s: float = field(init=False)
    used_s: float = field(init=False)
    written_s: float = field(init=False)
    has_drawn: bool = False
    spent_since_write: bool = False  # a slot taken here since the last op that set the count
    num_drawing: int = 0  # acquire ops out: until they answer, ``sent`` is only a bound
    # Redis's figures at the last reply, for the x-ratelimit headers between calls.
    replied_s: float = 0.0
    remaining_requests: int = 0
    reset_requests_ms: int = 0
    remaining_tokens: int = 0
    reset_tokens_ms: int = 0

    def __post_init__(self) -> None:
        self.drawn_s = self.used_s = self.written_s = self.now_s

    @property
    def req_step_us(self) -> float:
        return WINDOW_US / self.limits[0] if self.limits[0] else 0.0

    @property
    def tok_step_us(self) -> float:
        return WINDOW_US / self.limits[1] if self.limits[1] else 0.0

    def can_spend(self, tokens: int, num_in_flight: int) -> bool:
        """Whether a request of ``tokens`` fits in what this budget holds, with
        ``num_in_flight`` of the tenant's requests already holding slots here."""
        rpm, tpm, conc = self.limits
        return ((not rpm or self.req_us >= self.req_step_us - EPS_US)
                and (not tpm or self.tok_us >= tokens * self.tok_step_us - EPS_US)
                and (not conc or num_in_flight < self.reserved))

    def spend(self, tokens: int, now_s: float) -> None:
        self.req_us -= self.req_step_us
        self.tok_us -= tokens * self.tok_step_us
        self.spent_since_write = self.spent_since_write or bool(self.limits[2])
        self.counted(tokens, now_s)

    def counted(self, tokens: int, now_s: float) -> None:
        """An acquire, spent here or sent: the rate the next block is sized by."""
        self.num_since += 1
        self.tokens_since += tokens
        self.used_s = now_s

    def want(self, now_s: float, block_s: float) -> tuple[int, int, int]:
        """The block to draw with this acquire: (requests, tokens, slots), within
        ``BLOCK_SHARE`` of each rate limit and ``SLOT_SHARE`` of ``max_concurrent``. Resets
        the rate count; none while another draw is out (the acquires of one moment would
        each ask for a block sized by a single request)."""
        if self.num_drawing:
            return 0, 0, 0
        num, elapsed_s = self.num_since, now_s - self.drawn_s
        mean_tokens = self.tokens_since / num if num else 0.0
        self.num_since, self.tokens_since, self.drawn_s = 0, 0, now_s
        if not self.has_drawn or block_s <= 0:
            self.has_drawn = True
            return 0, 0, 0
        size = 2 * num if elapsed_s < block_s else round(num * block_s / elapsed_s)
        size = min(size, MAX_BLOCK)
        rpm, tpm, conc = self.limits
        return (min(size, rpm // BLOCK_SHARE),
                min(math.ceil(size * mean_tokens), tpm // BLOCK_SHARE),
                min(size, conc // SLOT_SHARE))

    def take_credit(self) -> tuple[float, float]:
        """All the rate credit, to return with an op (µs of request and token debt)."""
        credit = self.req_us, self.tok_us
        self.req_us = self.tok_us = 0.0
        return credit

    def take_excess(self) -> tuple[float, float]:
        """The rate credit beyond what the budget may keep, and any charge owed."""
        req = max(0.0, self.req_us - self.keep_req_us)
        tok = self.tok_us - self.keep_tok_us if self.tok_us > self.keep_tok_us else min(
            0.0, self.tok_us)
        self.req_us -= req
        self.tok_us -= tok
        return req, tok

    def count(self, num_in_flight: int) -> int:
        """The slot count to give Redis: the requests in flight here plus the spare slots the
        budget may keep."""
        spare = min(max(0, self.reserved - num_in_flight), self.keep_slots)
        return num_in_flight + spare

    def has_excess(self, num_in_flight: int) -> bool:
        """Whether the budget holds more than it may keep (after settles), or owes a charge."""
        return (self.req_us > self.keep_req_us + EPS_US or self.tok_us > self.keep_tok_us + EPS_US
                or self.tok_us < -EPS_US
                or (not self.num_drawing and self.sent > self.count(num_in_flight)))

    def holds_spare(self, num_in_flight: int) -> bool:
        """Whether it holds credit, or slots beyond the requests in flight."""
        return (abs(self.req_us) > EPS_US or abs(self.tok_us) > EPS_US
                or self.sent > num_in_flight)

    def is_empty(self, num_in_flight: int) -> bool:
        return (abs(self.req_us) <= EPS_US and abs(self.tok_us) <= EPS_US
                and self.sent == num_in_flight == 0)

    def granted(self, asked: tuple[int, int, int], extra: tuple[int, int],
                keep_slots: int) -> None:
        """An acquire's block came back: ``extra`` requests and tokens of credit, and the
        spare slots it may keep, for the block it ``asked``. A draw that asked for none (the
        first, or one beside another) changes what the budget may keep in nothing."""
        req, tok = extra
        self.req_us += req * self.req_step_us
        self.tok_us += tok * self.tok_step_us
        if not any(asked):
            return
        # Up to twice the block may stay: refunds and freed slots come back while the block is
        # being spent, and giving back each one would cost an op per request.
        self.keep_req_us = KEEP_BLOCKS * req * self.req_step_us
        self.keep_tok_us = KEEP_BLOCKS * tok * self.tok_step_us
        self.keep_slots = KEEP_BLOCKS * keep_slots

    def forget_block(self) -> None:
        """Keep nothing: the tenant is idle (or its limits changed)."""
        self.keep_req_us = self.keep_tok_us = 0.0
        self.keep_slots = 0

    def remaining(self, now_s: float) -> tuple[int, int, int, int]:
        """Requests and tokens remaining, and their resets (ms), as of Redis's last reply plus
        the credit held here and the refill since: exact for one replica, approximate when
        others spend meanwhile."""
        rpm, tpm, _ = self.limits
        elapsed_us = (now_s - self.replied_s) * 1e6
        rem_req, reset_req = _left(rpm, self.remaining_requests, self.reset_requests_ms,
                                   self.req_us, elapsed_us)
        rem_tok, reset_tok = _left(tpm, self.remaining_tokens, self.reset_tokens_ms,
                                   self.tok_us, elapsed_us)
        return rem_req, reset_req, rem_tok, reset_tok


def _left(limit: int, remaining: int, reset_ms: int, credit_us: float,
          elapsed_us: float) -> tuple[int, int]:
    """One limit's remaining count and reset (ms) given Redis's at its reply, the credit held
    since and the time since (refill); (0, 0) for no limit."""
    if not limit:
        return 0, 0
    back_us = max(0.0, credit_us) + elapsed_us
    return (min(limit, remaining + math.floor(back_us * limit / WINDOW_US + 1e-6)),
            max(0, math.ceil(reset_ms - back_us / 1000)))
