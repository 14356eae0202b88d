"""The pool's switch: a new leader rebuilt from the cache's last accesses, a slice per
eviction, then handed every resident key, the ones it lost as ghosts, in the same order in every
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from pool_support import UncheckedPool

from cache_runtime.handover import Handover
from cache_runtime.policies import Hint, LRUPolicy, keep_nothing
from cache_runtime.pool import DEFAULT_WINDOW, MAX_HISTORY, RETRY_SHARE, PoolPolicy
from cache_runtime.queue_policies import LIRSPolicy, S3FIFOPolicy
from cache_runtime.shadows import REBUILD_STEP, Rebuild
from cache_runtime.simulator import replay
from cache_runtime.tiers.memory import MemoryTier

C = 200
SAMPLED = 64  # `min_shadow`: C's shadows hold 64 entries (a rate of 0.32), not every key


def _lru_leading_hot_and_warm(size: int) -> tuple[PoolPolicy, list[int], list[int]]:
    """LRU leading a full cache of `size` entries: half of them read six times, half twice."""
    pool = UncheckedPool(("lru", "mq"), capacity=size, min_shadow=SAMPLED)
    hot, warm = list(range(size // 2)), list(range(size // 2, size))
    for key in hot + warm:
        pool.on_insert(key, 0.0, None)
    for key in hot * 5 + warm:
        pool.on_access(key, 0.0)
    assert pool.ranked()[0] in hot  # LRU's next victim
    return pool, hot, warm


def test_a_new_leader_starts_from_the_state_it_would_have_had() -> None:
    """MQ takes over from LRU: rebuilt from the cache's last accesses, it knows which keys
    were read six times and evicts one read twice. Handed the keys in LRU's order with a
    "reused" mark (the earlier handoff), every key had the same count and the hot key that
    LRU would evict first went."""
    pool, hot, warm = _lru_leading_hot_and_warm(C)

    pool.selector.target = pool.pool.index("mq")  # as the shadows would, once MQ leads them
    gone = pool.victim(lambda _: False)

    assert pool.leader_name == "mq" and gone in warm
    assert set(pool.ranked()) == set(hot + warm)


def test_a_small_cache_takes_its_new_leader_as_a_copy_of_the_shadow() -> None:
    """Where every key is sampled (a cache of at most `min_shadow` entries), the new leader's
    shadow is a full-size replica over the whole trace. Here it holds every resident key, so
    the switch copies it in one eviction, with no history to replay, and the copy then lives
    apart from the shadow."""
    pool, _, warm = _lru_leading_hot_and_warm(100)  # under min_shadow (128): all sampled
    assert pool.effective_rate == 1.0

    pool.selector.target = pool.pool.index("mq")
    gone = pool.victim(lambda _: False)

    shadow = pool._shadows[pool._slots[pool.selector.target]]  # type: ignore[index]
    assert pool.leader_name == "mq" and pool._rebuild is None and gone in warm
    assert pool._live is not shadow.policy
    assert pool.ranked() == shadow.policy.ranked()


def test_two_candidates_of_one_class_are_not_twins() -> None:
    """MQ at two lifetimes shares a class: where every key is sampled, a switch from one to
    the other ends on a copy of the new leader's shadow, never keeping the old lifetime's
    policy as if it were the new leader's own; and so back."""

    def step(key: int) -> None:
        pool.on_remove(pool.victim(lambda _: False))  # type: ignore[arg-type]
        pool.on_insert(key, 0.0, None)
        pool.on_access_many([k for k in range(10) if k in pool._keys])
        if pool._aligned:  # the live policy makes the leader's choices: it is of its lifetime
            assert pool._live._life == life[pool.leader_name]  # type: ignore[attr-defined]

    life = {"mq-short": 1.0, "mq": 16.0}
    pool = PoolPolicy(("mq-short", "mq"), capacity=100)
    for key in range(100):
        pool.on_insert(key, 0.0, None)
    for key in range(100, 400):  # hot keys read often among a scan
        step(key)
    for target, keys in ((1, range(400, 700)), (0, range(700, 1000))):
        pool.selector.target = target
        for key in keys:
            step(key)
        assert pool.leader_name == pool.pool[target] and pool._aligned


