"""Tombstones: how an answer computed before an invalidation is kept out of Redis, by any process.

An answer's delete leaves a tombstone beside it (`<redis key>:invalidated`, the Redis server's
time of the delete, for the tier's `tombstone_ttl_s`), and a guarded put writes an answer only
if no tombstone is as recent as the lookup it was computed from, checked and written in one
server-side script (`SET_UNLESS_INVALIDATED`): an answer computed before an invalidation can
then never land in Redis after it, even from a process that dies before it could clean up.
The lookup is dated on the server's clock by its age and by its wall time, the earlier
winning: a writer whose clock is off is refused all the same, and so is a put that reaches
Redis late (`RedisTier.put_unless_invalidated`).

A process's own deletes are remembered (`OwnMarks`): its refill of an invalidation, looked up
after that delete, must not be refused by the delete's own tombstone.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Literal

# "taken_back": stored, then deleted again, as it could not be shown current (see
# `RedisTier.put_unless_invalidated`); other processes may have read it meanwhile
PutOutcome = Literal["stored", "invalidated", "taken_back", "failed"]
ANSWER_KINDS = ("exact", "semantic")  # keys that can go stale: their deletes leave tombstones
TOMBSTONE_SUFFIX = ":invalidated"
MIN_TOMBSTONE_TTL_S = 60.0  # a lookup must fit in it, with the transit allowance
# How late a guarded put may reach Redis, and how far this host's clock may run ahead of Redis's,
# before either could let a stale answer in (both at once: see `RedisTier.put_unless_invalidated`)
TRANSIT_ALLOWANCE_S = 1.0

# Delete an answer and mark when (KEYS: the answer, its tombstone; ARGV: the tombstone's TTL in
# ms); returns {deleted count, the mark or false}. The DEL goes first and the SET is allowed to
# fail: a Redis out of memory (`noeviction`) refuses the SET, and the DEL must still happen. The
# time is the server's, in microseconds, built as a string: a Lua number would be printed with
# 14 significant digits.
DELETE_AND_MARK = """
local deleted = redis.call('DEL', KEYS[1])
local t = redis.call('TIME')
local mark = t[1] .. string.format('%06d', tonumber(t[2]))
local set = redis.pcall('SET', KEYS[2], mark, 'PX', ARGV[1])
if type(set) == 'table' and set.err then return {deleted, false} end
return {deleted, mark}
"""
# Write an answer unless it was invalidated at or after the lookup it was computed from (KEYS:
# the answer, its tombstone; ARGV: the value, PX in ms or '0' for none, the lookup's age in
# microseconds (how long before the call it began, on the caller's monotonic clock), the oldest
# age accepted (older than the tombstones last, it cannot be checked), a mark to accept (this
# process's own invalidation, for its refill) or '', and the lookup's wall time in microseconds
# on the caller's clock). The lookup is placed on this server's clock, which timed the tombstone,
# both ways, and the earlier wins (see `RedisTier.put_unless_invalidated`). Returns 1 if written.
SET_UNLESS_INVALIDATED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local since = math.min(now - tonumber(ARGV[3]), tonumber(ARGV[6]))
if now - since > tonumber(ARGV[4]) then return 0 end
local mark = redis.call('GET', KEYS[2])
if mark and mark ~= ARGV[5] and tonumber(mark) >= since then return 0 end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
"""

_UNSETTLED = 2**63  # an own delete whose cache has not finished it: no lookup comes after it
_OWN_MARKS_LIMIT = 100_000  # marks of the latest deletes remembered


def tombstone_of(key: str, redis_key: str) -> str | None:
    """The tombstone's Redis key of the cache key `key` (stored under `redis_key`); None for
    keys that cannot go stale (KV pages) and keys that are not cache keys."""
    parts = key.split("|", 4)
    if len(parts) == 5 and parts[0] == "ph" and parts[3] and parts[2] in ANSWER_KINDS:
        return redis_key + TOMBSTONE_SUFFIX
    return None


class OwnMarks:
    """The tombstone each of this tier's latest deletes left, and when its cache settled that
    delete (complete in every tier), on the monotonic clock; the last `_OWN_MARKS_LIMIT` keys."""

    def __init__(self) -> None:
        self._marks: OrderedDict[str, tuple[str, int]] = OrderedDict()  # key -> (mark, ns)
        self._lock = threading.Lock()

    def remember(self, key: str, stamp: bytes | str) -> None:
        """A delete of `key` left the tombstone `stamp`; unsettled until `settle(key)`."""
        with self._lock:
            mark = stamp.decode() if isinstance(stamp, bytes) else stamp
            self._marks[key] = (mark, _UNSETTLED)
            self._marks.move_to_end(key)
            if len(self._marks) > _OWN_MARKS_LIMIT:
                self._marks.popitem(last=False)

    def settle(self, key: str) -> None:
        """The cache's delete of `key` is complete in every tier, as of now."""
        with self._lock:
            if key in self._marks:
                self._marks[key] = (self._marks[key][0], time.monotonic_ns())

    def before(self, key: str, looked_up_ns: int) -> str:
        """The tombstone of the last delete of `key` if it was settled before `looked_up_ns`
        (monotonic); else ""."""
        with self._lock:
            mark, settled_ns = self._marks.get(key, ("", _UNSETTLED))
        return mark if settled_ns < looked_up_ns else ""
