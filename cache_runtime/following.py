"""The live policy and the shadows it follows (`ShadowFollowing`, the base of `pool.PoolPolicy`).

Where every key is sampled (caches of at most 2 x `min_shadow` entries: `pool.EXACT_FROM`), each
shadow is a full-size replay since the cache filled, so the cache follows the leading one
exactly, with no rebuild (`_follow`): it evicts first the resident keys that shadow does not
hold, and once it holds what the shadow holds, the live policy makes the shadow's choices (a
copy of it; in a trace's replay, where nothing is protected, the shadow itself: `_merge`). A
copy taken at the switch and left to itself stayed apart from the shadow for good (cs at 5%: 9
of 70 keys, on every pass of a loop larger than the cache).

Apart from the pool because it is how the cache follows a choice, where the pool is when it
switches (the sampling, the rebuild of a new leader and its check): the rules that keep a merged
shadow and the cache together are all here, each named by the event that parts them. Compiled
with the pool (`compiled.MODULES`): its hooks run on every access of a cache that follows.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from cache_runtime.candidates import Candidate
from cache_runtime.key_queue import KeyQueue
from cache_runtime.policies import EvictionPolicy, Key, keep_nothing, queue_victim
from cache_runtime.selector import Selector
from cache_runtime.shadows import Shadow


@mypyc_attr(allow_interpreted_subclasses=True)
class ShadowFollowing(EvictionPolicy):
    """The policy that evicts for the cache (`_live`, the leader's), the shadows of the
    candidates `names`, and, once `_follow_target` has been called, the cache following the
    leading shadow. `pool.PoolPolicy` adds when to switch; this class is how."""

    def __init__(
        self, names: Sequence[str], candidates: list[Candidate], selector: Selector
    ) -> None:
        self.pool = tuple(names)
        self._candidates = candidates
        self.selector = selector  # names `target`
        self._shadows: list[Shadow] | None = None  # one per distinct state (`pool._fork`)
        self._slots: list[int] = []  # each candidate's shadow in `_shadows`
        self._keys: set[Key] = set()  # resident keys: what a switch hands over (`Handover`)
        self.leader = 0  # the candidate whose policy evicts for the cache
        self.switches: list[tuple[int, str]] = []  # (sampled accesses so far, new leader)
        self._following = False  # exact, since the first switch: the cache follows (`_follow`)
        self._strays = KeyQueue()  # following: resident keys the leading shadow lacks
        self._aligned = False  # following: the live policy makes the leading shadow's choices
        self._merged = -1  # the slot whose shadow's policy is the live policy (`_merge`)
        self._protecting = False  # a victim was asked with a `keep` that protects: never merge
        self._named: Key | None = None  # merged: the victim just named, which goes next
        self._install(candidates[0].make())

    @property
    def leader_name(self) -> str:
        return self.pool[self.leader]

    def _install(self, live: EvictionPolicy) -> None:
        """`live`, the leader's policy, evicts from now on."""
        self._live = live
        self._hinted = self._candidates[self.leader].hinted
        # the candidate whose kind the live policy is: not its type, for two candidates share
        # one (MQ at two lifetimes)
        self._live_make = self._candidates[self.leader].make

    def _take_lead(self, live: EvictionPolicy | None) -> None:
        """The target leads from now on, with `live` as the live policy (None: the live policy
        stays, with its hints)."""
        self.leader = self.selector.target
        self.switches.append((self.selector.seen, self.leader_name))
        if live is not None:
            self._install(live)

    def _follow_target(self, target: Candidate) -> None:
        """Where every key is sampled the target's shadow is a full-size replica: from now on
        the cache follows it (`_follow`), first evicting the resident keys it does not hold, in
        the live policy's order. The live policy stays, with its own hints, until the cache
        holds what the shadow holds and a copy of the shadow replaces it; one of the target's
        kind (a twin, or a switch back) stays as it is, as a twin switch does elsewhere."""
        if self._merged >= 0 and self._slots[self.selector.target] != self._merged:
            self._unmerge()  # the old leader's shadow goes on as a shadow (twins share one)
        shadow = self._shadows[self._slots[self.selector.target]]  # type: ignore[index]
        held = shadow.resident
        self._strays = KeyQueue()  # a shadow that has not filled has let go of nothing
        if len(held) >= shadow.capacity:
            self._strays = KeyQueue(k for k in self._live.ranked() if k not in held)
        self._following = True
        self._aligned = self._live_make is target.make
        self._take_lead(self._live if self._aligned else None)

    def _track_strays(self, key: Key, hit: int) -> None:
        """Following, not merged, after an access to `key` (`hit`: bit j, shadow j hit it):
        the key is the leading shadow's now; what its miss evicted, if resident, is a stray."""
        strays, lead = self._strays, self._slots[self.leader]
        if strays:
            strays.discard(key)
        if not (hit >> lead) & 1:
            dropped = self._shadows[lead].gone  # type: ignore[index]
            if dropped is not None and dropped in self._keys:
                strays.add(dropped)
                self._aligned = False

    def _follow(self, keep: Callable[[Key], bool]) -> Key | None:
        """Where every key is sampled, after the first switch: the first resident key the
        leading shadow does not hold that `keep` lets go (None if none). Once the cache holds
        exactly what the shadow holds, the live policy becomes a copy of the shadow and makes
        its choices; whatever pulls the two apart again (a delete, a key the tier protects,
        values of different sizes) makes new strays, and the next agreement a new copy. Before
        any switch the live policy is the leader's own, fed since the cache started, and stays:
        a copy of a shadow started when the cache filled knows less (ARC's target size, a
        test's mixed trace: 8 hits fewer in 60,000)."""
        stray = queue_victim(self._strays, keep)
        if stray is not None:
            return stray
        if not self._aligned:
            shadow = self._shadows[self._slots[self.leader]]  # type: ignore[index]
            if self._keys == shadow.resident:
                hinted = self._candidates[self.leader].hinted  # the new leader's, not the live's
                if self._protecting or (self.selector.forked and shadow.hinted != hinted):
                    self._install(copy.deepcopy(shadow.policy))
                else:
                    self._merge()
                self._aligned = True
        return None

    def _merge(self) -> None:
        """Where every key is sampled and nothing is protected (a trace's replay), the leading
        shadow, holding what the cache holds, *is* the live policy from now on: the cache's
        calls drive it, and `pool._observe` takes the cache's hit as its hit instead of
        replaying the access through it a second time. The two would make the same choices
        anyway (`_follow` copied the shadow for that); merged, one policy per access is saved.
        Whatever would set them apart parts them first (`_unmerge`): a delete
        (`_part_on_remove`), a second `victim` before a removal or any `keep` but
        `keep_nothing` (the memory tier's: never merged again; `_part_on_victim`), a switch to
        another shadow, the first hint or `on_cold` before the twins fork (they fork from a
        shadow that has not seen it: `_part_before_fork`), and the tier's bulk hits."""
        slot = self._slots[self.leader]
        shadow = self._shadows[slot]  # type: ignore[index]
        self._install(shadow.policy)
        shadow.resident = self._keys
        self._merged = slot

    def _unmerge(self) -> None:
        """The live policy becomes a copy of the merged shadow's, which goes on alone."""
        shadow = self._shadows[self._merged]  # type: ignore[index]
        shadow.resident = set(self._keys)
        self._install(copy.deepcopy(shadow.policy))
        self._merged = -1

    def _part_before_fork(self) -> None:
        """A hint or `on_cold` before the first hint has reached the shadows: they fork from a
        shadow that has not seen it, so a merged one parts from the cache first."""
        if self._merged >= 0 and not self.selector.forked:
            self._unmerge()

    def _part_on_remove(self, key: Key) -> None:
        """`key` leaves the cache: the victim just named goes with the merged shadow; any other
        (a delete) the shadow must not see, so it parts first. A stray is a stray no more."""
        if self._merged >= 0:
            if key != self._named:
                self._unmerge()
            self._named = None
        self._strays.discard(key)

    def _part_on_victim(self, keep: Callable[[Key], bool]) -> None:
        """Before a victim is named: a `keep` that protects (the memory tier's pinned keys)
        would part the cache from its shadow, so nothing merges again; a second victim before
        a removal moves the live policy's queues, none of the shadow's business."""
        if keep is not keep_nothing and not self._protecting:
            self._protecting = True
            if self._merged >= 0:
                self._unmerge()
        if self._merged >= 0 and self._named is not None:
            self._unmerge()

    def _victim_followed(self, keep: Callable[[Key], bool]) -> Key | None:
        """The victim, once the pool has switched if it had to: a stray first where the cache
        follows its shadow, else the live policy's (merged: remembered, for `_part_on_remove`)."""
        if self._following:
            stray = self._follow(keep)
            if stray is not None:
                return stray
        if self._merged >= 0:
            self._named = self._live.victim(keep)
            return self._named
        return self._live.victim(keep)

    def ranked(self) -> list[Key]:
        return self._live.ranked()
