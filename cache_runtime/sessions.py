"""Which cached entries each conversation has read: what "conversation ended" may cool.

When the application says a conversation ended, the pages only that conversation read (its own
history: the new blocks of each turn, its document, its last block) will not be read again and
should be the first to go. Pages another conversation read too (a shared system prompt, a common
document) must not be cooled: they are the cache's best entries. The application knows its
session ids but not which pages other sessions share; this tracker does, from the reads it is
shown — only the past, as an application would.

Measured by `preheat bench cache` (`preheat_app_hints`, the Mooncake trace): cooling the ended
conversation's private pages, as here, takes the 10% cache from 0.281 (cooling only the
conversation's own new blocks) to 0.328, with LRU at 0.260 and Belady at 0.506. Cooling every
page it read gave 0.365 on that trace, but cools shared prompts on every end: rejected, as a bet
on one trace in which shared prompts are rare.

Cooling is a hint, never a correctness matter (a cooled page is still served until evicted), so
the tracker is bounded (see `SessionPages`) and what it forgets costs only the hint.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable
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
    bytes a page record with 100-character keys: 50 MB at the default."""

    def __init__(self, max_pages: int = 200_000, max_sessions: int = 50_000) -> None:
        if max_pages <= 0 or max_sessions <= 0:
            raise ValueError("max_pages and max_sessions must be positive")
        self.max_pages = max_pages
        self.max_sessions = max_sessions
        # key -> its only reader so far, or _SHARED; least recently read first
        self._owner: OrderedDict[Key, object] = OrderedDict()
        # live session -> the keys it was the first to read (and still has a record of), in
        # that order; least recently active session first
        self._first_read: OrderedDict[Hashable, dict[Key, None]] = OrderedDict()
        self._lock = threading.Lock()

    def read(self, session: Hashable, keys: Iterable[Key]) -> None:
        with self._lock:
            first = self._first_read.get(session)
            if first is None:
                first = self._first_read[session] = {}
                if len(self._first_read) > self.max_sessions:
                    self._first_read.popitem(last=False)  # never ended: its pages stay warm
            else:
                self._first_read.move_to_end(session)
            owner = self._owner
            for key in keys:
                current = owner.get(key)
                if current is None:
                    owner[key] = session
                    first[key] = None
                    continue
                owner.move_to_end(key)
                if current is not _SHARED and current != session:
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
        by one conversation after another ended is shared, not private to the later one."""
        with self._lock:
            first = self._first_read.pop(session, {})
            return [key for key in first if self._owner.get(key) == session]

    def _trim(self) -> None:
        """Drop the least recently read records beyond `max_pages` (lock held); a session's
        list keeps no key without a record."""
        while len(self._owner) > self.max_pages:
            dropped, reader = self._owner.popitem(last=False)
            if reader is not _SHARED:
                self._first_read.get(reader, {}).pop(dropped, None)

    def stats(self) -> dict[str, int]:
        """Live sessions, page records, and keys listed under the live sessions."""
        with self._lock:
            listed = sum(len(keys) for keys in self._first_read.values())
            return {"sessions": len(self._first_read), "pages": len(self._owner), "listed": listed}
