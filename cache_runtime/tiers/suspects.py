"""Keys a tier may still hold an older value of, shared by the Redis and SSD tiers.

A put or a delete that fails (Redis unreachable or refusing writes, the SSD's lock held past its
timeout) cannot drop the key's older value, which would be served once the tier is back. Such a
key is a suspect: it reads as absent in that tier and is not written there, until a drop of it
gets through. Drops go in batches, at once and then at most every `retry_s` while they fail, so
an outage costs one failed attempt a second, not one per request; one thread tries at a time,
the others go on without waiting. This process's view only: another process sharing the store
learns of its own failures.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable


class SuspectKeys:
    def __init__(
        self,
        drop: Callable[[list[str]], bool],
        retry_s: float = 1.0,
        batch: int = 10_000,
        limit: int | None = None,
    ) -> None:
        """`drop(keys)` removes them from the store, True if it got through. Past `limit`
        suspects the tier has lost track: every key reads as a suspect (`lost_track`)."""
        self._drop = drop
        self._retry_s = retry_s
        self._batch = batch
        self._limit = limit
        self._keys: set[str] = set()
        self._lock = threading.Lock()
        self._next_try = 0.0
        self.lost_track = False

    def __bool__(self) -> bool:
        """Any suspects: the tiers' hot paths test this before anything else."""
        return bool(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def add(self, keys: Iterable[str]) -> None:
        with self._lock:
            self._keys.update(keys)
            if self._limit is not None and len(self._keys) > self._limit:
                self.lost_track = True  # the set stays as it is; the tier's `check()` says so

    def discard(self, key: str) -> None:
        """`key`'s older value is gone (a later write or delete of it got through)."""
        if self._keys:
            with self._lock:
                self._keys.discard(key)

    def holds(self, key: str, retry: bool = True) -> bool:
        """Whether `key` may still hold an older value (after a due retry of the drops)."""
        if retry:
            self.retry()
        return self.lost_track or key in self._keys

    def retry(self) -> None:
        now = time.monotonic()
        if now < self._next_try or not self._lock.acquire(blocking=False):
            return
        try:
            keys = list(itertools.islice(self._keys, self._batch))
        finally:
            self._lock.release()
        if not self._drop(keys):
            self._next_try = now + self._retry_s
            return
        with self._lock:
            self._keys.difference_update(keys)
