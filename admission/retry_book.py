"""Retry-After as a booking: a refused request that comes back when it was told keeps its place.

Under overload a refusal's ``Retry-After`` alone promises nothing: the client that waits it
meets the same full queue as every new arrival, and at 2x capacity 70 % of such retries were
refused again. So each refusal books its return:

- the refused request's *key* (its tenant and the hash of its body: the official SDKs and any
  well-behaved client resend the same bytes) gets a ticket due ``Retry-After`` seconds later;
- tickets are booked in whole-second buckets per tier, at most ``share`` of the tier's recent
  rate of admitted requests per second each (``rate_per_s``; the gateway passes the fleet's
  rate of ending requests until the tier has one): a bucket that is full pushes the ticket,
  and the ``Retry-After`` it is told, to the next second with room. The promise is then one
  the fleet can keep: what comes back in a second is less than what leaves the front of the
  tier's queue. Booked against all the fleet's ends (half of them), the front lane of the
  standard tier at 2x got as many returns as it could start, and 30 % of them waited out
  their 2 s there;
- a request that arrives with a ticket due (from ``early_s`` before its time to ``grace_s``
  after it) redeems it: admission puts it at the front of its tier's queue, ahead of fresh
  arrivals of that tier (never ahead of a higher tier), for its tier's usual wait.

Tickets are the gateway replica's own (in memory): behind a load balancer that spreads one
key's requests over several replicas, a retry that lands on another replica is a fresh
request there. The book is bounded (``max_tickets``; the oldest go first) and forgets tickets
past their grace. All operations are O(1) amortised.

Example::

    book = RetryBook()
    key = retry_key("acme", raw_body)
    retry_after_s = book.issue(key, "standard", now_s, 2.0, rate_per_s=10.0)   # e.g. 2
    ...
    book.redeem(key, now_s + retry_after_s) is not None        # True: it keeps its place
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass


def retry_key(tenant: str, body: bytes) -> bytes:
    """What identifies a request and its retry: the tenant and the body's bytes."""
    digest = hashlib.blake2b(body, digest_size=16, key=tenant.encode()[:64])
    return digest.digest()


@dataclass(frozen=True, slots=True)
class Ticket:
    tier: str
    due_s: float
    expires_s: float
    second: int  # the whole-second bucket it is booked in


class RetryBook:
    """Booked returns of refused requests; see the module docstring."""

    def __init__(self, *, share: float = 0.75, early_s: float = 0.5, grace_s: float = 3.0,
                 max_tickets: int = 100_000, max_retry_after_s: float = 60.0) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.share = share
        self.early_s = early_s
        self.grace_s = grace_s
        self.max_tickets = max_tickets
        self.max_retry_after_s = max_retry_after_s
        self._tickets: OrderedDict[bytes, Ticket] = OrderedDict()
        self._buckets: dict[tuple[str, int], int] = {}  # (tier, whole second due) -> tickets
        self.num_issued = 0
        self.num_redeemed = 0

    def __len__(self) -> int:
        return len(self._tickets)

    def issue(self, key: bytes, tier: str, now_s: float, retry_after_s: float, *,
              rate_per_s: float) -> int:
        """Book the return of a refused request; the whole seconds to tell it (Retry-After).

        ``retry_after_s``: when admission expects room (at least 1 s is told);
        ``rate_per_s``: how fast requests end in the fleet lately (0 when unknown: then every
        second takes one ticket per tier)."""
        self._forget_expired(now_s)
        per_second = max(1, math.floor(self.share * rate_per_s))
        wait = max(1, math.ceil(min(retry_after_s, self.max_retry_after_s) - 1e-9))
        base = math.floor(now_s)
        while wait < self.max_retry_after_s and (
                self._buckets.get((tier, base + wait), 0) >= per_second):
            wait += 1
        old = self._tickets.pop(key, None)
        if old is not None:
            self._unbook(old)
        due_s = now_s + wait
        self._tickets[key] = Ticket(tier, due_s, due_s + max(self.grace_s, 0.5 * wait),
                                    base + wait)
        bucket = (tier, base + wait)
        self._buckets[bucket] = self._buckets.get(bucket, 0) + 1
        self.num_issued += 1
        while len(self._tickets) > self.max_tickets:
            _, oldest = self._tickets.popitem(last=False)
            self._unbook(oldest)
        return wait

    def redeem(self, key: bytes, now_s: float) -> Ticket | None:
        """The ticket of a request that is back in time, taken out of the book; None for a
        fresh request, one back too early (its ticket stays) or too late."""
        ticket = self._tickets.get(key)
        if ticket is None or now_s < ticket.due_s - self.early_s:
            return None
        del self._tickets[key]
        self._unbook(ticket)
        if now_s > ticket.expires_s:
            return None
        self.num_redeemed += 1
        return ticket

    def _unbook(self, ticket: Ticket) -> None:
        bucket = (ticket.tier, ticket.second)
        left = self._buckets.get(bucket, 0) - 1
        if left > 0:
            self._buckets[bucket] = left
        else:
            self._buckets.pop(bucket, None)

    def _forget_expired(self, now_s: float) -> None:
        """Drop expired tickets from the oldest booked on (expiry follows booking order but
        for the few told a longer wait: those go when a later one reaches them, or at
        ``redeem``), and past buckets once there are many."""
        while self._tickets:
            key, ticket = next(iter(self._tickets.items()))
            if ticket.expires_s > now_s:
                break
            del self._tickets[key]
            self._unbook(ticket)
        stale = math.floor(now_s)
        if len(self._buckets) > 4 * self.max_retry_after_s:
            for bucket in [b for b in self._buckets if b[1] < stale]:
                del self._buckets[bucket]