@pytest.mark.parametrize("capacity", [C, 100], ids=["sampled", "every-key-sampled"])
def test_a_switch_between_twins_keeps_the_state(capacity: int) -> None:
    pool = PoolPolicy(("prefix-arc", "arc"), capacity=capacity, min_shadow=SAMPLED)
    for key in range(capacity):
        pool.on_insert(key, 0.0, None)
    live = pool._live
    # the plain twin, as the shadows would choose it
    pool.selector.target = pool.selector.choice[1] = 1
    pool.on_remove(pool.victim(keep_nothing))  # type: ignore[arg-type]
    pool.on_insert(-1, 0.0, None)
    assert pool.leader_name == "arc" and pool._live is live and not pool._hinted
    for key in range(capacity, 3 * capacity):  # a scan: no stray ever meets an equal shadow
        pool.on_remove(pool.victim(keep_nothing))  # type: ignore[arg-type]
        pool.on_insert(key, 0.0, None)
        assert pool._live is live


def test_the_history_is_the_last_accesses_whatever_the_size() -> None:
    """A switch rebuilds from the last MAX_HISTORY accesses, for a cache of 100 entries as for
    one that never fills: bounded (a switch runs on the serving path), never per entry."""
    pool = PoolPolicy(capacity=100, min_shadow=1)  # some keys sampled: a switch rebuilds
    for key in range(100):
        pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
    for _ in range(1000):
        pool.on_access_many(list(range(100)))  # type: ignore[arg-type]
    assert len(pool._history) == pool._history.maxlen == MAX_HISTORY
    assert list(pool._history)[-100:] == list(range(100))


def test_no_history_where_every_key_is_sampled() -> None:
    """Where every key is sampled the cache follows its shadow and nothing is rebuilt, so the
    pool keeps no history (it cost an append per access for nothing), and every resident key
    is a sampled one."""
    pool = PoolPolicy(capacity=100)
    for key in range(100):
        pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
    for key in range(100, 400):
        pool.on_remove(pool.victim(lambda _: False))  # type: ignore[arg-type]
        pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
        pool.on_access_many([key])  # type: ignore[arg-type]
    assert pool.effective_rate == 1.0
    assert not pool._history
    assert pool._sampled is pool._keys and len(pool._keys) == 100


def _serve(pool: PoolPolicy, keys: list[object], capacity: int, resident: set[object]) -> None:
    """A cache of `capacity` entries in front of `pool`: hits, or evict one and insert."""
    for key in keys:
        if key in resident:
            pool.on_access(key, 0.0)  # type: ignore[arg-type]
            continue
        if len(resident) >= capacity:
            gone = pool.victim(lambda _: False)
            pool.on_remove(gone)  # type: ignore[arg-type]
            resident.discard(gone)
        pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
        resident.add(key)


