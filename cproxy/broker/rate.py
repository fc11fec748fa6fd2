"""A group's ``max_per_second``: a token bucket over its deliveries, pull and push together.

The bucket fills at the group's rate up to a burst of max(1, rate/10) messages: a pull
takes at most as many messages as there are whole tokens, and one that finds none while
work is ready is *throttled* (it waits within its ``wait_ms``, served by a hand-out when
the next token is due). In a cluster each proxy serves some of the group's queues and takes
that share of the rate (owned/total queues), so the cluster as a whole keeps the limit.

Throttled time: how long the group had messages ready that the limit held back from a pull
(or push lane) asking for them, summed: from the first pull that found no token to the next
delivery. A group below its limit shows none; at 500/s with one busy consumer, ~40 % of the
wall time.
"""

from __future__ import annotations

from .clock import monotonic_s


class Rate:
    """Token bucket and throttled time of one group (one proxy's share of it)."""

    def __init__(self, per_second: int, share: float = 1.0) -> None:
        self.per_second = per_second
        self.rate = float(per_second)
        self.burst = max(1.0, self.rate / 10)
        self._tokens = self.burst
        self._at = monotonic_s()
        self._throttled_s = 0.0
        self._throttled_since: float | None = None
        self.set_share(share)

    def set_share(self, share: float) -> None:
        """This proxy's share of the group's queues (1 on a single proxy). A proxy that
        serves none keeps the full rate: it has nothing to deliver anyway."""
        self._refill(monotonic_s())
        self.rate = self.per_second * share if share > 0 else float(self.per_second)
        self.burst = max(1.0, self.rate / 10)
        self._tokens = min(self._tokens, self.burst)

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def allowance(self, want: int, now: float) -> int:
        """How many of ``want`` deliveries may go out now (whole tokens)."""
        self._refill(now)
        return min(want, int(self._tokens))

    def spend(self, count: int, now: float) -> None:
        """``count`` deliveries went out; ends a throttled stretch when any did."""
        if count:
            self._tokens -= count
            if self._throttled_since is not None:
                self._throttled_s += max(0.0, now - self._throttled_since)
                self._throttled_since = None

    def held_back(self, now: float) -> float:
        """Work is ready and no token is: the group is throttled from ``now`` (unless it
        already is); returns the seconds until the next whole token."""
        if self._throttled_since is None:
            self._throttled_since = now
        return max(0.0, (1 - self._tokens) / self.rate)

    def throttled_seconds(self, now: float) -> float:
        """Total throttled time, the current stretch included."""
        since = self._throttled_since
        return self._throttled_s + (max(0.0, now - since) if since is not None else 0.0)
