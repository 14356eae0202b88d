"""One model, several tenants: the model's turns go to the waiting tenants in rotation.

An in-process model runs one forward pass at a time. Held for a whole generation, its lock let a
tenant that sends maximal requests keep every other tenant waiting seconds per request (measured
with `benchmarks/gateway_abuse.py`: a calm tenant's p95 200x its idle value). `FairLock` is taken
per forward pass instead (the prefill, then each decoded token), and when it is released the
next turn goes to the tenant after the one that had it, among those waiting: a short request of
one tenant interleaves its tokens with another tenant's long generation instead of queueing
behind it. Requests keep their own KV caches, so their steps interleave safely.

Rejected: `threading.Lock` per step (no order: the thread that just released it usually takes it
again, starving the others) and per-request FIFO (fair to requests, not tenants: the tenant with
more requests in flight gets more turns).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager


class FairLock:
    """A lock whose waiters are served tenant by tenant, in rotation (module docstring)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held = False
        self._granted: object | None = None
        self._waiting: OrderedDict[str, deque[object]] = OrderedDict()

    @contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        self.acquire(tenant)
        try:
            yield
        finally:
            self.release()

    def acquire(self, tenant: str) -> None:
        with self._changed:
            if not self._held and not self._waiting:
                self._held = True
                return
            ticket = object()
            self._waiting.setdefault(tenant, deque()).append(ticket)
            while self._granted is not ticket:
                self._changed.wait()
            self._granted = None

    def release(self) -> None:
        """Hand the lock to the first waiting tenant in rotation (then it goes to the back)."""
        with self._changed:
            if not self._waiting:
                self._held = False
                return
            tenant, tickets = next(iter(self._waiting.items()))
            self._granted = tickets.popleft()
            del self._waiting[tenant]
            if tickets:  # its next request waits behind every other tenant's
                self._waiting[tenant] = tickets
            self._changed.notify_all()