def _switching_with_history(accesses: int) -> tuple[PoolPolicy, set[object]]:
    """LRU leading a full cache of C entries after `accesses` hits, told to hand over to LIRS
    (as the shadows would once LIRS leads them)."""
    pool, resident = UncheckedPool(("lru", "lirs"), capacity=C, min_shadow=SAMPLED), set()
    _serve(pool, list(range(C)), C, resident)
    for _ in range(accesses // C):
        pool.on_access_many(list(range(C)))  # type: ignore[arg-type]
    pool.selector.target = 1
    return pool, resident


def test_a_switch_replays_its_history_a_slice_per_eviction() -> None:
    """Replayed at once, a rebuild from 65,536 accesses held the memory tier's lock for up to
    177 ms. Spread, no eviction replays more than REBUILD_STEP accesses plus those since the
    previous one, the old leader evicts meanwhile, and the new one takes over within
    len(history) / REBUILD_STEP evictions, holding every resident key."""
    pool, resident = _switching_with_history(8 * REBUILD_STEP)
    history = len(pool._history)
    evictions = 0
    while pool.leader_name == "lru":
        before = len(pool._rebuild.pending) if pool._rebuild else history
        _serve(pool, [f"new-{evictions}"], C, resident)  # a miss: one eviction, one insert
        evictions += 1
        if pool._rebuild is not None:
            assert before + 1 - len(pool._rebuild.pending) <= REBUILD_STEP + 1
    assert 8 <= evictions <= history // REBUILD_STEP + 1
    assert pool.switches == [(pool.selector.seen, "lirs")]
    assert set(pool.ranked()) == resident


def test_a_rebuild_is_dropped_when_the_old_leader_wins_back() -> None:
    pool, resident = _switching_with_history(4 * REBUILD_STEP)
    _serve(pool, ["new-0"], C, resident)
    assert pool._rebuild is not None and pool.leader_name == "lru"
    pool.selector.target = 0  # the shadows changed their mind
    _serve(pool, ["new-1"], C, resident)
    assert pool._rebuild is None and pool.leader_name == "lru" and not pool.switches
    assert set(pool.ranked()) == resident


def _loop_history(names: tuple[str, ...], passes: int) -> tuple[PoolPolicy, set[object]]:
    """The first of `names` leading a full cache of C entries through `passes` of a loop of
    1.3 x C keys (LIRS keeps most of it, LRU and SLRU nothing), then told to hand over to the
    second (as the shadows would, their sample misleading them). Fewer sampled accesses than a
    window, so nothing leaves it and the shadows' wins, and the target, stay as set."""
    pool, resident = PoolPolicy(names, capacity=C, min_shadow=SAMPLED), set()
    _serve(pool, list(range(int(1.3 * C))) * passes, C, resident)
    assert pool.selector.seen < DEFAULT_WINDOW and pool.leader_name == names[0]
    pool.selector.target = 1
    return pool, resident


def _miss_until(
    pool: PoolPolicy, resident: set[object], new: Iterator[str], done: Callable[[], bool]
) -> None:
    """New keys, one eviction each, until `done` (at most 100: a rebuild of the loop's
    history takes a few slices)."""
    for _ in range(100):
        _serve(pool, [next(new)], C, resident)
        if done():
            return


def test_a_switch_the_full_replay_contradicts_is_called_off_and_tried_again_later() -> None:
    """The rebuilt LRU hits next to nothing on the loop where the cache, led by LIRS, hit
    most: LIRS stays, and no rebuild starts again until a quarter of the window's length of
    sampled accesses has passed (the shadows, asked each time, still preferring LRU)."""
    pool, resident = _loop_history(("lirs", "lru"), passes=10)
    new = (f"new-{i}" for i in range(10**6))
    _miss_until(pool, resident, new, lambda: bool(pool._called_off))
    assert len(pool._history_hits) == len(pool._history)  # the cache's hit for each access
    until = pool._called_off[1]
    assert pool.selector.seen < until <= pool.selector.seen + RETRY_SHARE * DEFAULT_WINDOW
    assert pool.leader_name == "lirs" and not pool.switches and pool._rebuild is None
    while pool.selector.seen < until:
        pool.selector.target = 1
        _serve(pool, [next(new)], C, resident)
        assert pool._rebuild is None and pool.leader_name == "lirs"
    pool.selector.target = 1
    _serve(pool, [next(new)], C, resident)
    assert pool._rebuild is not None  # tried again
    assert set(pool.ranked()) == resident


def test_a_switch_is_made_only_where_its_rebuild_gains_on_the_cache() -> None:
    """On a loop larger than the cache LRU, leading, hits nothing and LIRS's rebuild most:
    once the shadows name LIRS the switch is made at its first check. SLRU's rebuild hits
    nothing either: a switch to it would only pay a refill, so the shadows' word is not
    enough, and it is asked again a quarter of a window later."""
    gaining, resident = PoolPolicy(("lru", "lirs"), capacity=C, min_shadow=SAMPLED), set()
    _serve(gaining, list(range(int(1.3 * C))) * 10, C, resident)
    assert gaining.switches and gaining.leader_name == "lirs" and not gaining._called_off

    new = (f"new-{i}" for i in range(10**6))
    even, resident = _loop_history(("lru", "slru"), passes=10)
    _miss_until(even, resident, new, lambda: bool(even._called_off))
    assert even.leader_name == "lru" and not even.switches
    assert even.selector.seen < even._called_off[1] <= even.selector.seen + DEFAULT_WINDOW // 4


def test_a_called_off_switch_still_lets_twins_swap() -> None:
    """Plain SLRU is called off; its hinted twin takes over unchecked; the swap back to plain
    SLRU keeps the policy (no rebuild to check) and is not held up by the call-off."""
    pool, resident = _loop_history(("lirs", "prefix-slru", "slru"), passes=10)
    plain, hinted = 2, 1
    pool.selector.target = plain
    new = (f"new-{i}" for i in range(10**6))
    _miss_until(pool, resident, new, lambda: bool(pool._called_off))
    assert plain in pool._called_off and pool.leader_name == "lirs"
    pool.selector.target = hinted
    _miss_until(pool, resident, new, lambda: pool.leader_name != "lirs")
    assert pool.leader_name == "prefix-slru" and pool._called_off[plain] > pool.selector.seen
    pool.selector.target = plain
    _serve(pool, [next(new)], C, resident)
    assert pool.leader_name == "slru" and set(pool.ranked()) == resident


def test_a_rebuild_begun_for_the_plain_twin_does_not_judge_the_hinted_one() -> None:
    """The target swaps from plain SLRU to its hinted twin mid-rebuild (one policy: the
    rebuild goes on): the hint-free counts it gathered say nothing of the hints, so the
    hinted twin takes over though the plain one would have been called off."""
    pool, resident = _loop_history(("lirs", "prefix-slru", "slru"), passes=10)
    pool.selector.target = 2
    new = (f"new-{i}" for i in range(10**6))
    _serve(pool, [next(new)], C, resident)
    assert pool._rebuild is not None and pool._rebuild.cached is not None  # checked, for now
    pool.selector.target = 1
    _miss_until(pool, resident, new, lambda: pool.leader_name != "lirs")
    assert pool.leader_name == "prefix-slru" and not pool._called_off


def test_a_switch_to_a_hinted_candidate_is_not_checked() -> None:
    """A rebuild replays no hints, so it cannot judge a hinted candidate: prefix-SLRU takes
    over on the shadows' word though its hint-free replay hits less than the cache did."""
    pool, resident = _loop_history(("lirs", "prefix-slru"), passes=10)
    new = (f"new-{i}" for i in range(10**6))
    _miss_until(pool, resident, new, lambda: pool.leader_name != "lirs")
    assert not pool._called_off  # a call-off is never cleared: none was ever made
    assert pool.switches and set(pool.ranked()) == resident


def _checked(make: type, keys: list[object], cached: list[bool]) -> Rebuild:
    """A rebuild of `make` over `keys`, checked against a cache that hit where `cached` says."""
    rebuild = Rebuild(make, C, deque(keys), deque(cached))
    while not rebuild.advance():
        pass
    return rebuild


def _hits_of(make: type, keys: list[int]) -> list[bool]:
    return replay(make(), np.array(keys), np.arange(len(keys)), C).tolist()


def test_a_rebuild_is_checked_against_the_cache_after_its_first_half() -> None:
    """The rebuild's first half warms it and counts nothing: there LRU loses a loop to the
    cache's LIRS; after it LRU hits the first reads of a small hot set that LIRS, its space for
    new keys small, misses (50 accesses: a gain at one standard deviation, not at eight). Over
    a loop all the way LIRS gains on LRU and LRU on LIRS not at all; over the very hits the
    cache had, a rebuild gains nothing, so the check lets no such switch through."""
    loop = list(range(int(1.3 * C))) * 4
    hot = list(range(10_000, 10_050)) * (len(loop) // 50)
    mixed = _checked(LRUPolicy, loop + hot, _hits_of(LIRSPolicy, loop + hot))
    assert mixed.lost == 0 and mixed.gained == 50
    assert mixed.gains_on_cache(1.0) and not mixed.gains_on_cache(8.0)
    looped = _checked(LRUPolicy, loop + loop, _hits_of(LIRSPolicy, loop + loop))
    assert looped.gained == 0 and looped.lost > 100 and not looped.gains_on_cache(1.0)
    better = _checked(LIRSPolicy, loop + loop, _hits_of(LRUPolicy, loop + loop))
    assert better.gained > 100 and better.gains_on_cache(1.0)
    same = _checked(LRUPolicy, loop + hot, _hits_of(LRUPolicy, loop + hot))
    assert same.gained == same.lost == 0 and not same.gains_on_cache(0.0)


def _hot_then_scan(pool: PoolPolicy, capacity: int) -> list[str]:
    """Six hot pages read six times, then a scan of `capacity` new ones: LRU, leading, keeps
    the scan; a frequency or reuse-distance policy would have kept the hot pages."""
    resident: set[object] = set()
    hot = [f"hot-{i}" for i in range(6)]
    _serve(pool, hot * 6 + [f"scan-{i}" for i in range(capacity)], capacity, resident)
    assert not set(hot) & resident
    return hot


def test_a_switch_remembers_the_keys_the_new_leader_lost_as_its_ghosts() -> None:
    """The rebuilt S3-FIFO would hold the hot pages in main; the cache no longer does. They
    become its ghosts, so each one that returns goes back to main instead of passing through
    the small queue as new. Forgotten (the earlier handoff), S3-FIFO's main, frozen on a loop
    larger than the cache, was never rebuilt: the pool hit 0.031 on cs at 5% where S3-FIFO
    alone hits 0.049."""
    pool = UncheckedPool(("lru", "s3fifo"), capacity=10, min_shadow=1, sample_rate=0.5)
    hot = _hot_then_scan(pool, 10)
    pool.selector.target = 1  # as the shadows would, once S3-FIFO leads them
    pool.victim(lambda _: False)
    live = pool._live.leader if isinstance(pool._live, Handover) else pool._live
    assert pool.leader_name == "s3fifo" and isinstance(live, S3FIFOPolicy)
    lost = [key for key in hot if key in live._ghost]
    assert len(lost) >= 4  # the rebuilt S3-FIFO kept them in main (two left with the scan)
    pool.on_insert(lost[0], 0.0, None)
    assert lost[0] in live._main


def test_a_small_cache_converges_to_its_leading_shadow() -> None:
    """Every key sampled: after the switch the cache evicts first what S3-FIFO's shadow no
    longer holds, then holds exactly what the shadow holds and runs a copy of it. Taking a copy
    at the switch and turning the keys it lost into ghosts (the previous design), the cache
    stayed apart from the shadow for good: on cs at 5%, 9 of its 70 keys, on every pass of
    a loop larger than the cache."""
    pool = PoolPolicy(("lru", "s3fifo"), capacity=10)
    resident: set[object] = set()
    hot = _hot_then_scan(pool, 10)
    pool.selector.target = 1
    shadow = pool._shadows[pool._slots[1]]  # type: ignore[index]
    strays = set(pool._live.ranked()) - shadow.resident
    assert strays  # scan pages S3-FIFO's small queue already let go
    resident = set(pool._live.ranked())
    first = [pool.victim(lambda _: False)]
    assert pool.leader_name == "s3fifo" and first[0] in strays
    loop = [f"loop-{i}" for i in range(13)]  # a loop larger than the cache
    _serve(pool, hot + loop * 6, 10, resident)
    assert resident == shadow.resident
    assert pool._live is not shadow.policy and pool.ranked() == shadow.policy.ranked()


def test_a_small_cache_evicts_what_its_leading_shadow_let_go_first() -> None:
    """Every victim named after a switch, while a key the leading shadow does not hold is still
    cached, is such a key: the strays of the switch and the ones the shadow lets go later
    (forty switches on a mixed trace, every key sampled)."""
    rng = np.random.default_rng(5)
    keys = [f"h{i}" for i in range(8)] * 3 + [f"s{i}" for i in range(30)]
    checked = 0
    for trial in range(40):
        pool, resident = PoolPolicy(("lru", "s3fifo", "lirs", "mq"), capacity=20), set()
        for n in range(600):
            key = keys[rng.integers(len(keys))] if rng.random() < 0.6 else f"x{rng.integers(60)}"
            if n == 200:
                pool.selector.target = (pool.leader + 1 + trial % 3) % 4
            if key in resident:
                pool.on_access(key, 0.0)  # type: ignore[arg-type]
                continue
            if len(resident) >= 20:
                following = pool._following and pool.leader == pool.selector.target
                shadow = pool._shadows[pool._slots[pool.leader]]  # type: ignore[index]
                strays = resident - shadow.resident
                gone = pool.victim(lambda _: False)
                if following and strays:
                    checked += 1
                    assert gone in strays
                pool.on_remove(gone)  # type: ignore[arg-type]
                resident.discard(gone)
            pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
            resident.add(key)
        assert pool._following
    assert checked > 1000


def test_a_pinned_stray_neither_stops_the_following_nor_piles_up() -> None:
    """A key the tier never lets go (pinned, never read) that the leading shadow let go stays
    a stray for good: the others still go first, and the strays never outnumber the cache."""
    pool = PoolPolicy(("lru", "s3fifo"), capacity=10)
    _hot_then_scan(pool, 10)
    resident = set(pool._live.ranked())
    pinned = next(iter(resident))
    pool.selector.target = 1
    protect = lambda key: key == pinned  # noqa: E731
    for i in range(2000):
        key = f"loop-{i % 13}" if i % 3 else f"hot-{i % 6}"
        if key in resident:
            pool.on_access(key, 0.0)  # type: ignore[arg-type]
            continue
        gone = pool.victim(protect)
        assert gone != pinned
        pool.on_remove(gone)  # type: ignore[arg-type]
        resident.discard(gone)
        pool.on_insert(key, 0.0, None)  # type: ignore[arg-type]
        resident.add(key)
        assert len(pool._strays) <= len(resident)
    assert pinned in resident and pinned in pool._strays


def test_until_the_copy_the_old_leader_keeps_its_hints() -> None:
    """While the cache still holds keys the new leader's shadow does not, the old leader
    evicts, and a plain one gets no hints and no "conversation ended" on the new one's behalf."""
    pool = PoolPolicy(("lru", "prefix-arc"), capacity=10)
    _hot_then_scan(pool, 10)
    pool.selector.target = 1
    pool.victim(lambda _: False)
    assert pool.leader_name == "prefix-arc" and pool._strays
    assert isinstance(pool._live, LRUPolicy) and not pool._hinted


def test_a_small_cache_skips_a_protected_stray() -> None:
    """The memory tier protects keys it is reading or has already chosen: the next key the
    shadow let go goes instead, and with every one of them protected, the live policy names
    the victim."""
    pool = PoolPolicy(("lru", "s3fifo"), capacity=10)
    _hot_then_scan(pool, 10)
    pool.selector.target = 1
    shadow = pool._shadows[pool._slots[1]]  # type: ignore[index]
    strays = [key for key in pool._live.ranked() if key not in shadow.resident]
    assert len(strays) >= 2
    assert pool.victim(lambda key: key == strays[0]) == strays[1]
    gone = pool.victim(lambda key: key in strays)
    assert gone is not None and gone not in strays


def test_a_small_memory_tier_follows_its_shadows_through_pins_deletes_and_switches() -> None:
    """The memory tier asks for victims with its own `keep` (pinned entries, keys already
    chosen for this put), puts of several bytes need several victims, deletes and "conversation
    ended" calls come between: a tier of 100 one-to-three-byte entries, every key sampled,
    switched to another candidate every 97 operations, stays within its budget, never loses a
    pinned entry, and the pool's resident keys are the tier's."""
    rng = np.random.default_rng(3)
    pool = PoolPolicy(("lru", "s3fifo", "mq", "prefix-arc"))
    tier = MemoryTier(150, pool)
    pinned = {f"k{i}" for i in range(5)}
    for key in sorted(pinned):
        tier.put(key, b"p", pinned=True)
    for step in range(6000):
        key = f"k{int(rng.zipf(1.3)) % 400}"
        action = rng.random()
        if action < 0.03 and key not in pinned:
            tier.delete(key)
        elif action < 0.05:
            tier.cool([key])
        elif tier.get(key) is None and key not in pinned:
            tier.put(key, b"x" * int(rng.integers(1, 4)))
        if step % 97 == 0 and pool.effective_rate is not None:
            pool.selector.target = int(rng.integers(len(pool.pool)))
        assert tier.stats().bytes <= 150
    assert pool.effective_rate == 1.0 and pool._following and len(pool.switches) > 10
    assert all(tier.get(key) == b"p" for key in pinned)
    assert pool._keys == set(tier._entries) and not tier.check()


def test_a_lost_key_of_s3fifo_main_returns_to_main() -> None:
    s3 = S3FIFOPolicy()
    for i in range(20):
        s3.on_insert(f"k{i}", 0.0, None)
    s3.victim(lambda _: False)  # first fill: the keys past the small queue's 2 go to main
    s3.on_lost("k10")
    s3.on_insert("k10", 0.0, None)
    assert "k10" in s3._main
    s3.on_remove("k11")  # removed from main: forgotten, as S3-FIFO does with main's evictions
    s3.on_insert("k11", 0.0, None)
    assert "k11" in s3._small


def test_a_switch_hands_over_every_resident_key() -> None:
    accesses = np.tile(np.arange(int(1.3 * C)), 60)  # a loop a bit larger than the cache
    pool = PoolPolicy(("lru", "lirs"), capacity=C, min_shadow=SAMPLED)
    resident: set[object] = set()
    _serve(pool, accesses.tolist(), C, resident)
    assert pool.switches and set(pool.ranked()) == resident


# Hot pages read again and again, then a scan: LRU keeps the scan, ARC the hot pages. A switch
# to ARC removes, from the rebuilt ARC, the hot pages the cache no longer holds; ARC keeps a
# ghost of each in removal order. Prints every removal ARC saw.
_SWITCH_TO_ARC = """
import json
import sys
from cache_runtime.candidates import CANDIDATES, Candidate
from cache_runtime.prefix_policies import PrefixARC

sys.path.insert(0, "tests/unit")
from pool_support import UncheckedPool

removed = []

class Recording(PrefixARC):
    def on_remove(self, key):
        removed.append(key)
        super().on_remove(key)

CANDIDATES["arc"] = Candidate(Recording, False, "records its removals")
pool = UncheckedPool(("lru", "arc"), capacity=8, sample_rate=0.5, min_shadow=1)  # a rebuild
resident = set()

def access(key):
    if key in resident:
        pool.on_access(key, 0.0)
        return
    if len(resident) >= 8:
        gone = pool.victim(lambda _: False)
        pool.on_remove(gone)
        resident.discard(gone)
    pool.on_insert(key, 0.0, None)
    resident.add(key)

for _ in range(6):
    for i in range(6):
        access(f"hot-{i}")
for i in range(8):
    access(f"scan-{i}")
removed.clear()
pool.selector.target = pool.pool.index("arc")
access("page-new")
print(json.dumps(removed))
"""


def test_a_switch_removes_in_the_same_order_in_every_process() -> None:
    """String keys hash differently in each process (PYTHONHASHSEED): a switch that removed
    keys in a set's order gave ARC its ghosts in another order each run, and a replay of the
    Mooncake trace with restarts served different blocks from run to run."""
    runs = {
        subprocess.run(
            [sys.executable, "-c", _SWITCH_TO_ARC], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)}, cwd=Path(__file__).parents[2],
        ).stdout
        for seed in (1, 2, 3, 4)
    }  # fmt: skip
    assert len(runs) == 1
    removed = json.loads(runs.pop())
    assert {f"hot-{i}" for i in range(6)} <= set(removed)  # the switch did remove hot pages


