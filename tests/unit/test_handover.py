"""A new leader taking over a cache it did not fill: the keys it does not know stay with the old
leader, which evicts them first in its own order (`cache_runtime.handover`)."""

from __future__ import annotations

import pytest
from pool_support import UncheckedPool

from cache_runtime.handover import DROP_STEP, Handover
from cache_runtime.policies import EvictionPolicy, LRUPolicy
from cache_runtime.pool import PoolPolicy
from cache_runtime.queue_policies import MQPolicy, S3FIFOPolicy
from cache_runtime.tiers.memory import MemoryTier


def _lru(keys: list[int], reads: list[int]) -> LRUPolicy:
    lru = LRUPolicy()
    for key in keys:
        lru.on_insert(key, 0.0, None)
    for key in reads:
        lru.on_access(key, 0.0)
    return lru


def _evict(policy: EvictionPolicy, n: int) -> list[int]:
    gone = []
    for _ in range(n):
        key = policy.victim(lambda _: False)
        assert key is not None
        policy.on_remove(key)
        gone.append(int(key))
    return gone


def _handover() -> tuple[Handover, LRUPolicy]:
    """The old LRU holds 0-9, of which 3 and 1 were read last; the new leader knows 5-9."""
    old = _lru(list(range(10)), [3, 1])
    leader = _lru([5, 6, 7, 8, 9], [])
    return Handover(leader, old, {0, 1, 2, 3, 4}), leader


def test_the_keys_the_new_leader_does_not_know_go_first_in_the_old_leaders_order() -> None:
    """Inserted cold into the new leader one by one (the previous switch), the key the old
    leader protected most went first: 1, 3, 4, 2, 0."""
    handover, leader = _handover()
    assert _evict(handover, 5) == [0, 2, 4, 3, 1]
    assert not handover.legacy
    assert _evict(handover, 5) == [5, 6, 7, 8, 9]  # then the new leader's own order
    assert leader.ranked() == []


def test_conversation_ended_reaches_only_the_new_leader() -> None:
    """The pool passes "conversation ended" on only where its leader takes hints; the old
    leader's keys go first already and it is not asked."""
    handover, _ = _handover()
    handover.on_cold(4)  # legacy: its order stays
    handover.on_cold(9)  # the new leader's: next to go once the legacy keys are gone
    assert _evict(handover, 10) == [0, 2, 4, 3, 1, 9, 5, 6, 7, 8]


def test_a_hit_on_an_old_key_hands_it_to_the_new_leader_as_reused() -> None:
    handover, leader = _handover()
    handover.on_access(2, 0.0)
    assert handover.legacy == {0, 1, 3, 4}
    assert leader.ranked() == [5, 6, 7, 8, 9, 2]
    assert _evict(handover, 4) == [0, 4, 3, 1]

    # a frequency leader counts it as read twice: a key inserted after it, never read, goes first
    frequency = Handover(MQPolicy(), _lru([0, 1], []), {0, 1})
    frequency.on_access(0, 0.0)
    frequency.on_insert(5, 0.0)
    assert _evict(frequency, 3) == [1, 5, 0]


def test_bulk_hits_leave_the_same_state_as_hits_one_by_one() -> None:
    one_by_one, _ = _handover()
    bulk, _ = _handover()
    reads = [7, 2, 7, 4, 9, 2]
    for key in reads:
        one_by_one.on_access(key, 0.0)
    bulk.on_access_many(reads)
    assert bulk.ranked() == one_by_one.ranked()
    assert bulk.legacy == one_by_one.legacy == {0, 1, 3}


def test_a_removed_or_protected_old_key_is_skipped() -> None:
    handover, _ = _handover()
    handover.on_remove(0)  # deleted by the application
    assert handover.victim(lambda key: key in (2, 4, 3, 1)) == 5  # all old keys protected
    assert _evict(handover, 3) == [2, 4, 3]
    assert handover.ranked() == [1, 5, 6, 7, 8, 9]


def test_a_switch_before_the_previous_one_drained_keeps_both_orders() -> None:
    """The old leader may itself be a handover: its own old keys still go first."""
    inner, _ = _handover()
    outer_leader = _lru([6, 8], [])
    outer = Handover(outer_leader, inner, {0, 1, 2, 3, 4, 5, 7, 9})
    assert _evict(outer, 8) == [0, 2, 4, 3, 1, 5, 7, 9]
    assert _evict(outer, 2) == [6, 8]


def test_the_pool_hands_over_the_keys_its_history_does_not_cover() -> None:
    """Half the cache was inserted before the last MAX_HISTORY accesses, which read only the
    other half: the rebuilt MQ knows the other half, LRU keeps the first and evicts it first,
    and once it is gone the pool runs MQ alone."""
    pool = UncheckedPool(("lru", "mq"), capacity=200, min_shadow=64)  # some keys sampled
    old, read = list(range(100)), list(range(100, 200))
    for key in old + read:
        pool.on_insert(key, 0.0, None)
    for _ in range(700):
        pool.on_access_many(read)  # 70,000 hits: the inserts of `old` leave the history
    pool.selector.target = pool.pool.index("mq")
    gone = []
    while pool.leader_name == "lru" or len(gone) < 100:
        key = pool.victim(lambda _: False)
        assert key is not None
        pool.on_remove(key)
        gone.append(key)
        pool.on_insert(f"new-{len(gone)}", 0.0, None)
    live = pool._live
    assert isinstance(live, Handover) and not live.legacy
    assert sorted(gone) == old and not set(gone) & set(read)
    pool.victim(lambda _: False)  # drained: the pool drops the old leader
    assert isinstance(pool._live, MQPolicy)


