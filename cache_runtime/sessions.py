"""Which cached entries each conversation has read: what "conversation ended" may cool.

When the application says a conversation ended, the pages only that conversation read (its own
history: the new blocks of each turn, its document, its last block) will not be read again and
should be the first to go. Pages another conversation read too (a shared system prompt, a common
document) must not be cooled: they are the cache's best entries. The application knows its
session ids but not which pages other sessions share; this tracker does, from the reads it is
shown — only the past, as an application would.

Measured by `preheat bench cache` (the end in hindsight, the Mooncake trace): cooling the ended
conversation's private pages, as here, takes the 10% cache from 0.281 (cooling only the
conversation's own new blocks) to 0.328, with LRU at 0.260 and Belady at 0.506. Cooling every
page it read gave 0.365 on that trace, but cools shared prompts on every end: rejected, as a bet
on one trace in which shared prompts are rare.

An application that never says a conversation ended leaves its pages warm for good. The idle end
(`idle_end_s`) says it for any conversation not followed within the timeout, as `bench cache`'s
`idle_end` column measures: a conversation that then resumes goes on as usual (its next turn is
still a follow-up, and the pages it reads again are its own again), so a premature end costs only
the cooling, which the memory tier's pool follows only as far as its shadows show it helps.

Cooling is a hint, never a correctness matter (a cooled page is still served until evicted), so
the tracker is bounded (see `SessionPages`) and what it forgets costs only the hint. A cache
shared by tenants keeps one tracker per tenant (`TenantSessionPages`): a cache key never
matches across tenants, so no page is shared across them, and one tenant's traffic must not
push out another's records.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

_SHARED = object()  # read by two sessions or more: never cooled
Key = TypeVar("Key", bound=Hashable)  # cache key strings; trace replays use block ids


class SessionPages(Generic[Key]):
    """Thread-safe. `read(session, keys)` as a conversation reads or writes entries;
    `end(session)` returns the entries only it has read, and forgets the session.

    Bounded: at most `max_pages` page records, least recently read dropped first (a shared
    system prompt, read all the time, stays), and `max_sessions` live sessions, least recently
    active dropped first (a conversation that never ends: its pages are then never cooled).
    A dropped page read again starts afresh, owned by its next reader: it had not been read by
    anyone for longer than `max_pages` other pages, so cooling it then costs little. About 250
    bytes a page record with 100-character keys: 50 MB at the default.

    `idle(timeout_s)` is the idle end (module docstring): `clock` times each session's last
    read (tests pass a fake one)."""

    def __init__(
        self,
        max_pages: int = 200_000,
        max_sessions: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_pages <= 0 or max_sessions <= 0:
            raise ValueError("max_pages and max_sessions must be positive")
        self.max_pages = max_pages
        self.max_sessions = max_sessions
        self._clock = clock
        # key -> its only reader so far, or _SHARED; least recently read first
        self._owner: OrderedDict[Key, object] = OrderedDict()
        # live session -> the keys it was the first to read (and still has a record of), in
        # that order; least recently active session first
        self._first_read: OrderedDict[Hashable, dict[Key, None]] = OrderedDict()
        # live session -> when it last read, for those not idle-ended since; oldest first
        self._last_read: OrderedDict[Hashable, float] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, session: Hashable, keys: Iterable[Key]) -> None:
        with self._lock:
            first = self._first_read.get(session)
            if first is None:
                first = self._first_read[session] = {}
                if len(self._first_read) > self.max_sessions:
                    self._forget_oldest_session()  # never ended: its pages stay warm
            else:
                self._first_read.move_to_end(session)
            self._last_read[session] = self._clock()
            self._last_read.move_to_end(session)
            owner = self._owner
            for key in keys:
                current = owner.get(key)
                if current is None:
                    owner[key] = session
                    first[key] = None
                    continue
                owner.move_to_end(key)
                if current == session:
                    first[key] = None  # its own again after an idle end (kept in place if listed)
                elif current is not _SHARED:
                    owner[key] = _SHARED
            self._trim()

    def read_anonymously(self, keys: Iterable[Key]) -> None:
        """Keys read by a request of no session (an API call without a conversation id, a
        warm-up): shared from now on, never cooled by a session's end. Without this, the first
        session to read a warmed system prompt would own it."""
        with self._lock:
            owner = self._owner
            for key in keys:
                owner[key] = _SHARED
                owner.move_to_end(key)
            self._trim()

    def live(self, session: Hashable) -> bool:
        """Whether `session` has read something and not ended: a request of a live session is
        a follow-up turn (`Hint.CONVERSATION` for the pages it stores)."""
        with self._lock:
            return session in self._first_read

    def end(self, session: Hashable) -> list[Key]:
        """The entries no other session has read, in the order `session` first read them.
        Their records stay (a session that reads one later makes it shared): a page read
        by one conversation after another ended is shared, not private to the later one. The
        same session reading them again (it resumed) makes them its own again."""
        with self._lock:
            first = self._first_read.pop(session, {})
            self._last_read.pop(session, None)
            return [key for key in first if self._owner.get(key) == session]

    def idle(self, timeout_s: float) -> list[Key]:
        """The idle end: for every session whose last read was `timeout_s` or more ago and that
        has read nothing since its last idle end, the entries no other session has read, as
        `end` gives them. Unlike `end` the sessions stay live: one that resumes is a follow-up,
        and its next idle end comes `timeout_s` after its next read."""
        with self._lock:
            due, ended = self._clock() - timeout_s, []
            while self._last_read:
                session, last = next(iter(self._last_read.items()))
                if last > due:
                    break
                del self._last_read[session]
                first = self._first_read.get(session, {})
                ended.extend(key for key in first if self._owner.get(key) == session)
                first.clear()
            return ended

    def _trim(self) -> None:
        """Drop the least recently read records beyond `max_pages` (lock held)."""
        self._drop_pages(len(self._owner) - self.max_pages)

    def _drop_pages(self, count: int) -> None:
        """Drop the `count` least recently read records (lock held); a session's list keeps
        no key without a record."""
        for _ in range(min(count, len(self._owner))):
            dropped, reader = self._owner.popitem(last=False)
            if reader is not _SHARED:
                self._first_read.get(reader, {}).pop(dropped, None)

    def _forget_oldest_session(self) -> None:
        """Drop the least recently active live session (lock held)."""
        session, _ = self._first_read.popitem(last=False)
        self._last_read.pop(session, None)

    def drop_oldest(self, pages: int = 0, sessions: int = 0) -> None:
        """Forget the `pages` least recently read records and the `sessions` least recently
        active sessions (a caller sharing one budget among trackers: `TenantSessionPages`)."""
        with self._lock:
            self._drop_pages(pages)
            for _ in range(min(sessions, len(self._first_read))):
                self._forget_oldest_session()

    def sizes(self) -> tuple[int, int]:
        """(page records, live sessions): what counts against the bounds."""
        with self._lock:
            return len(self._owner), len(self._first_read)

    def stats(self) -> dict[str, int]:
        """Live sessions, page records, and keys listed under the live sessions."""
        with self._lock:
            listed = sum(len(keys) for keys in self._first_read.values())
            return {"sessions": len(self._first_read), "pages": len(self._owner), "listed": listed}


class TenantSessionPages:
    """`SessionPages` per tenant, under one budget of `max_pages` page records and
    `max_sessions` live sessions. When a read passes either, the tenant that holds the most
    gives up its least recently read records (or least recently active sessions): a tenant
    within its fair share (the budget over the tenants using it) never loses its records to
    another tenant's traffic. Thread-safe.

    Each trim frees up to `_SLACK` of the budget beyond the excess (never out of a tenant's fair
    share), so the search for the largest tenants runs about once per that many reads, not on
    every read of a full tracker.

    `idle_end_s`: the timeout of `idle_ended` (None: conversations end only when told)."""

    _SLACK = 0.01

    def __init__(
        self,
        max_pages: int = 200_000,
        max_sessions: int = 50_000,
        idle_end_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_pages <= 0 or max_sessions <= 0:
            raise ValueError("max_pages and max_sessions must be positive")
        if idle_end_s is not None and not (math.isfinite(idle_end_s) and idle_end_s > 0):
            raise ValueError(f"idle_end_s must be positive or None, got {idle_end_s}")
        self.max_pages = max_pages
        self.max_sessions = max_sessions
        self.idle_end_s = idle_end_s
        self._clock = clock
        self._tenants: dict[str, SessionPages[str]] = {}
        self._pages = self._sessions = 0  # totals over the tenants, as of their last change
        self._lock = threading.Lock()

    def read(self, tenant: str, session: str, keys: Iterable[str]) -> None:
        listed = list(keys)  # before the lock: a generator runs no caller code under it
        self._change(tenant, lambda pages: pages.read(session, listed))

    def read_anonymously(self, tenant: str, keys: Iterable[str]) -> None:
        """See `SessionPages.read_anonymously`."""
        listed = list(keys)
        self._change(tenant, lambda pages: pages.read_anonymously(listed))

    def live(self, tenant: str, session: str) -> bool:
        with self._lock:
            pages = self._tenants.get(tenant)
        return pages is not None and pages.live(session)

    def end(self, tenant: str, session: str) -> list[str]:
        """The entries of `tenant` that no other session of it has read (`SessionPages.end`)."""
        ended: list[str] = []
        self._change(tenant, lambda pages: ended.extend(pages.end(session)), create=False)
        return ended

    def idle_ended(self) -> list[str]:
        """The entries the idle end cools now, over every tenant (`SessionPages.idle`); none
        without `idle_end_s`. Sessions stay live, so no bound moves."""
        if self.idle_end_s is None:
            return []
        with self._lock:
            trackers = list(self._tenants.values())
        ended: list[str] = []
        for pages in trackers:
            ended.extend(pages.idle(self.idle_end_s))
        return ended

    def stats(self) -> dict[str, int]:
        """Tenants, live sessions, page records, and keys listed under the live sessions."""
        with self._lock:
            trackers = list(self._tenants.values())
        totals = {"tenants": len(trackers), "sessions": 0, "pages": 0, "listed": 0}
        for pages in trackers:
            for name, value in pages.stats().items():
                totals[name] += value
        return totals

    def _change(
        self, tenant: str, change: Callable[[SessionPages[str]], object], create: bool = True
    ) -> None:
        """Apply `change` to `tenant`'s tracker under the lock, keep the totals (even if it
        raised part-way), and trim the largest tenants while over budget."""
        with self._lock:
            pages = self._tenants.get(tenant)
            if pages is None:
                if not create:
                    return
                # each tracker may hold the whole budget: the shared trim below bounds them all
                pages = SessionPages(self.max_pages, self.max_sessions, self._clock)
                self._tenants[tenant] = pages
            before = pages.sizes()
            try:
                change(pages)
            finally:
                after = pages.sizes()
                self._pages += after[0] - before[0]
                self._sessions += after[1] - before[1]
                for measure, total, budget in (
                    (0, self._pages, self.max_pages),
                    (1, self._sessions, self.max_sessions),
                ):
                    if total > budget:
                        self._trim(measure, total - budget, budget)
                if after == (0, 0):
                    self._tenants.pop(tenant, None)

    def _trim(self, measure: int, excess: int, budget: int) -> None:
        """Free at least `excess` page records (`measure` 0) or live sessions (1) of `budget`,
        lock held: the tenants holding the most are brought down to one level (water-filling),
        so whoever holds less keeps everything. The level frees `_SLACK` of the budget more
        where that takes nothing from a tenant's fair share (the budget over the tenants)."""
        sizes = {tenant: pages.sizes() for tenant, pages in self._tenants.items()}
        held = [size[measure] for size in sizes.values()]
        bare = _water_level(held, excess)  # the highest level that frees enough
        slack = _water_level(held, excess + max(1, int(budget * self._SLACK)))
        level = max(slack, min(bare, budget // max(1, len(held))))
        for tenant, size in sizes.items():
            if size[measure] <= level:
                continue
            pages = self._tenants[tenant]
            above = size[measure] - level
            pages.drop_oldest(**({"pages": above} if measure == 0 else {"sessions": above}))
            after = pages.sizes()
            self._pages += after[0] - size[0]
            self._sessions += after[1] - size[1]
            if after == (0, 0):
                del self._tenants[tenant]


def _water_level(held: list[int], count: int) -> int:
    """The highest level such that bringing every amount in `held` above it down to it frees
    at least `count` (0 if even that cannot)."""
    ranked = sorted(held, reverse=True)
    total = 0
    for top, size in enumerate(ranked, start=1):
        total += size
        below = ranked[top] if top < len(ranked) else 0
        if total - top * below >= count:  # the `top` largest brought down to `below` suffice
            return max(below, (total - count) // top)
    return 0
