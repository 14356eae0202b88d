"""The memory tier's default policy: follow the best of a pool, online, by miniature simulation.

Waldspurger et al., "Cache Modeling and Optimization using Miniature Simulations" (USENIX ATC
2017), over SHARDS' spatial sampling (FAST 2015): keys whose hash falls under a threshold (a rate
R of the key space) are replayed through a shadow of every candidate, each of R x the cache's
size; over the last `window` sampled accesses, the shadow with the most hits names the policy
that evicts for the real cache. The shadows see only the trace and the hints, never the live
policy's choices, so the live choice cannot feed back into its own score.

Only the leader keeps state for the real cache. A switch rebuilds the new leader by replaying
the cache's last `MAX_HISTORY` accesses through it in a simulated cache of the same size, then
reconciles with what is really resident: keys it would hold that are gone become its ghosts
(`EvictionPolicy.on_lost`: when one returns, it goes where the new leader would have kept it),
resident keys it does not know stay with the old leader, which evicts them first
(`handover.Handover`, with its figures). A real cache cannot take a shadow's contents, so a
switch pays until the new leader has refilled the cache; the ghosts make that refill one reuse
per key. Over the 44 cells of `benchmarks/robustness.py`
(2026-12-05) the summed margin to the best libCacheSim policy went from -0.130 (8 accesses per
entry, gone keys forgotten) to -0.059, the worst ratio from 0.63 to 0.88 (cs 5%: S3-FIFO's main
queue, frozen on a loop larger than the cache, was never rebuilt). Either half alone was worse
or less: ghosts with 8 accesses per entry -0.138, the longer history alone -0.095.
Rejected: handing the keys over in the old leader's eviction order, with no history (the first
handoff): LIRS taking over on gli at 20% then hit 0.128 where LIRS alone hits 0.337.
Rejected: keeping every candidate's metadata for the real cache (set dueling, as the previous
two-member `DuelingPolicy` did): with eight candidates every miss costs eight inserts and
removals, and the replay fell to a sixth of LRU's speed; a switch costs one replay of the
history and one pass over what the new leader knows, and hysteresis keeps switches rare.

Where every key is sampled (caches of at most 2 x `min_shadow` entries: `EXACT_FROM`), each
shadow is itself a full-size replay of the trace since the cache filled, so the cache follows
the leading one
exactly, with no rebuild (`_follow`): it evicts first the resident keys that shadow does not
hold (at a switch, in the old leader's order; later, as the shadow drops them), and whenever it
holds exactly what the shadow holds, the live policy becomes a copy of the shadow and makes the
same choices. Against the previous design, a copy at the switch whose lost keys
became ghosts, over the 44 cells (2026-12-06): summed margin to the best libCacheSim policy
-0.035 -> -0.027, worst ratio 0.879 -> 0.910 (cs 5%), cells short 16 -> 15 (multi1 1%: 0.171 ->
0.180); the 40 cells at sizes the command does not measure +0.033 summed. That copy, left to
itself, stayed apart from the shadow for good: on cs at 5%, 9 of 70 keys after the switch, on
every pass of a loop larger than the cache. Following exactly up to 256 entries (rate 1
wherever the sampling would be 0.5 or more) was mixed at first (+0.012 on the 44 cells, -0.001
on the 40); with W-TinyLFU in the pool it is what keeps that candidate's detours cheap
(`EXACT_FROM`).

Elsewhere the rebuild is spread over evictions (`shadows.Rebuild`): each `victim` call replays
`REBUILD_STEP` accesses of the history plus those that came since the previous call, and the
old leader keeps evicting until the rebuild has caught up. A switch runs on the serving path,
under the memory tier's lock: done at once, the replay of 65,536 accesses held that lock for
17-177 ms (`victim`'s slowest call over 12 cells, 2026-12-05), stalling every request on the
node. Only evictions drive it, so the tier's buffered hits (applied in bulk) and a replay's
eager hits switch at the same point and evict the same keys.

Hints: a candidate marked "hinted" gets the tail / conversation hints and `on_cold`; the others
never see them. A hinted candidate and its plain twin both have shadows, so the hint is used
only as far as the shadows show it helps (a premature "conversation ended" that cools pages
the next turn needs loses to the plain twin, and the plain twin leads): the two are a family,
scored by the one whose hints have been shown to help or not (`_retarget`).
Until a hint reaches the shadows, a hinted candidate's shadow is an exact replica of its plain
twin's, so one shadow serves both; the first hint forks them by a copy (`_fork`: once, under
the tier's lock, 38 ms for a 131,072-entry cache's 8,192-entry shadows, 6 ms for 1,024; a node
whose requests carry hints from the start forks while the shadows are still empty, since they
start when the cache first fills). A trace or node without hints runs six shadows, not nine:
over the 44 cells, the same hits in every cell, and 1.05-1.5x the accesses per second (cs,
every key sampled: 160,000 -> 216,000). With "mq-short" in, seven and ten; with "wtinylfu",
eight and eleven.

Per sampled access the selector touches only the candidates whose hit differs from the access
leaving the window (most accesses hit or miss in every shadow alike), and where every key is
sampled it keeps no history and computes no hash: the same hits in all 84 cells of the sweep
(the 44 and 40 held-out sizes), cs 225,600 -> 254,500 accesses/s with six shadows (2026-12-06),
which paid for the seventh. The eighth (W-TinyLFU) was paid for where every key is sampled
and nothing is protected, as in a trace's replay: the leading shadow, holding what the cache
holds, is the live policy itself (`_merge`), so the cache's calls drive it and it is not
replayed twice; and a shadow's miss evicts in one call (`EvictionPolicy.evict`). cs replays
at about 224,000 accesses/s, as before the eighth (225,000; best of 3, runs alternated, with
the same hits in all 84 cells of the sweep as without either, 2026-12-06).
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, NamedTuple

from mypy_extensions import mypyc_attr

from cache_runtime.handover import Handover
from cache_runtime.policies import EvictionPolicy, Key, LRUPolicy, first_evictable, keep_nothing
from cache_runtime.prefix_policies import PrefixARC, PrefixSLRU
from cache_runtime.queue_policies import LIRSPolicy, MQPolicy, S3FIFOPolicy, WTinyLFUPolicy
from cache_runtime.shadows import SPOT_BITS, Rebuild, Shadow, spot

if TYPE_CHECKING:
    from cache_runtime.settings import PolicySettings


class Candidate(NamedTuple):
    make: Callable[[], EvictionPolicy]
    hinted: bool  # gets Hint.TAIL / Hint.CONVERSATION on insert and `on_cold`
    why: str


# Each is in because a shipped or reported trace has it ahead of the others somewhere
# (`preheat bench cache`, 2026-12-02; issue 21 for the unshipped conversation trace).
CANDIDATES: dict[str, Candidate] = {
    # first: it leads until the shadows disagree. LIRS is the one whose state a late switch
    # loses most (its LIR set forms over the first pass); first, the worst margin to the best
    # libCacheSim policy over the shipped traces went from -0.209 (gli 20%) to -0.039. Its
    # hinted twin first: an application's explicit close counts before the shadows have
    # evidence (Mooncake 10%, before EARLY_WINDOW: 12.4% of the LRU-Belady gap; 9.9% with
    # plain LIRS first)
    "prefix-lirs": Candidate(LIRSPolicy, True, "LIRS with the application's hints"),
    "lirs": Candidate(LIRSPolicy, False, "the LIRS block traces: loops larger than the cache"),
    "prefix-arc": Candidate(PrefixARC, True, "ARC with the application's hints"),
    "prefix-slru": Candidate(PrefixSLRU, True, "SLRU with the application's hints"),
    "lru": Candidate(LRUPolicy, False, "a real conversation trace at 20%: above MQ and ARC"),
    "mq": Candidate(MQPolicy, False, "Mooncake at 5% and 20%, a real conversation trace 1-10%"),
    # MQ's lifetime (accesses a key may go unread before it drops a queue) decides between
    # frequency and recency, and no one lifetime serves every cache: MQ alone at 1 and 16 x the
    # cache's size, sprite 5%: 0.682 vs 0.641; Mooncake 20%: 0.417 vs 0.396; multi1 1%: 0.027 vs
    # 0.181. Over the 44 cells of `benchmarks/robustness.py` (2026-12-06), with it in: summed
    # margin to the best libCacheSim policy -0.022 -> -0.006, cells short 15 -> 13, sprite 20%
    # below LRU -0.0085 -> -0.0031; the 40 held-out sizes +0.035. Rejected: 2 x the size
    # (Mooncake 1% 0.9045 of the best online policy), in place of ARC (Mooncake 5-10% fell)
    "mq-short": Candidate(
        partial(MQPolicy, life=1.0), False, "sprite 2-20%, Mooncake 20%: recency among the hot"
    ),
    "arc": Candidate(PrefixARC, False, "small caches whose reuse distances shift"),
    "slru": Candidate(PrefixSLRU, False, "a protected working set that fits (Mooncake 10%)"),
    "s3fifo": Candidate(S3FIFOPolicy, False, "cache2k web07 at 1%: one-hit wonders"),
    # W-TinyLFU: libCacheSim's led every candidate at cs 20% and ps 5% (0.1687, 0.3620; the
    # pool 0.1593, 0.3357). In, over the 44 cells (2026-12-06, with `EXACT_FROM`): summed
    # margin to the best libCacheSim policy -0.006 -> +0.056, the 40 held-out sizes +0.159;
    # cs 20%, ps 5% and cpp 20% reach the best, but multi2 10-20% and multi3 10% fall short
    # (the shadows follow it for a while where LIRS wins at full size: multi3 10% -0.026); 13
    # cells short as before, worst ratio unchanged (cs 5%). Rejected twice before, when a
    # switch still cost more than it gained (ninth session: the worst ratio 0.77, cs 5%)
    "wtinylfu": Candidate(WTinyLFUPolicy, False, "cs 20%, ps 5%: frequency that outlives eviction"),
}
DEFAULT_POOL = tuple(CANDIDATES)
# as `settings.PolicySettings`' defaults (a test holds them equal)
DEFAULT_SAMPLE_RATE = 1 / 16
DEFAULT_WINDOW = 4096  # sampled accesses
DEFAULT_HYSTERESIS = 0.005  # a challenger must lead by this share of the window's accesses
DEFAULT_MIN_SHADOW = 128  # entries per shadow at least: the rate rises for small caches
# the accesses kept to rebuild a new leader's state at a switch, whatever the cache's size: the
# more of the past the rebuild sees, the nearer it comes to the state the leader would have had
# (over the 44 cells, summed margin to the best online policy: 8,192 -0.079; 16,384 to 262,144
# -0.053 to -0.059). A switch runs inside `victim`, on the serving path: replaying 65,536
# accesses at once took 17-177 ms (caches of 71 to 8,785 entries, 2026-12-05): `REBUILD_STEP`.
MAX_HISTORY = 1 << 16
# the hysteresis counts at least this many sampled accesses: early on, a challenger needs
# about 5 hits of lead, not 1 (over the shipped traces: cells more than 0.003 below the best
# libCacheSim policy 18 -> 16 of 44; sprite 5-20% lost its early detours to MQ)
EARLY_WINDOW = 1024
# where every key is sampled, a switch needs this share of the hysteresis as its lead: there the
# cache follows the exact shadow (`_follow`), so a switch costs only the refill of the keys the
# two disagree on. Over the 44 cells (2026-12-06) 0.5 gave +0.0047 summed and
# +0.0076 at the 40 held-out sizes, no cell down by more than 0.0007 (worst ratio, cs 5%: 0.910
# -> 0.922); 0.25 +0.0028 and +0.0093 but cs 5% 0.836; 2 +0.0030 and -0.0016. A switch between
# a hinted candidate and its plain twin costs nothing anywhere (the same policy, hints on or
# off), but it needs the lead any switch needs there: choosing a twin also rescores its family
# (`_retarget`), and with this share instead, Mooncake's tail hint at 5 and 10% went below no
# hints (0.1619 and 0.2686 against 0.1631 and 0.2701; with the lead of any switch 0.1619 and
# 0.2701: 10% no longer, 5% still)
CHEAP_LEAD = 0.5
# where the rate `min_shadow` needs is this or more, every key is sampled: sampling would save
# at most half the shadows' work, and the cache then follows its exact shadow with no rebuild at
# a switch (caches of 129-256 entries at the defaults). Over the 44 cells (2026-12-06, with
# W-TinyLFU in the pool): cs 10% 0.0720 -> 0.0838 (+0.012: W-TinyLFU's detour there, rebuilt),
# summed +0.017, the 40 held-out sizes +0.038; without W-TinyLFU +0.014 and -0.002
# (the fourteenth session's mixed result). A configured `sample_rate` is kept as it is
EXACT_FROM = 0.5


@mypyc_attr(allow_interpreted_subclasses=True)
class PoolPolicy(EvictionPolicy):
    """Follows the family (a candidate and its hinted twin) whose shadow hit most over the last
    `window` sampled accesses (see the module docstring and `_retarget`). `pool`: names from
    `CANDIDATES`, the first leads until the shadows say otherwise; `sample_rate`: the share of
    keys sampled, raised for small caches so that each shadow holds `min_shadow` entries (1.0
    replays every key at full size); `hysteresis`: the lead, as a share of the window, a
    challenger needs to take over. `capacity` in entries when known (unit-size replay); else
    learned when the cache fills."""

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
        self.pool = tuple(pool)
        self._candidates = [CANDIDATES[name] for name in self.pool]
        self.sample_rate, self.min_shadow, self.hysteresis = sample_rate, min_shadow, hysteresis
        self._window: deque[int] = deque(maxlen=window)  # bit i: candidate i's shadow hit
        self._wins = [0] * len(self.pool)
        self._shadows: list[Shadow] | None = None  # one per distinct state (`_fork`)
        self._slots: list[int] = []  # each candidate's shadow in `_shadows`
        self._by_hits: dict[int, int] = {}  # shadows' hit bits -> candidates' (for `_slots`)
        self._forked = False  # a hint has reached the shadows: hinted twins have their own
        self._threshold = -1  # sampled: spot(key) < threshold; none before the duel starts
        self._sampled: set[object] = set()  # resident keys that are sampled
        self._keys: set[Key] = set()  # resident keys: what a switch hands over (`Handover`)
        self.leader = self.target = 0
        self.switches: list[tuple[int, str]] = []  # (sampled accesses so far, new leader)
        self._seen = 0
        self._history: deque[Key] = deque(maxlen=MAX_HISTORY)  # to rebuild a new leader
        self._rebuild: Rebuild | None = None  # while a switch is under way
        self._exact = False  # every key sampled: the shadows are full-size replicas
        self._lead = hysteresis  # a switch's lead, a share of the window (`CHEAP_LEAD` if exact)
        self._following = False  # exact, since the first switch: the cache follows (`_follow`)
        self._strays: dict[Key, None] = {}  # following: resident keys the leading shadow lacks
        self._aligned = False  # following: the live policy makes the leading shadow's choices
        self._merged = -1  # the slot whose shadow's policy is the live policy (`_merge`)
        self._protecting = False  # a victim was asked with a `keep` that protects: never merge
        self._named: Key | None = None  # merged: the victim just named, which goes next
        # families: a plain candidate and the hinted twins that share its policy (`_plain_twin`),
        # named by the plain one, their head (a hinted candidate with no plain twin heads its
        # own). Heads in the pool's order of their first member: on a tie the first wins
        self._family = [i if (j := self._plain_twin(i)) is None else j for i in range(len(pool))]
        self._heads = list(dict.fromkeys(self._family))
        self._twinned = [
            (head, [i for i, f in enumerate(self._family) if f == head])
            for head in self._heads
            if self._family.count(head) > 1
        ]
        # the member each family is scored by and, leading, followed with (`_retarget`): the
        # plain one until a twin's hints are shown to help; the first candidate's own at start
        self._choice = list(range(len(pool)))
        self._choice[self._family[0]] = 0
        self._install(self._candidates[0].make())
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
    def leader_name(self) -> str:
        return self.pool[self.leader]

    @property
    def effective_rate(self) -> float | None:
        """The sampling rate in use, once the cache's size is known."""
        return None if self._shadows is None else self._rate

    def _install(self, live: EvictionPolicy) -> None:
        """`live`, the leader's policy, evicts from now on."""
        self._live = live
        self._hinted = self._candidates[self.leader].hinted
        # the candidate whose kind the live policy is: not its type, for two candidates share
        # one (MQ at two lifetimes)
        self._live_make = self._candidates[self.leader].make

    def _start(self, capacity: int, fresh: bool = False) -> None:
        floor = self.min_shadow / max(1, capacity)  # the rate a shadow of `min_shadow` needs
        self._rate = 1.0 if floor >= EXACT_FROM else max(self.sample_rate, min(1.0, floor))
        self._threshold = round(self._rate * (1 << SPOT_BITS))
        size = round(self._rate * capacity)
        twins = [self._plain_twin(i) for i in range(len(self.pool))]
        own = [i for i, twin in enumerate(twins) if twin is None]
        self._shadows = [
            Shadow(self._candidates[i].make(), size, self._candidates[i].hinted) for i in own
        ]
        self._slots = [own.index(i if twin is None else twin) for i, twin in enumerate(twins)]
        self._by_hits = {}
        threshold = self._threshold
        self._exact = self._rate == 1.0
        if self._exact:  # every key sampled: one set, and no history (nothing is rebuilt)
            self._sampled = self._keys
            self._history = deque(maxlen=0)
        else:
            self._sampled = {key for key in self._keys if spot(key) < threshold}
        self._lead = self.hysteresis * (CHEAP_LEAD if self._exact else 1.0)
        if self._exact and fresh:  # nothing fed yet: the live policy and its shadow are one
            self._merge()

    def _plain_twin(self, i: int) -> int | None:
        """The plain candidate whose shadow candidate `i` shares while no hint has come."""
        candidate = self._candidates[i]
        if not candidate.hinted:
            return None
        for j, other in enumerate(self._candidates):
            if not other.hinted and other.make is candidate.make:
                return j
        return None

    def _fork(self) -> None:
        """The first hint: each hinted candidate sharing its twin's shadow gets a copy of it."""
        shadows = self._shadows
        if shadows is None:  # no shadows yet: they start shared when the cache fills
            return
        self._forked = True
        for i, candidate in enumerate(self._candidates):
            shared = shadows[self._slots[i]]
            if candidate.hinted and not shared.hinted:
                self._slots[i] = len(shadows)
                self._by_hits = {}
                shadows.append(shared.replica(True))

    def _observe(self, key: Key, hint: str | None, cached: bool) -> None:
        if hint is not None and not self._forked:
            self._fork()
        # bit masks, not tuples of bools: nothing to allocate per access (cs: 1.07x)
        shadows, slots, wins, merged = self._shadows or [], self._slots, self._wins, self._merged
        hit = 0  # bit j: shadow j hit
        for j in range(len(shadows)):
            if j == merged:  # the live policy has taken the access: the cache's hit is its
                if cached:
                    hit |= 1 << j
            elif shadows[j].access(key, hint):
                hit |= 1 << j
        if self._following and merged < 0:
            strays, lead = self._strays, slots[self.leader]
            if strays:
                strays.pop(key, None)  # the leading shadow holds it now
            if not (hit >> lead) & 1:
                dropped = shadows[lead].gone
                if dropped is not None and dropped in self._keys:
                    strays[dropped] = None
                    self._aligned = False
        result = self._by_hits.get(hit)  # bit i: candidate i's shadow hit
        if result is None:
            result = 0
            for i in range(len(slots)):
                if (hit >> slots[i]) & 1:
                    result |= 1 << i
            self._by_hits[hit] = result
        window = self._window
        gone = window[0] if len(window) == window.maxlen else 0
        window.append(result)
        self._seen += 1
        # most accesses hit or miss in every shadow alike: the wins, and so the target, change
        # only for the candidates whose bit differs from the access leaving the window
        changed = result ^ gone
        if not changed:
            return
        i = 0
        while changed:
            if changed & 1:
                wins[i] += 1 if (result >> i) & 1 else -1
            changed >>= 1
            i += 1
        self._retarget()

    def _retarget(self) -> None:
        """Each family is scored by its chosen member: another member (a twin, or back to the
        plain head) is chosen once its shadow leads the chosen one's by the lead a switch
        needs, the evidence that its hints help or hurt. The family whose chosen member hit
        most over the window becomes the target's if it leads the current family's by that
        lead, and the target is its choice.
        Why not the candidate with the most hits, whatever its family (until 2026-12-06): a
        hinted twin then led whenever its shadow was a hit or two ahead, and the node's path
        through the families parted from its path without the hints, at a cost no shadow counts
        (each switch rebuilds). On Mooncake at 1, 5, 10 and 20%, each hinted replay against the
        one with a hint less (the tail hint against none, the application's against the tail
        hint alone): 6 of 16 lower before, by 0.0081 in all and 0.0032 at most (the tail hint
        at 1%); 6 of 16 lower now, by 0.0039 and 0.0012 (the tail hint at 5%); every hinted
        replay summed over the sizes higher or equal. Choosing the family on plain shadows
        alone, then the twin within it, kept one path through the families with and without
        hints, but the application's hints at 1% fell 0.0028 below the tail hint's, and the
        explicit close at 10% from 15% of the LRU-Belady gap to 8.5%."""
        wins, choice = self._wins, self._choice
        lead = max(1.0, self._lead * max(len(self._window), EARLY_WINDOW))
        for head, members in self._twinned:
            for i in members:
                if wins[i] > wins[choice[head]] + lead:
                    choice[head] = i
        current = self._family[self.target]
        best = current  # a loop, not max with a key: compiled, it is faster
        for head in self._heads:
            if wins[choice[head]] > wins[choice[best]]:
                best = head
        if wins[choice[best]] > wins[choice[current]] + lead:
            current = best
        self.target = choice[current]

    def _switch(self) -> None:
        """Move the lead toward the target: where every key is sampled, at once, the cache then
        following the target's shadow (`_follow_target`); between a hinted candidate and its
        plain twin, the same object from now on with or without the hints; else one more slice
        of the rebuild (see the module docstring), handed over once it has caught up."""
        target = self._candidates[self.target]
        if self._exact:
            self._follow_target(target)
            return
        if target.make is self._candidates[self.leader].make:  # its state stays right
            self._rebuild = None
            self._take_lead(self._live)
            return
        rebuild = self._rebuild
        if rebuild is None or rebuild.make is not target.make:
            rebuild = self._rebuild = Rebuild(target.make, len(self._keys), self._history)
        if rebuild.advance():
            self._rebuild = None
            self._take_lead(self._handed_over(rebuild.shadow))

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

    def _follow_target(self, target: Candidate) -> None:
        """Where every key is sampled the target's shadow is a full-size replica: from now on
        the cache follows it (`_follow`), first evicting the resident keys it does not hold, in
        the live policy's order. The live policy stays, with its own hints, until the cache
        holds what the shadow holds and a copy of the shadow replaces it; one of the target's
        kind (a twin, or a switch back) stays as it is, as a twin switch does elsewhere."""
        if self._merged >= 0 and self._slots[self.target] != self._merged:
            self._unmerge()  # the old leader's shadow goes on as a shadow (twins share one)
        shadow = self._shadows[self._slots[self.target]]  # type: ignore[index]
        held = shadow.resident
        self._strays = {}  # a shadow that has not filled has let go of nothing
        if len(held) >= shadow.capacity:
            self._strays = dict.fromkeys(k for k in self._live.ranked() if k not in held)
        self._following = True
        self._aligned = self._live_make is target.make
        self._take_lead(self._live if self._aligned else None)

    def _take_lead(self, live: EvictionPolicy | None) -> None:
        """The target leads from now on, with `live` as the live policy (None: the live policy
        stays, with its hints)."""
        self.leader = self.target
        self.switches.append((self._seen, self.leader_name))
        if live is not None:
            self._install(live)

    def on_insert(self, key: Key, now: float, hint: str | None = None) -> None:
        self._history.append(key)
        if self._rebuild is not None:
            self._rebuild.feed(key)
        if hint is not None and self._merged >= 0 and not self._forked:
            self._unmerge()  # the first hint forks the shadows: from a shadow that has not seen it
        self._keys.add(key)  # where every key is sampled, also `_sampled`: the same set
        self._live.on_insert(key, now, hint if self._hinted else None)
        if self._exact:
            self._observe(key, hint, False)
        elif spot(key) < self._threshold:
            self._sampled.add(key)
            self._observe(key, hint, False)

    def on_access(self, key: Key, now: float) -> None:
        self._history.append(key)
        if self._rebuild is not None:
            self._rebuild.feed(key)
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
        if self._rebuild is not None:
            self._rebuild.feed_many(keys)
        for key in filter(self._sampled.__contains__, keys):
            self._observe(key, None, True)

    def on_remove(self, key: Key) -> None:
        if self._merged >= 0:
            if key != self._named:  # a delete: the shadow must not see it
                self._unmerge()
            self._named = None
        self._keys.discard(key)
        self._strays.pop(key, None)
        self._sampled.discard(key)
        self._live.on_remove(key)

    def on_cold(self, key: Key) -> None:
        if self._merged >= 0 and not self._forked:
            self._unmerge()  # as in `on_insert`: the shadows fork on the first hint
        if self._hinted and self._merged < 0:  # merged, the shadow's `cool` is the live's
            self._live.on_cold(key)
        if key in self._sampled:
            if not self._forked:
                self._fork()
            for shadow in self._shadows or ():
                shadow.cool(key)

    def victim(self, keep: Callable[[Key], bool]) -> Key | None:
        if keep is not keep_nothing and not self._protecting:  # the memory tier: pinned keys
            self._protecting = True  # a protected key would part the cache from its shadow
            if self._merged >= 0:
                self._unmerge()
        if self._merged >= 0 and self._named is not None:  # a second victim before a removal:
            self._unmerge()  # its queue moves are none of the shadow's
        if self._shadows is None:  # the cache just filled: its size in entries is known now
            self._start(len(self._keys))
        live = self._live
        if isinstance(live, Handover) and not live.legacy:  # the old leader's keys are gone
            self._install(live.leader)
        if self.target != self.leader:
            self._switch()
        elif self._rebuild is not None:  # the old leader won back its lead: drop the rebuild
            self._rebuild = None
        if self._following:
            stray = self._follow(keep)
            if stray is not None:
                return stray
        if self._merged >= 0:
            self._named = self._live.victim(keep)
            return self._named
        return self._live.victim(keep)

    def _follow(self, keep: Callable[[Key], bool]) -> Key | None:
        """Where every key is sampled, after the first switch: the first resident key the
        leading shadow does not hold that `keep` lets go (None if none). Once the cache holds
        exactly what the shadow holds, the live policy becomes a copy of the shadow and makes
        its choices; whatever pulls the two apart again (a delete, a key the tier protects,
        values of different sizes) makes new strays, and the next agreement a new copy. Before
        any switch the live policy is the leader's own, fed since the cache started, and stays:
        a copy of a shadow started when the cache filled knows less (ARC's target size, a
        test's mixed trace: 8 hits fewer in 60,000)."""
        stray = first_evictable(self._strays, keep)
        if stray is not None:
            return stray
        if not self._aligned:
            shadow = self._shadows[self._slots[self.leader]]  # type: ignore[index]
            if self._keys == shadow.resident:
                hinted = self._candidates[self.leader].hinted  # the new leader's, not the live's
                if self._protecting or (self._forked and shadow.hinted != hinted):
                    self._install(copy.deepcopy(shadow.policy))
                else:
                    self._merge()
                self._aligned = True
        return None

    def _merge(self) -> None:
        """Where every key is sampled and nothing is protected (a trace's replay), the leading
        shadow, holding what the cache holds, *is* the live policy from now on: the cache's
        calls drive it, and `_observe` takes the cache's hit as its hit instead of replaying the
        access through it a second time. The two would make the same choices anyway (`_follow`
        copied the shadow for that); merged, one policy per access is saved. Whatever would set
        them apart parts them first (`_unmerge`): a delete, a second `victim` before a removal,
        any `keep` but `keep_nothing` (the memory tier's: never merged again, `_protecting`), a
        switch to another shadow, the first hint or `on_cold` before the twins fork (they fork
        from a shadow that has not seen it), and the tier's bulk hits (`on_access_many`)."""
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

    def ranked(self) -> list[Key]:
        return self._live.ranked()