def _drive_exact(
    keep: object, keys: list[int], delete_at: int, hint_from: int
) -> tuple[PoolPolicy, list[object], int, list[int], int]:
    """`keys` through the default pool as a cache of 100 entries (every key sampled) asking
    for victims with `keep`; one delete at `delete_at`, tail hints from `hint_from` on.
    Returns the pool, its victims, the hits, the steps where it ran merged (as the step
    began) and the step of the first hint."""
    pool, resident, victims, hits, merged = PoolPolicy(capacity=100), set(), [], 0, []
    first_hint = -1
    for n, key in enumerate(keys):
        if n == delete_at:
            doomed = min(resident)
            pool.on_remove(doomed)
            resident.discard(doomed)
        if pool._merged >= 0:
            merged.append(n)
        for j, shadow in enumerate(pool._shadows or ()):  # only the merged one is the cache's
            is_merged = j == pool._merged
            assert (shadow.policy is pool._live) == (shadow.resident is pool._keys) == is_merged
        if key in resident:
            pool.on_access(key, 0.0)
            hits += 1
            continue
        if len(resident) >= 100:
            gone = pool.victim(keep)  # type: ignore[arg-type]
            victims.append(gone)
            pool.on_remove(gone)  # type: ignore[arg-type]
            resident.discard(gone)
        hint = Hint.TAIL if n >= hint_from and n % 5 == 4 else None
        if hint is not None and first_hint < 0:
            first_hint = n
        pool.on_insert(key, 0.0, hint)
        resident.add(key)
    return pool, victims, hits, merged, first_hint