def test_one_eviction_lets_go_of_a_bounded_number_of_shared_keys() -> None:
    """The old leader names shared keys before its last legacy one: one `victim` call lets go
    of DROP_STEP of them at most (then the new leader names the victim), the next goes on."""
    shared = list(range(1, DROP_STEP + 11))
    old = _lru([*shared, 0], [])
    handover = Handover(_lru(shared, []), old, {0})
    assert handover.victim(lambda _: False) == 1  # the new leader's, this once
    assert len(old.ranked()) == 11
    assert handover.victim(lambda _: False) == 0


def _tier_in_handover(pinned: str | None) -> tuple[MemoryTier, PoolPolicy]:
    """A memory tier of 200 one-byte entries whose pool hands over from LRU to MQ: half the
    entries ("o*") were written before the last MAX_HISTORY reads and stay with LRU."""
    pool = UncheckedPool(("lru", "mq"), capacity=200, min_shadow=64)  # some keys sampled
    tier = MemoryTier(200, pool)
    read = [f"r{i}" for i in range(100)]
    for key in [f"o{i}" for i in range(100)] + read:
        tier.put(key, b"x", pinned=key == pinned)
    for _ in range(700):
        pool.on_access_many(read)
    pool.selector.target = pool.pool.index("mq")
    new = 0
    while not isinstance(pool._live, Handover):
        new += 1
        tier.put(f"new-{new}", b"x")
    return tier, pool


def test_a_key_deleted_during_a_handover_is_never_offered_to_the_tier() -> None:
    """The tier's `keep` reads the entry of every key the policy names: a key both leaders
    knew, deleted while the old leader still held it, raised KeyError from the next put."""
    tier, pool = _tier_in_handover(pinned="o99")  # one legacy key that never goes
    tier.delete("r50")
    for i in range(300):
        assert tier.put(f"z{i}", b"x")
    # the old leader could name none of its keys left: the new leader took the pinned one
    assert isinstance(pool._live, MQPolicy) and "o99" in pool._live.ranked()
    assert tier.contains("o99") and tier.check() == []

    tier, pool = _tier_in_handover(pinned=None)
    tier.delete("r50")
    live = pool._live
    assert isinstance(live, Handover)
    for i in range(36):  # one put refills the deleted entry's byte, 35 evict legacy keys
        tier.put(f"y{i}", b"x")
    assert len(live.legacy) == 1
    assert tier.put("two-victims", b"xx")  # the second victim comes after the last legacy key
    assert not live.legacy and tier.get("r49") is not None


def test_an_old_leader_holding_only_protected_keys_retires_after_a_bounded_search() -> None:
    """In the memory tier a KV page with cached children is kept. An old leader whose keys left
    are all such parents passed every one of them on every eviction (S3-FIFO: up to four passes
    over its main queue, 6,668 `keep` calls per eviction on Mooncake's pages at 20%). It may
    now ask about DROP_STEP keys per eviction; past that its keys go to the new leader,
    inserted and cooled, its own first victims first, and the new leader names the victim."""
    parents = [f"p{i}" for i in range(5000)]
    old = S3FIFOPolicy()
    for key in parents:
        old.on_insert(key, 0.0, None)
    for key in parents[::2]:
        old.on_access(key, 0.0)  # counters the old leader must wear down pass by pass
    leader = _lru(list(range(10)), [])
    handover = Handover(leader, old, set(parents))
    asked_old = 0  # keys asked about while the old leader searched

    def keep(key: object) -> bool:
        nonlocal asked_old
        asked_old += bool(handover.legacy)
        return str(key).startswith("p") and key != "p4999"  # one legacy leaf, at the back

    victim = handover.victim(keep)
    assert asked_old == DROP_STEP  # 20,000 before: 5,000 keys, four passes
    assert not handover.legacy
    assert victim == "p4999"  # now the new leader's, cooled: the first that may go
    order = leader.ranked()
    assert set(order) == {*parents, *range(10)}
    assert order.index("p0") < order.index(0)  # the old keys, cooled, go before its own


@pytest.mark.parametrize("make", [S3FIFOPolicy, MQPolicy, LRUPolicy])
def test_a_retired_old_leaders_keys_go_first_in_its_order(make: type[EvictionPolicy]) -> None:
    """Whether the new leader queues the keys by insertion (S3-FIFO, MQ) or cools them to its
    eviction end (LRU), the old leader's first victims go first (inserted last-first, S3-FIFO
    would have let them go last-first: found in review)."""
    old = _lru([], [])
    for key in ("o1", "o2", "o3"):
        old.on_insert(key, 0.0, None)
    leader = make()
    for key in range(10):
        leader.on_insert(key, 0.0, None)
    leader.victim(lambda _: False)  # the leader has filled
    handover = Handover(leader, old, {"o1", "o2", "o3"})
    assert handover.victim(lambda key: str(key).startswith("o")) == 0  # all kept: retired
    order = [key for key in leader.ranked() if key != 0]
    assert order[:3] == ["o1", "o2", "o3"]
