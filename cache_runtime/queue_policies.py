"""More candidates for the pool (`cache_runtime.pool`): S3-FIFO, MQ and LIRS (W-TinyLFU,
which admits by frequency rather than queueing by it, is `cache_runtime.tinylfu`).

Each is here because some shipped trace has it ahead of every policy the project had before
(`preheat bench cache`, 2026-12-02): S3-FIFO on cache2k web07 at 1%, MQ on the Mooncake trace at
5% and 20% and on a real conversation trace at 1-10%, LIRS on the LIRS block traces (gli at 20%:
0.336 where the old default hit 0.013). They keep the `EvictionPolicy` contract: `victim(keep)`
names a candidate and may reorder the policy's own queues on the way (S3-FIFO's promotions, MQ's
demotions), never the resident set; `on_remove` forgets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from cache_runtime.key_queue import KeyQueue
from cache_runtime.policies import EvictionPolicy, Hint, Key, keep_nothing, queue_victim


@mypyc_attr(allow_interpreted_subclasses=True)
class S3FIFOPolicy(EvictionPolicy):
    """S3-FIFO (Yang et al., SOSP'23): a small FIFO of 10% takes new keys; a key hit while
    there moves to the main FIFO when it reaches the small queue's end, the others leave and
    are remembered in a ghost FIFO; a ghost that returns goes straight to main. Main is a
    FIFO-reinsertion queue over a 2-bit hit counter. Hits only bump a counter: the cheapest
    policy in the pool. Against libCacheSim's S3FIFO (same capacities, no hints): equal to four
    decimals on the shipped traces at 5-20% (2026-12-05), once the first fill goes to main as
    in its build (`_first_fill`)."""

    name = "s3fifo"

    def __init__(self, small_share: float = 0.1, promote_at: int = 2) -> None:
        self.small_share = small_share
        self.promote_at = promote_at
        self._small = KeyQueue()
        self._main = KeyQueue()
        self._ghost = KeyQueue()
        self._freq: dict[Key, int] = {}
        self._capacity: int | None = None

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._freq[key] = 0
        if self._ghost.discard(key):
            self._main.add(key)
        else:
            self._small.add(key)

    def on_access(self, key: Key, now: float) -> None:
        freq = self._freq
        if freq[key] < 3:
            freq[key] += 1

    def on_access_many(self, keys: Sequence[Key]) -> None:
        freq = self._freq
        for key in keys:
            count = freq.get(key)
            if count is not None and count < 3:
                freq[key] = count + 1

    def on_remove(self, key: Key) -> None:
        if self._freq.pop(key, None) is None:
            return
        if self._small.discard(key):
            self._remember(key)
        else:
            self._main.discard(key)

    def on_lost(self, key: Key) -> None:
        """A ghost from either queue: a key of main that returns goes back to main, where a
        loop larger than the cache would otherwise never let it (it would leave the small
        queue before its next use)."""
        if self._freq.pop(key, None) is None:
            return
        if not self._small.discard(key):
            self._main.remove(key)
        self._remember(key)

    def _remember(self, key: Key) -> None:
        self._ghost.add(key)
        limit = max(1, len(self._freq) - int(len(self._freq) * self.small_share))
        while len(self._ghost) > limit:
            self._ghost.pop_front()

    def on_cold(self, key: Key) -> None:
        if key in self._freq:
            self._freq[key] = 0

    def _first_fill(self) -> None:
        """As libCacheSim's S3FIFO: until the first eviction, keys inserted once the small
        queue is full go to main. The size is known only now, so the keys past the small
        queue's share of it move to main here, in order (nothing was evicted, so none came
        from a ghost). Without this every key of the first fill waits in the small queue and
        most leave: on the loop trace gli at 10% this policy hit 0.012 where libCacheSim's hits
        0.160."""
        small, target = self._small, max(1, int((self._capacity or 0) * self.small_share))
        for key in list(small)[target:]:
            small.remove(key)
            self._main.add(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if self._capacity is None:
            self._capacity = len(self._freq)
            self._first_fill()
        if keep is keep_nothing:
            return self._search(keep, [], [])
        parked_small: list[Key] = []
        parked_main: list[Key] = []
        try:
            return self._search(keep, parked_small, parked_main)
        finally:  # even where `keep` raises: a key set aside and lost could never be evicted
            for queue, parked in ((self._small, parked_small), (self._main, parked_main)):
                for key in reversed(parked):  # back to the front, in their order
                    queue.push_front(key)

    def resize(self, entries: int) -> None:
        """The small queue's share for `entries` (it is read at each eviction). Where the cache
        grew, its new room fills as the first fill did: the small queue keeps its share, the
        keys past it go to main (`_first_fill`). Without that, every key of the grown cache
        waits in the small queue: after three 4 KB values in 10,000 bytes, a loop of 1,300
        10-byte keys hit nothing, 0.47 with no large values first."""
        if self._capacity is None:
            return
        grew = entries > self._capacity
        self._capacity = entries
        if grew:
            self._first_fill()

    def _search(
        self, keep: Callable[[Key], bool], parked_small: list[Key], parked_main: list[Key]
    ) -> Key | None:
        """The victim, with the keys `keep` protects that would have gone set aside in
        `parked_*` (`victim` puts them back at their queue's front).

        A kept key keeps its place: it leaves when it may, where the replay would have let it
        go, and a kept key in main spends its counter as an unkept one does (a key hit while in
        the small queue still moves to main). Under prefix closure a prompt's pages are kept
        until the pages after them go, its last page first; sent to the back of their queue as
        they were passed (before 2026-12-06), each page of a prompt waited a whole pass of the
        queue after the one after it, the small queue filled with them and victims came from
        main: on Mooncake's pages the tier hit 0.1410 / 0.2466 / 0.3722 at 5/10/20% against
        0.1551 / 0.2642 / 0.3957 replayed; now 0.1585 / 0.2644 / 0.3987, and on the demo's
        request log within 0.0002 of the replay at 0.2-1%. Tried: a kept key at the small
        queue's head moving on to main, as W-TinyLFU's window does: on the log at 0.2%, 0.5617
        against 0.6072 replayed (a prompt's fresh pages, kept while it is written, then crowd
        main).

        Bounds, not a guess at passes: each small key is looked at at most once (it leaves,
        moves to main or is set aside); in main an unprotected key's 2-bit counter runs out
        within four passes, and once main has been passed in full the small queue is asked
        even where main is over its share. Where `keep` protects most keys a victim is still
        found whenever one may go; two passes over every key, the bound before, left Mooncake's
        pages at 20% with 2,886 puts refused in the tier."""
        small, main, freq = self._small, self._main, self._freq
        capacity = self._capacity or 0
        target = max(1, int(capacity * self.small_share))
        free = keep is keep_nothing
        small_left, main_left = len(small), 4 * len(freq) + 1
        while True:
            over = len(main) > capacity - target and len(main) > 0 and main_left > 0
            if small and small_left and not over:
                small_left -= 1
                key = small.front()
                if freq[key] >= self.promote_at:
                    small.remove(key)
                    main.add(key)
                    freq[key] = 0
                elif not free and keep(key):
                    small.remove(key)
                    parked_small.append(key)
                else:
                    return key
            elif main and main_left:
                main_left -= 1
                key = main.front()
                if freq[key] > 0:
                    freq[key] -= 1
                    main.move_to_back(key)
                elif not free and keep(key):
                    main.remove(key)
                    parked_main.append(key)
                else:
                    return key
            else:
                return None

    def ranked(self) -> list[Key]:
        return [*self._small, *self._main]


@mypyc_attr(allow_interpreted_subclasses=True)
class MQPolicy(EvictionPolicy):
    """Multi-queue (Zhou, Philbin & Li, USENIX ATC'01): `queues` LRU queues, a key hit f times
    lives in queue log2(f); a key not hit for `lifetime` accesses drops one queue; victims come
    from the lowest queue's LRU end; evicted keys' counts are remembered (ghost of 4x the cache)
    so that a returning key keeps its rank. Time is the access count. Demotion is done lazily,
    at eviction, for every head that expired by then (heads expire first: a queue is in order
    of last access), which is what a check per access would have done, at a tenth the cost.
    `life` x the cache's size is the lifetime, in accesses: 16 tracks libCacheSim's MQ (multi1
    at 1%: 0.181 vs its 0.183; 1 gave 0.027), which the LIRS traces at 1% need."""

    name = "mq"

    def __init__(self, queues: int = 8, ghost_factor: int = 4, life: float = 16.0) -> None:
        self._life = life
        self._queues = [KeyQueue() for _ in range(queues)]
        # key -> [hits, queue]; each key's expiry (the access count at which it drops a queue)
        # is its node's value in its queue, where the demotion reads it without a lookup
        self._state: dict[Key, list[int]] = {}
        self._ghost = KeyQueue()  # evicted keys, each with its hits as its value
        self._ghost_factor = ghost_factor
        self._clock = 0
        self._lifetime: int | None = None

    def _place(self, key: Key, state: list[int]) -> None:
        level = min(state[0].bit_length() - 1, len(self._queues) - 1)
        state[1] = level
        self._queues[level].add(key, self._clock + (self._lifetime or len(self._state)))

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._clock += 1
        state = self._state[key] = [self._ghost.pop_value(key, 0) + 1, 0]
        self._place(key, state)

    def on_access(self, key: Key, now: float) -> None:
        self._clock += 1
        state = self._state[key]
        self._queues[state[1]].remove(key)
        state[0] += 1
        self._place(key, state)

    def on_remove(self, key: Key) -> None:
        state = self._state.pop(key, None)
        if state is None:
            return
        self._queues[state[1]].discard(key)
        self._remember(key, state[0])

    def _remember(self, key: Key, hits: int) -> None:
        """`key`'s count kept as a ghost, so that it keeps its rank if it returns."""
        self._ghost.add(key, hits)  # never here already: `on_insert` took it out
        while len(self._ghost) > self._ghost_factor * max(1, len(self._state)):
            self._ghost.pop_front()

    def on_cold(self, key: Key) -> None:
        state = self._state.get(key)
        if state is not None:
            self._queues[state[1]].remove(key)
            state[0] = 1
            self._place(key, state)
            self._queues[0].move_to_front(key)

    def _demote(self) -> None:
        lifetime, clock = self._lifetime or len(self._state), self._clock
        for level in range(1, len(self._queues)):
            queue, lower = self._queues[level], self._queues[level - 1]
            expiry = queue.front_value(clock)  # an empty queue: nothing expired
            while expiry < clock:
                key = queue.pop_front()
                lower.add(key, expiry + lifetime)
                self._state[key][1] = level - 1
                expiry = queue.front_value(clock)

    def _before_eviction(self) -> None:
        """The lifetime learned at the first eviction, then the expired keys demoted (`victim`
        and `evict` share it)."""
        if self._lifetime is None:
            self._lifetime = max(1, int(len(self._state) * self._life))
        self._demote()

    def resize(self, entries: int) -> None:
        """The lifetime for `entries`. Keys queued before keep the expiry the old lifetime gave
        them. Where it shrank, a queue's head can then expire later than keys behind it for one
        old lifetime; those keys drop a queue when the head does (demotion reads heads only),
        a little later than their own expiry."""
        if self._lifetime is not None:
            self._lifetime = max(1, int(entries * self._life))

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        self._before_eviction()
        for queue in self._queues:
            found = queue_victim(queue, keep)
            if found is not None:
                return found
        return None

    def evict(self) -> Key | None:
        self._before_eviction()
        for queue in self._queues:
            if queue:  # the lowest queue's least recent leaves; its count becomes a ghost
                key = queue.pop_front()
                self._remember(key, self._state.pop(key)[0])
                return key
        return None

    def ranked(self) -> list[Key]:
        return [k for q in self._queues for k in q]


_LIR, _HIR = True, False


@mypyc_attr(allow_interpreted_subclasses=True)
class LIRSPolicy(EvictionPolicy):
    """LIRS (Jiang & Zhang, SIGMETRICS'02): keys whose reuse distance is short (LIR) hold 99%
    of the cache; the rest (HIR) is a small FIFO that new keys pass through; a HIR key reused
    while still in the recency stack S becomes LIR, and the stack's bottom LIR steps down.
    Non-resident HIR keys stay in S to carry their recency, at most as many as the cache holds.
    The stack is pruned so that its bottom is always LIR.

    Hints (only the pool's hinted twin gets them): a request's last block (`Hint.TAIL`) enters
    as HIR at the queue's eviction end; `on_cold` (the conversation ended) sends a key to the
    queue's eviction end, a LIR one stepping down to HIR first. Rejected: a live conversation's
    block (`Hint.CONVERSATION`) entering as LIR: on the Mooncake trace at 5% session and turn
    hints then hit 0.1573 where no hints hit 0.1651."""

    name = "lirs"

    def __init__(self, hir_share: float = 0.01) -> None:
        self.hir_share = hir_share
        self._stack = KeyQueue()  # bottom first
        self._queue = KeyQueue()  # resident HIR, oldest first
        self._status: dict[Key, bool] = {}  # resident key -> LIR?
        self._ghosts = KeyQueue()  # non-resident HIR in the stack
        self._lir_limit: int | None = None
        self._lirs = 0
        self._pinned = 0  # LIR room given up to kept HIR keys, refilled by reuse only
        self._forced: set[Key] = set()  # LIR keys named while every HIR key was kept

    def _prune(self) -> None:
        stack, status = self._stack, self._status
        while stack:
            key = stack.front()
            if status.get(key) is _LIR:
                return
            stack.pop_front()
            self._ghosts.discard(key)

    def _demote_bottom(self) -> None:
        # pruned first: where no LIR key was left (all given up to kept keys, or all cooled by
        # hints) HIR keys entered the stack at its bottom, and demoting one of them miscounted
        # the LIR set for good (found in review, 2026-12-06); elsewhere a no-op
        self._prune()
        bottom = self._stack.pop_front()
        self._status[bottom] = _HIR
        self._lirs -= 1
        self._queue.add(bottom)
        self._prune()

    def _make_lir(self, key: Key) -> None:
        self._status[key] = _LIR
        self._lirs += 1
        self._stack.push_back(key)
        if self._lir_limit is not None and self._lirs > self._lir_limit:
            self._demote_bottom()

    def _earn_lir(self, key: Key) -> None:
        """`key` was reused within the stack (a short reuse distance): LIR, in room given up
        to kept keys first."""
        if self._pinned:
            self._pinned -= 1
        self._make_lir(key)

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        if self._forced:  # the put that named them is done: those that went have been counted
            self._forced.clear()
        if self._lir_limit is None or self._lirs + self._pinned < self._lir_limit:
            self._ghosts.discard(key)
            self._make_lir(key)
        elif self._ghosts.discard(key):
            self._earn_lir(key)
        else:
            self._status[key] = _HIR
            self._stack.add(key)
            self._queue.add(key)
            if hint == Hint.TAIL:
                self._queue.move_to_front(key)

    def on_access(self, key: Key, now: float) -> None:
        stack = self._stack
        if self._status[key] is _LIR:
            at_bottom = stack.front() == key
            stack.move_to_back(key)
            if at_bottom:
                self._prune()
        elif key in stack:
            self._queue.remove(key)
            self._earn_lir(key)
        else:
            stack.add(key)
            self._queue.move_to_back(key)

    def on_remove(self, key: Key) -> None:
        status = self._status.pop(key, None)
        if status is None:
            return
        if status is _LIR:
            self._lirs -= 1
            self._stack.remove(key)
            self._prune()
            if self._forced and key in self._forced:
                self._forced.discard(key)
                self._give_up_lir_room()
            return
        self._queue.remove(key)
        self._forget_hir(key)

    def _forget_hir(self, key: Key) -> None:
        """A HIR key gone from the cache: its recency stays in the stack, as a ghost (as many
        ghosts as resident keys at most)."""
        if key in self._stack:
            self._ghosts.add(key)
            while len(self._ghosts) > max(1, len(self._status)):
                self._stack.remove(self._ghosts.pop_front())
            self._prune()

    def on_cold(self, key: Key) -> None:
        status = self._status.get(key)
        if status is _LIR:
            self._lirs -= 1
            self._status[key] = _HIR
            self._stack.discard(key)
            self._prune()
            self._queue.add(key)
        if status is not None:
            self._queue.move_to_front(key)

    def _size_lir_set(self, entries: int) -> None:
        """The LIR set's limit for a cache of `entries`: the stack's bottom LIR keys step down
        to HIR until it fits; where it grows, new keys enter as LIR until it is full, as while
        the cache first filled."""
        self._lir_limit = limit = max(1, entries - max(1, int(entries * self.hir_share)))
        while self._lirs > limit:
            self._demote_bottom()
        # the room given up to kept keys stays given up, to be earned by reuse (`_earn_lir`):
        # after a shrink the LIR keys and it may exceed the limit for a while. Capped at the room
        # left instead (the limit less the LIR keys), it went to the next new keys as LIR keys
        # left: on a tier whose mix of sizes does not change (5% or 2% of the keys 10-20 KB,
        # the rest 100 B), twelve runs, LIRS alone 0.4170 against 0.4184, the pool 0.4127
        # against 0.4153 (never told: 0.4171, 0.4132)
        self._pinned = min(self._pinned, limit)

    def resize(self, entries: int) -> None:
        """The LIR set's limit for `entries` (`_size_lir_set`)."""
        if self._lir_limit is not None:
            self._size_lir_set(entries)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if self._lir_limit is None:
            self._size_lir_set(len(self._status))
        found = queue_victim(self._queue, keep)
        if found is None:
            found = next((k for k in self._stack if self._status.get(k) and not keep(k)), None)
            if found is not None and keep is not keep_nothing:
                self._forced.add(found)  # its room is given up when it goes (a put may be refused)
        return found

    def _give_up_lir_room(self) -> None:
        """A LIR key named while every resident HIR key was kept has gone (the memory tier's KV
        pages with cached children: a prompt's pages are parents as soon as its next page is
        written; counted when it goes, not when named, for the tier may refuse the put). Its
        room must not go to the next new key, as room below the LIR limit does while the cache
        fills: then every long prompt evicted LIR keys for its own pages, which took their
        places as LIR, and LIRS in the tier was LRU (the demo's request log, 96,357 pages at
        1%: 0.5967 against 0.6231 replayed, LRU 0.5961; the pool, which follows LIRS there,
        the same). The room stays given up to the kept keys until a HIR key earns it by reuse
        within the stack (`_earn_lir`), as LIRS grows its LIR set. With it the tier hits what the
        replay does within 0.0011 on that log at 0.2-1% and on the Mooncake trace at 5-20%
        (2026-12-06). A trace's replay protects nothing: there the fallback gives up nothing,
        and every figure of the sweep is unchanged."""
        if self._pinned < (self._lir_limit or 0):
            self._pinned += 1

    def evict(self) -> Key | None:
        if self._lir_limit is None or not self._queue:  # the first, or no resident HIR key
            return super().evict()
        key = self._queue.pop_front()  # the oldest resident HIR key
        del self._status[key]
        self._forget_hir(key)
        return key

    def ranked(self) -> list[Key]:
        return [*self._queue, *(k for k in self._stack if self._status.get(k) is _LIR)]