def test_merged_with_its_shadow_the_cache_makes_the_same_choices() -> None:
    """Where every key is sampled and nothing is protected, the leading shadow is the live
    policy (`_merge`): one policy per access saved. Merged or not (a `keep` that protects
    nothing, as the tier's, never merges) the pool names the same victims and switches alike,
    through switches, a delete and the first hint, which part the two first."""
    rng = np.random.default_rng(11)
    phases = [rng.zipf(1.2, 6000) % 400, np.tile(np.arange(130), 40), rng.integers(0, 300, 6000)]
    keys = np.concatenate(phases * 2).tolist()
    delete_at, hint_from = 9000, 3 * len(keys) // 4
    merged = _drive_exact(keep_nothing, keys, delete_at, hint_from)
    apart = _drive_exact(lambda _: False, keys, delete_at, hint_from)

    assert merged[1:3] == apart[1:3] and merged[0].switches == apart[0].switches
    assert len(merged[0].switches) >= 2
    # apart from its first victim on: merged only while the cache filled
    assert apart[3] == list(range(len(apart[3]))) and apart[0]._merged == -1
    steps = merged[3]
    assert steps[0] == 0  # from the start: the cache's size was known
    first_hint = merged[4]
    assert delete_at - 1 in steps and delete_at not in steps  # the delete parts them
    assert first_hint in steps and first_hint + 1 not in steps  # so does the first hint
    assert any(delete_at < n < first_hint for n in steps)  # merged again once aligned


