"""The memory tier's default policy: follow the best of a pool, online, by miniature simulation.

Waldspurger et al., "Cache Modeling and Optimization using Miniature Simulations" (USENIX ATC
2017), over SHARDS' spatial sampling (FAST 2015): keys whose hash falls under a threshold (a rate
R of the key space) are replayed through a shadow of every candidate (`candidates.CANDIDATES`),
each of R x the cache's size; over the last `window` sampled accesses, the shadow with the most
hits names the policy that evicts for the real cache (with its family: "Hints" below; the
choice is `selector.Selector`'s, the following this module's). The
shadows see only the trace and the hints, never the live policy's choices, so the live choice
cannot feed back into its own score.
What each rule below gained, cell by cell: docs/robustness-log.md, "How the pool got here".

A switch. Only the leader keeps state for the real cache, and a real cache cannot take a
shadow's contents, so a switch pays until the new leader has refilled it. The new leader is
rebuilt by replaying the cache's last `MAX_HISTORY` accesses, spread over evictions
(`shadows.Rebuild`: done at once, the replay held the tier's lock for up to 177 ms; only
evictions drive it, so the tier's bulk hits and a replay's eager ones switch at the same point),
then reconciled with what is resident: keys it would hold that are gone become its ghosts
(`EvictionPolicy.on_lost`), resident keys it does not know stay with the old leader, which
evicts them first (`handover.Handover`). The rebuild also checks the switch on every key: it
is made only where the replay has hit more than the cache did over the same accesses (the
shadows chose on a sample, and the refill is a cost no shadow counts); else it is called off
and asked again later (`SWITCH_GAIN_Z`). Rejected: handing the keys over
in the old leader's order with no history (LIRS taking over on gli at 20% then hit 0.128, alone
0.337); keeping every candidate's metadata for the real cache (set dueling): with eight
candidates every miss costs eight inserts and removals, and evicting by their weighted proposals
(LeCaR's per-eviction weighting, 2026-12-07) undid each candidate's structure: the 44 cells of
`robustness.py` 23-38 short, summed margin -0.63 to -2.01 (following a shadow: 11, +0.054).

Where every key is sampled (caches of at most 2 x `min_shadow` entries: `EXACT_FROM`), each
shadow is a full-size replay and the cache follows the leading one exactly, with no rebuild
(`following.ShadowFollowing`, the base of `PoolPolicy`).

Hints: a candidate marked "hinted" gets the tail / conversation hints and `on_cold`; the others
never see them. A hinted candidate and its plain twin both have shadows, and they are one
family, scored by the member whose hints have been shown to help (`selector.Selector`), so a
premature "conversation ended" that cools pages the next turn needs loses to the plain twin.
Until a hint reaches the shadows, a hinted candidate's shadow would replicate its twin's, so one
serves both; the first hint forks them by a copy (`_fork`: 38 ms once for a 131,072-entry
cache), and a node without hints runs eight shadows, not eleven.

Per sampled access the selector touches only the candidates whose hit differs from the access
leaving the window (most accesses hit or miss in every shadow alike), where every key is
sampled it keeps no history and computes no hash, a shadow's miss evicts in one call
(`EvictionPolicy.evict`), and the candidates' queues are compiled linked lists (`key_queue`,
ADR 0017): what pays for eight shadows, against the replay goal of 200,000 accesses/s
(docs/robustness.md, "The replay's speed", for where it stands).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from cache_runtime.candidates import CANDIDATES, DEFAULT_POOL, Candidate
from cache_runtime.following import ShadowFollowing
from cache_runtime.handover import Handover
from cache_runtime.key_queue import KeyQueue
from cache_runtime.policies import EvictionPolicy, Key, keep_nothing
from cache_runtime.selector import Selector
from cache_runtime.shadows import SPOT_BITS, Rebuild, Shadow, spot

if TYPE_CHECKING:
    from cache_runtime.settings import PolicySettings


# as `settings.PolicySettings`' defaults (a test holds them equal)
DEFAULT_SAMPLE_RATE = 1 / 16
DEFAULT_WINDOW = 4096  # sampled accesses
DEFAULT_HYSTERESIS = 0.005  # a challenger must lead by this share of the window's accesses
DEFAULT_MIN_SHADOW = 128  # entries per shadow at least: the rate rises for small caches
# the accesses kept to rebuild a new leader at a switch, whatever the cache's size: the more of
# the past the rebuild sees, the nearer it comes to the leader's own state (summed margin over
# the 44 cells: 8,192 -0.079; 16,384 to 262,144 -0.053 to -0.059)
MAX_HISTORY = 1 << 16
# where every key is sampled, a switch needs this share of the hysteresis as its lead: the cache
# follows the exact shadow there (`_follow`), so a switch costs only the refill of the keys the
# two disagree on (0.5: worst ratio 0.910 -> 0.922; 0.25 switched back and forth on cs 5%).
# A twin is chosen on the same lead as any switch, not half: it rescores its family, and on half
# Mooncake's tail hint at 5% and 10% fell below no hints (`Selector.retarget`)
CHEAP_LEAD = 0.5
# a switch is made only once its rebuild, replaying every key, has hit more than the cache itself
# did over the same history, by more than SWITCH_GAIN_Z standard deviations of the accesses where
# the two differ (`shadows.Rebuild.gains_on_cache`, McNemar's test, one-sided); else it is called
# off and tried again RETRY_SHARE of a window later, when the history holds more evidence. The
# shadows choose on a sample, and the refill after a switch is a cost no shadow counts: the full
# replay must show a gain, not just fail to show a loss. `benchmarks/pool_sweep.py`, cells short
# / summed margin over command, held out, generated (2026-12-07): 11 / +0.0629, 11 / +0.1209,
# 26 / -0.2052 with the check before (a switch called off only where its rebuild hit
# significantly less, z = 2, then for a whole window) -> 11 / +0.0844, 10 / +0.1375, 24 /
# -0.1959, the worst ratios within 0.0015. multi3 10% 0.4623 -> 0.4859 (LIRS kept, as its full
# size says) and 7% 0.4280 -> 0.4487; web07 20% 0.6278 -> 0.6228 (the early move to ARC waits
# for its evidence). z = 0: +0.0654 on the command's cells; 0.5: 26 generated cells short; 1.5
# and 2: 12 command cells short. Asked again after 512 sampled accesses: 12 held-out cells short
# (2,048: within 0.004 of 1,024 on every group; docs/robustness-log.md has each run).
# In the memory tier the cache's hits include keys it protects (pinned, a KV page's parents),
# which a rebuild may evict: there the check leans toward calling a switch off
SWITCH_GAIN_Z = 1.0
RETRY_SHARE = 0.25
# where the rate `min_shadow` needs is this or more, every key is sampled: sampling would save
# at most half the shadows' work, and the cache then follows its exact shadow with no rebuild
# at a switch (caches of 129-256 entries at the defaults; with W-TinyLFU in the pool, summed
# +0.017 over the 44 cells, +0.038 at the 40 held-out sizes). A configured `sample_rate` stays
EXACT_FROM = 0.5


@mypyc_attr(allow_interpreted_subclasses=True)
class PoolPolicy(ShadowFollowing):
    """Follows the family (a candidate and its hinted twin) whose shadow hit most over the last
    `window` sampled accesses (see the module docstring and `Selector`). `pool`: names from
    `CANDIDATES`, the first leads until the shadows say otherwise; `sample_rate`: the share of
    keys sampled, raised for small caches so that each shadow holds `min_shadow` entries (1.0
    replays every key at full size); `hysteresis`: the lead, as a share of the window, a
    challenger needs to take over. `capacity` in entries when known (unit-size replay); else
    learned when the cache fills, and again where the memory tier says its entries have moved
    (values of different sizes in one byte budget: `resize`)."""

    name = "preheat"

    def __init__(
        self,
        pool: Sequence[str] = DEFAULT_POOL,
        sample_rate: float = DEFAULT_SAMPLE_RATE,
        window: int = DEFAULT_WINDOW,
        hysteresis: float = DEFAULT_HYSTERESIS,
        min_shadow: int = DEFAULT_MIN_SHADOW,
        capacity: int | None = None,
    ) -> None:
        unknown = [name for name in pool if name not in CANDIDATES]
        if unknown or not pool:
            raise ValueError(f"pool {list(pool)}: choose from {', '.join(CANDIDATES)}")
        if not (0 < sample_rate <= 1 and window > 0 and hysteresis >= 0 and min_shadow > 0):
            raise ValueError("need 0 < sample_rate <= 1, window > 0, hysteresis >= 0")
        candidates = [CANDIDATES[name] for name in pool]
        super().__init__(pool, candidates, Selector(candidates, window, hysteresis))
        self.sample_rate, self.min_shadow, self.hysteresis = sample_rate, min_shadow, hysteresis
        self._by_hits: dict[int, int] = {}  # shadows' hit bits -> candidates' (for `_slots`)
        self._threshold = -1  # sampled: spot(key) < threshold; none before the duel starts
        self._sampled: set[object] = set()  # resident keys that are sampled
        self._history: deque[Key] = deque(maxlen=MAX_HISTORY)  # to rebuild a new leader
        self._history_hits: deque[bool] = deque(maxlen=MAX_HISTORY)  # the cache's, for the check
        self._rebuild: Rebuild | None = None  # while a switch is under way
        # candidate -> the sampled accesses until which a switch to it stays called off
        self._called_off: dict[int, int] = {}
        self._exact = False  # every key sampled: the shadows are full-size replicas
        if capacity is not None:
            self._start(capacity, fresh=True)

    @classmethod
    def from_settings(cls, settings: PolicySettings) -> PoolPolicy:
        """The pool `settings` describe (`Settings.policy`)."""
        return cls(
            settings.pool or DEFAULT_POOL,
            settings.sample_rate,
            settings.window,
            settings.hysteresis,
            settings.min_shadow,
        )

    @property
    def effective_rate(self) -> float | None:
        """The sampling rate in use, once the cache's size is known."""
        return None if self._shadows is None else self._rate

    def _start(self, capacity: int, fresh: bool = False) -> None:
        floor = self.min_shadow / max(1, capacity)  # the rate a shadow of `min_shadow` needs
        self._rate = 1.0 if floor >= EXACT_FROM else max(self.sample_rate, min(1.0, floor))
        self._threshold = round(self._rate * (1 << SPOT_BITS))
        size = round(self._rate * capacity)
        family = self.selector.family  # a hinted twin shares its head's shadow until `_fork`
        own = [i for i, head in enumerate(family) if head == i]
        self._shadows = [
            Shadow(self._candidates[i].make(), size, self._candidates[i].hinted) for i in own
        ]
        self._slots = [own.index(head) for head in family]
        self._by_hits = {}
        threshold = self._threshold
        self._exact = self._rate == 1.0
        if self._exact:  # every key sampled: one set, and no history (nothing is rebuilt)
            self._sampled = self._keys
            self._history = deque(maxlen=0)
            self._history_hits = deque(maxlen=0)
        else:
            self._sampled = {key for key in self._keys if spot(key) < threshold}
            if self._history.maxlen == 0:  # a resize from every key sampled: it starts now
                self._history = deque(maxlen=MAX_HISTORY)
                self._history_hits = deque(maxlen=MAX_HISTORY)
        self.selector.lead = self.hysteresis * (CHEAP_LEAD if self._exact else 1.0)
        if self._exact and fresh:  # nothing fed yet: the live policy and its shadow are one
            self._merge()

    def resize(self, entries: int) -> None:
        """The memory tier's entries have moved (`memory.RESIZE_AT`): the shadows start again
        for `entries`, and the live policy takes the new size in place, as a policy alone does
        (`EvictionPolicy.resize`). What followed the old shadows stops: a merged shadow parts
        from the cache, the cache stops following (until the next switch), and a rebuild under
        way is dropped (the switch is asked again at the next eviction, at the new size). The
        selector's window stays: its bits are the candidates', not the shadows'. A node that had
        forked its hinted twins forks them again. Before the first eviction there is nothing to
        resize: the shadows are built for the entries the cache holds then.

        Rejected: the live policy made again at the new size, rebuilt from the history as a
        switch makes a new leader (twenty-ninth session). In a tier whose mix of value sizes
        does not change (5% of the keys 10 KB, the rest 100 B, 100 KB), the entries at an
        eviction still drift past a quarter now and then, and each rebuild cost more than the
        size gained: 0.3765 / 0.4121 / 0.3737 on three such runs, 0.4111 / 0.4201 / 0.4185 in
        place, 0.4079 / 0.4133 / 0.3985 never told. It won only where a loop 1.3 x the cache
        came after three values of 40% of the budget (0.70 against 0.37 in place): LIRS kept
        one of them in its LIR set, which counts entries, not bytes; the rebuild forgot it."""
        if self._shadows is None:
            return
        if self._merged >= 0:
            self._unmerge()
        self._following, self._aligned, self._strays = False, False, KeyQueue()
        self._rebuild = None
        self._start(entries)
        if self.selector.forked:
            self._fork()
        self._live.resize(entries)

    def _fork(self) -> None:
        """The first hint: each hinted candidate sharing its twin's shadow gets a copy of it."""
        shadows = self._shadows
        if shadows is None:  # no shadows yet: they start shared when the cache fills
            return
        self.selector.forked = True
        for i, candidate in enumerate(self._candidates):
            shared = shadows[self._slots[i]]
            if candidate.hinted and not shared.hinted:
                self._slots[i] = len(shadows)
                self._by_hits = {}
                shadows.append(shared.replica(True))

    def _observe(self, key: Key, hint: str | None, cached: bool) -> None:
        if hint is not None and not self.selector.forked:
            self._fork()
        # bit masks, not tuples of bools: nothing to allocate per access (cs: 1.07x)
        shadows, slots, merged = self._shadows or [], self._slots, self._merged
        hit = 0  # bit j: shadow j hit
        for j in range(len(shadows)):
            if j == merged:  # the live policy has taken the access: the cache's hit is its
                if cached:
                    hit |= 1 << j
            elif shadows[j].access(key, hint):
                hit |= 1 << j
        if self._following and merged < 0:
            self._track_strays(key, hit)
        result = self._by_hits.get(hit)  # bit i: candidate i's shadow hit
        if result is None:
            result = 0
            for i in range(len(slots)):
                if (hit >> slots[i]) & 1:
                    result |= 1 << i
            self._by_hits[hit] = result
        self.selector.record(result)

    def _switch(self) -> None:
        """Move the lead toward the target: where every key is sampled, at once, the cache then
        following the target's shadow (`_follow_target`); between a hinted candidate and its
        plain twin, the same object from now on with or without the hints; else one more slice
        of the rebuild (see the module docstring), handed over once it has caught up."""
        target = self._candidates[self.selector.target]
        if self._exact:
            self._follow_target(target)
            return
        if target.make is self._candidates[self.leader].make:  # its state stays right
            self._rebuild = None
            self._take_lead(self._live)
            return
        if self._called_off.get(self.selector.target, 0) > self.selector.seen:
            self._rebuild = None  # the full replay contradicted this switch not long ago
            return
        rebuild = self._rebuild
        if rebuild is None or rebuild.make is not target.make:
            # checked against the cache's own hits, unless the target is hinted: a rebuild
            # replays no hints, so it cannot show what they are worth
            cached = None if target.hinted else self._history_hits
            rebuild = Rebuild(target.make, len(self._keys), self._history, cached)
            self._rebuild = rebuild
        if rebuild.advance():
            self._rebuild = None
            if not self._switch_pays(rebuild, target):
                # the full replay does not show the gain the sample did: stay, and ask again
                retry = self.selector.seen + int(RETRY_SHARE * (self.selector.window.maxlen or 0))
                self._called_off[self.selector.target] = retry
                return
            self._take_lead(self._handed_over(rebuild.shadow))

    def _switch_pays(self, rebuild: Rebuild, target: Candidate) -> bool:
        """The check before a switch (`SWITCH_GAIN_Z`), apart from the switch's mechanics so
        that each is tested alone. A hinted target is never judged; a plain one whose rebuild
        began for its hinted twin has no counts, so it is not either (the twins swap places
        mid-rebuild)."""
        return target.hinted or not rebuild.judged or rebuild.gains_on_cache(SWITCH_GAIN_Z)

    def _handed_over(self, rebuilt: Shadow) -> EvictionPolicy:
        """The rebuilt policy made to agree with what is really resident: keys it would hold
        that are gone become its ghosts; the resident keys it does not know stay with the old
        leader, which evicts them first (`Handover`; the keys both know leave the old leader
        later, as it names them). One pass in Python over what the rebuilt policy holds; over
        the cache, only a set difference."""
        leader, old, resident = rebuilt.policy, self._live, self._keys
        for key in leader.ranked():  # in the policy's order, not a set's (hash-seeded) one
            if key not in resident:
                leader.on_lost(key)
        legacy = resident - rebuilt.resident
        return Handover(leader, old, legacy) if legacy else leader

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._history.append(key)
        self._history_hits.append(False)
        if self._rebuild is not None:
            self._rebuild.feed(key, False)
        if hint is not None:
            self._part_before_fork()
        self._keys.add(key)  # where every key is sampled, also `_sampled`: the same set
        self._live.on_insert(key, now, hint if self._hinted else None)
        if self._exact:
            self._observe(key, hint, False)
        elif spot(key) < self._threshold:
            self._sampled.add(key)
            self._observe(key, hint, False)

    def on_access(self, key: Key, now: float) -> None:
        self._history.append(key)
        self._history_hits.append(True)
        if self._rebuild is not None:
            self._rebuild.feed(key, True)
        self._live.on_access(key, now)
        if key in self._sampled:
            self._observe(key, None, True)

    def on_access_many(self, keys: Sequence[Key]) -> None:
        """The leader in bulk; the shadows replay the sampled hits one by one, repeats
        included (a shadow, smaller than the cache, may miss and evict between them). Keys
        removed since they were read (a concurrent delete in the tier) are skipped: the tier
        does not filter for a policy that overrides this, and MQ's, LIRS's and W-TinyLFU's
        `on_access` expect a cached key."""
        if self._merged >= 0:
            self._unmerge()
        keys = [key for key in keys if key in self._keys]
        self._live.on_access_many(keys)
        self._history.extend(keys)
        self._history_hits.extend(repeat(True, len(keys)))
        if self._rebuild is not None:
            self._rebuild.feed_many(keys)
        for key in filter(self._sampled.__contains__, keys):
            self._observe(key, None, True)

    def on_remove(self, key: Key) -> None:
        if self._merged >= 0 or self._strays:  # a call per eviction only where it has work
            self._part_on_remove(key)
        self._keys.discard(key)
        self._sampled.discard(key)
        self._live.on_remove(key)

    def on_cold(self, key: Key) -> None:
        self._part_before_fork()
        if self._hinted and self._merged < 0:  # merged, the shadow's `cool` is the live's
            self._live.on_cold(key)
        if key in self._sampled:
            if not self.selector.forked:
                self._fork()
            for shadow in self._shadows or ():
                shadow.cool(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if self._merged >= 0 or keep is not keep_nothing:
            self._part_on_victim(keep)
        if self._shadows is None:  # the cache just filled: its size in entries is known now
            self._start(len(self._keys))
        live = self._live
        if isinstance(live, Handover) and not live.legacy:  # the old leader's keys are gone
            self._install(live.leader)
        if self.selector.target != self.leader:
            self._switch()
        elif self._rebuild is not None:  # the old leader won back its lead: drop the rebuild
            self._rebuild = None
        if self._following or self._merged >= 0:
            return self._victim_followed(keep)
        return self._live.victim(keep)