def _events(keep: object) -> list[object]:
    """A merged pool (with `keep_nothing`) through the calls that part it: `on_cold` before
    any hint, two victims before a removal; and bulk hits on a key deleted meanwhile, which
    the tier does not filter for the pool. Returns what it names."""
    pool, named = PoolPolicy(("prefix-lirs", "lirs", "wtinylfu", "mq"), capacity=10), []
    for key in range(10):
        pool.on_insert(key, 0.0, None)
    for key in (10, 11):
        named.append(pool.victim(keep))  # type: ignore[arg-type]
        pool.on_remove(named[-1])  # type: ignore[arg-type]
        pool.on_insert(key, 0.0, None)
    pool.on_cold(5)
    first, second = pool.victim(keep), pool.victim(keep)  # type: ignore[arg-type]
    named += [first, second]
    pool.on_remove(first)  # type: ignore[arg-type]
    pool.on_remove(second)  # type: ignore[arg-type]
    pool.on_access_many([second, 6, 7])  # type: ignore[list-item]
    for key in (12, 13, 14):
        pool.on_insert(key, 0.0, None)
        named.append(pool.victim(keep))  # type: ignore[arg-type]
        pool.on_remove(named[-1])  # type: ignore[arg-type]
    return named


def test_what_parts_a_merged_pool_parts_it_first() -> None:
    """Merged or apart, the same victims: `on_cold` before the first hint cools the live
    policy once (the key goes next), a second victim's queue moves stay off the shadow, and
    a deleted key in a batch of hits is skipped, not a KeyError."""
    merged, apart = _events(keep_nothing), _events(lambda _: False)
    assert merged == apart and merged[2] == 5
