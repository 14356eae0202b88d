"""The memory tier and its policies: byte budget, eviction order, pinning, TTL, prefix closure."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from helpers import FakeClock
from hypothesis import given, settings
from hypothesis import strategies as st

from cache_runtime.candidates import CANDIDATES
from cache_runtime.policies import EvictionPolicy, Hint, LRUKPolicy, LRUPolicy
from cache_runtime.prefix_policies import PrefixSLRU
from cache_runtime.tiers import MemoryTier, Tier


def test_is_a_tier() -> None:
    assert isinstance(MemoryTier(100), Tier)


def test_budget_is_bytes_and_lru_evicts_least_recent() -> None:
    tier = MemoryTier(30, policy="lru")
    for key in "abc":
        assert tier.put(key, b"x" * 10)
    tier.get("a")  # b is now least recently used
    assert tier.put("d", b"y" * 10)
    assert [k for k in "abcd" if tier.contains(k)] == ["a", "c", "d"]
    assert tier.stats().bytes == 30 and tier.stats().evictions == 1
    assert tier.put("big", b"z" * 25)  # leaves room for 5 bytes: all three must go
    assert tier.stats().bytes <= 30 and tier.check() == []


def test_value_larger_than_budget_is_refused_not_stored() -> None:
    tier = MemoryTier(10)
    assert not tier.put("huge", b"x" * 11)
    assert not tier.contains("huge") and tier.stats().rejected == 1


def test_lru2_keeps_the_twice_used_entry_over_a_recent_one_shot() -> None:
    tier = MemoryTier(30, policy=LRUKPolicy(2))
    tier.put("hot", b"x" * 10)
    tier.get("hot")
    tier.put("scan1", b"x" * 10)
    tier.put("scan2", b"x" * 10)
    tier.put("scan3", b"x" * 10)  # LRU would evict "hot"; LRU-2 evicts the one-shot "scan1"
    assert tier.contains("hot") and not tier.contains("scan1")
    lru = MemoryTier(30, policy=LRUPolicy())
    lru.put("hot", b"x" * 10)
    lru.get("hot")
    for key in ("scan1", "scan2", "scan3"):
        lru.put(key, b"x" * 10)
    assert not lru.contains("hot")


def test_pinned_entries_are_never_evicted() -> None:
    tier = MemoryTier(20)
    tier.put("pinned", b"x" * 10, pinned=True)
    for i in range(10):
        assert tier.put(f"k{i}", b"y" * 10)
    assert tier.contains("pinned")
    assert not tier.put("needs-all", b"z" * 20)  # only by evicting the pinned entry: refused
    assert tier.contains("pinned")


def test_ttl_expires_with_injected_clock() -> None:
    clock = FakeClock()
    tier = MemoryTier(100, clock=clock)
    tier.put("k", b"v", ttl_s=5)
    clock.now += 4.9
    assert tier.get("k") == b"v"
    clock.now += 0.2
    assert tier.get("k") is None and tier.stats().expirations == 1
    assert tier.stats().bytes == 0


def test_prefix_closed_parent_outlives_children() -> None:
    tier = MemoryTier(30)
    assert tier.put("p0", b"x" * 10)
    assert tier.put("p1", b"x" * 10, parent="p0")
    assert tier.put("p2", b"x" * 10, parent="p1")
    tier.get("p2")  # p0 is least recent, but it has children: the leaf p2 must go first
    assert tier.put("other", b"y" * 10)
    assert [k for k in ("p0", "p1", "p2") if tier.contains(k)] == ["p0", "p1"]
    assert tier.check() == []


def test_page_without_cached_parent_is_refused() -> None:
    tier = MemoryTier(100)
    assert not tier.put("p1", b"x", parent="p0")


def test_deleting_or_expiring_a_page_removes_its_descendants() -> None:
    clock = FakeClock()
    tier = MemoryTier(100, clock=clock)
    tier.put("p0", b"x", ttl_s=10)
    tier.put("p1", b"x", parent="p0")
    tier.put("p2", b"x", parent="p1")
    tier.put("q1", b"x", parent="p0")
    assert tier.delete("p1")
    assert not tier.contains("p2") and tier.contains("q1") and tier.check() == []
    clock.now += 11
    assert not tier.contains("p0") and not tier.contains("q1")
    assert tier.stats().items == 0 and tier.check() == []


def test_a_subtree_goes_in_the_order_its_pages_were_written() -> None:
    """Deleting a page removes its children in the order they were cached, then the page: the
    same order in every process (a set of string keys would give hash-seed order, and where a
    key sits when it goes decides its ghost in ARC or SLRU)."""
    removed: list[str] = []

    class Recording(LRUPolicy):
        def on_remove(self, key: str) -> None:
            removed.append(key)
            super().on_remove(key)

    tier = MemoryTier(100, policy=Recording())
    tier.put("root", b"x")
    children = [f"child-{i}" for i in random.Random(0).sample(range(20), 20)]
    for child in children:
        tier.put(child, b"x", parent="root")

    assert tier.delete("root")
    assert removed == [*children, "root"] and tier.check() == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "get", "delete"]),
            st.integers(0, 15),
            st.integers(1, 40),
            st.booleans(),
        ),
        max_size=120,
    ),
    st.sampled_from(["lru", "lru-k", "prefix-slru", "prefix-arc", "preheat"]),
)
def test_random_operations_keep_the_tier_consistent(ops: list, policy: str) -> None:
    """Whatever happens, the budget holds, chains stay prefix-closed, counts stay exact."""
    tier = MemoryTier(100, policy=policy)
    for op, key_id, size, chained in ops:
        key = f"k{key_id}"
        if op == "put":
            parent = f"k{key_id - 1}" if chained and key_id > 0 else None
            if parent == key:
                parent = None
            tier.put(key, bytes(size), parent=parent)
        elif op == "get":
            tier.get(key)
        else:
            tier.delete(key)
        assert tier.check() == []
        assert tier.stats().bytes <= 100


def test_prefix_slru_evicts_request_tails_and_one_offs_before_reused_blocks() -> None:
    tier = MemoryTier(40, policy="prefix-slru")
    tier.put("system", b"x" * 10)
    tier.get("system")  # reused: protected
    tier.put("tail", b"x" * 10, hint=Hint.TAIL)
    tier.put("mid", b"x" * 10)
    tier.put("new", b"x" * 10)
    tier.put("newer", b"x" * 10)  # full: the tail goes first, not the older "system"
    assert not tier.contains("tail") and tier.contains("system") and tier.contains("mid")
    for i in range(6):  # a scan of one-offs never displaces the protected block
        tier.put(f"scan{i}", b"y" * 10)
    assert tier.contains("system")


def test_prefix_slru_ghost_hit_goes_straight_to_protected() -> None:
    policy = PrefixSLRU()
    tier = MemoryTier(20, policy=policy)
    tier.put("a", b"x" * 10)
    tier.put("b", b"x" * 10)
    tier.put("c", b"x" * 10)  # evicts a (ghost)
    tier.put("a", b"x" * 10)  # a returns: protected; b (probation) is evicted
    tier.put("d", b"x" * 10)
    assert tier.contains("a") and not tier.contains("b")
    with pytest.raises(ValueError):
        PrefixSLRU(protected_share=1.0)


def test_unknown_policy_names_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown policy 'mru'; choose from lru, lru-k"):
        MemoryTier(10, policy="mru")


@pytest.mark.parametrize("policy", ["lru", "prefix-slru", "prefix-arc", "preheat"])
def test_cooled_entries_go_first(policy: str) -> None:
    tier = MemoryTier(40, policy=policy)
    for key in ("a", "b", "c", "d"):
        tier.put(key, b"x" * 10)
        tier.get(key)
    assert tier.cool(["d", "missing"]) == 1  # "d"'s conversation ended
    tier.put("e", b"x" * 10)
    assert not tier.contains("d") and all(tier.contains(k) for k in "abc")


@pytest.mark.parametrize("capacity", [200, 250])
def test_a_new_page_never_evicts_the_page_it_extends(capacity: int) -> None:
    tier = MemoryTier(capacity)
    tier.put("P", b"x" * 100)
    tier.put("Q", b"y" * 10)
    tier.cool(["P"])  # P is the policy's first victim now
    stored = tier.put("C", b"z" * 150, parent="P")
    assert tier.contains("P")
    assert stored is (capacity == 250)  # at 250 evicting Q is enough; at 200 it is refused
    assert tier.contains("Q") is (capacity == 200)
    assert tier.check() == [] and tier.stats().bytes <= capacity


@pytest.mark.parametrize(
    "policy", ["lru", "prefix-slru", "prefix-arc", "mq", "s3fifo", "lirs", "preheat"]
)
def test_kv_pages_are_never_refused_while_a_leaf_can_go(policy: str) -> None:
    """Prompts as chains of KV pages sharing prefixes: most cached pages have cached children
    and are protected, but every chain ends in a leaf, so a page that fits must always be
    stored. (S3-FIFO gave up while its small queue was all protected: the tier refused pages,
    the cache stopped taking new ones.)"""
    rng = random.Random(9)
    tier = MemoryTier(64 * 10, policy=policy)
    for _ in range(3000):
        prompt = rng.randrange(40) if rng.random() < 0.8 else rng.randrange(10**6)
        parent = None
        for depth in range(rng.randrange(1, 9)):
            page = f"{prompt}/{depth}"
            if tier.get(page) is None:
                assert tier.put(page, b"x" * 10, parent=parent), (page, tier.stats())
            parent = page
    assert tier.check() == []


def test_ttl_left_reports_remaining_seconds() -> None:
    clock = FakeClock()
    tier = MemoryTier(100, clock=clock)
    tier.put("t", b"v", ttl_s=30)
    tier.put("forever", b"v")
    clock.now += 10
    assert tier.ttl_left("t") == 20 and tier.ttl_left("forever") is None
    assert tier.ttl_left("absent") == 0.0


def _eager_reference(policy_name: str, ops: list[tuple[str, int]], capacity: int) -> list[set]:
    """The same policy driven the textbook way, one call per hit (as `simulator.replay`
    does): the resident set after every operation."""
    from cache_runtime.policies import make_policy

    policy, resident, states = make_policy(policy_name), set(), []
    for op, key_id in ops:
        key = f"k{key_id}"
        if key in resident:
            policy.on_access(key, 0.0)  # a hit, or an overwrite: both are accesses
        elif op == "put":
            if len(resident) >= capacity:
                gone = policy.victim(lambda _: False)
                policy.on_remove(gone)
                resident.discard(gone)
            policy.on_insert(key, 0.0, None)
            resident.add(key)
        states.append(set(resident))
    return states


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("policy", ["lru", "prefix-slru", "prefix-arc", "preheat"])
def test_buffered_hits_evict_exactly_as_eager_updates(seed: int, policy: str) -> None:
    """The tier records hits (and overwrites) in a read buffer and hands them to the policy in
    bulk; every eviction must still be the one the policy makes with a call per hit, or the
    benchmarked policy (replayed eagerly) would not be the served one. Long random runs (a
    skew towards low ids makes hits, repeats and re-insertions of ghosts common)."""
    import random

    rng = random.Random(seed)
    ops = [
        (rng.choice(["put", "get", "get"]), int(rng.paretovariate(0.8)) % 41) for _ in range(3000)
    ]
    capacity = 12
    tier = MemoryTier(capacity, policy=policy)  # 1-byte values: the budget is 12 entries
    expected = _eager_reference(policy, ops, capacity)
    for (op, key_id), resident in zip(ops, expected, strict=True):
        key = f"k{key_id}"
        if op == "put":
            tier.put(key, b"x")
        else:
            tier.get(key)
        assert set(tier._entries) == resident


def test_hits_from_many_threads_are_all_counted_and_the_tier_stays_consistent() -> None:
    import threading

    tier = MemoryTier(400, policy="preheat")
    for i in range(50):
        tier.put(f"k{i}", b"x" * 4)
    gets_per_thread, threads = 20_000, 4

    def reader(seed: int) -> None:
        for i in range(gets_per_thread):
            tier.get(f"k{(i * 7 + seed) % 60}")  # keys 50..59 miss

    def writer() -> None:
        for i in range(5_000):
            tier.put(f"w{i % 80}", b"y" * 4)  # evicts, drains the buffer concurrently
            if i % 7 == 0:
                tier.delete(f"k{i % 50}")

    workers = [threading.Thread(target=reader, args=(s,)) for s in range(threads)]
    workers.append(threading.Thread(target=writer))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    stats = tier.stats()
    assert stats.hits + stats.misses == threads * gets_per_thread
    assert tier.check() == []
    assert stats.bytes <= 400


def _eager_tier(policy_name: str, capacity: int, clock: FakeClock) -> MemoryTier:
    """The same tier with its read buffer off: a policy that says it reads the time gets every
    hit and overwrite as it happens (`on_access` per call), which is the eager reference."""
    from cache_runtime.policies import make_policy

    policy = make_policy(policy_name)
    policy.uses_time = True  # this instance only: the tier then takes the eager path
    return MemoryTier(capacity, policy=policy, clock=clock)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("policy", ["lru", "prefix-slru", "prefix-arc", "preheat"])
def test_buffered_tier_matches_the_eager_tier_through_deletes_ttls_and_bursts(
    seed: int, policy: str
) -> None:
    """Every operation the tier has, mixed: values that grow on overwrite, deletes, TTLs that
    expire, `contains`/`touch`/`cool`, and bursts of hundreds of hits (the duel's bulk dedup
    path). After every step both tiers hold the same keys and the same hit count."""
    import random

    rng = random.Random(seed)
    clock_a, clock_b = FakeClock(), FakeClock()
    buffered = MemoryTier(24, policy=policy, clock=clock_a)
    eager = _eager_tier(policy, 24, clock_b)
    for _ in range(2500):
        op = rng.choice(
            ["put", "put", "get", "get", "get", "delete", "ttl", "tick", "probe", "burst"]
        )
        key = f"k{int(rng.paretovariate(0.8)) % 41}"
        size = rng.choice([1, 1, 2, 3])  # an overwrite may grow the value and make room
        for tier in (buffered, eager):
            if op == "put":
                tier.put(key, bytes(size))
            elif op == "get":
                tier.get(key)
            elif op == "delete":
                tier.delete(key)
            elif op == "ttl":
                tier.put(key, b"t", ttl_s=5.0)
            elif op == "probe":
                tier.contains(key)
                tier.touch(key, None)
                tier.cool([key])
        if op == "tick":
            clock_a.now += 2.0
            clock_b.now += 2.0
        if op == "burst":
            keys = [f"k{int(rng.paretovariate(0.8)) % 41}" for _ in range(400)]
            for tier in (buffered, eager):
                for hit in keys:
                    tier.get(hit)
        assert set(buffered._entries) == set(eager._entries)
    assert buffered.stats().hits == eager.stats().hits
    assert buffered.check() == [] and eager.check() == []


def test_a_refused_overwrite_drops_the_old_value() -> None:
    """The caller wrote a newer value (other tiers took it): serving the old one from here
    would be a wrong answer, so a refused put of a cached key removes it."""
    tier = MemoryTier(300, policy="lru")
    assert tier.put("pinned", b"p" * 150, pinned=True)
    assert tier.put("limit", b"limit=OK")
    assert not tier.put("limit", b"limit=BREACHED" + b"." * 200)  # no room: pinned blocks it
    assert tier.get("limit") is None
    assert tier.stats().rejected == 1 and tier.check() == []


def test_a_refused_page_drops_its_older_copy_and_the_pages_after_it() -> None:
    tier = MemoryTier(1000, policy="lru")
    assert tier.put("root", b"r")
    assert tier.put("page", b"old", parent="root")
    assert tier.put("next", b"n", parent="page")
    assert tier.delete("root") and not tier.contains("page")
    assert tier.put("page", b"unlinked")  # cached again, without a parent
    assert tier.put("next", b"n", parent="page")
    assert not tier.put("page", b"new", parent="gone")  # its prefix is not cached: refused
    assert not tier.contains("page") and not tier.contains("next")
    assert tier.check() == []


class _NoCompaction:
    def _compact(self) -> None:
        pass


@pytest.mark.parametrize("policy_type", ["lru-k", "heat"])
def test_heap_policies_stay_bounded_and_evict_as_without_compaction(policy_type: str) -> None:
    """Every hit pushes a heap entry; compaction drops the stale ones (the heap stays within
    twice the entries) and leaves every victim as it was."""
    from cache_runtime.policies import HeatPolicy

    base = LRUKPolicy if policy_type == "lru-k" else HeatPolicy
    plain = type("Plain", (_NoCompaction, base), {})()
    compacted = base()
    rng = random.Random(7)
    live: list[str] = []
    for step in range(20_000):
        now = float(step)
        if len(live) < 50 or rng.random() < 0.02:
            key = f"k{step}"
            live.append(key)
            for policy in (plain, compacted):
                policy.on_insert(key, now)
        elif rng.random() < 0.01:
            victims = [policy.victim(lambda _: False) for policy in (plain, compacted)]
            assert victims[0] == victims[1]
            live.remove(victims[0])
            for policy in (plain, compacted):
                policy.on_remove(victims[0])
        else:
            key = rng.choice(live[:10]) if rng.random() < 0.8 else rng.choice(live)
            for policy in (plain, compacted):
                policy.on_access(key, now)
        assert len(compacted._heap) <= 2 * len(live) + 65
    assert len(plain._heap) > 10 * len(live)  # what compaction saves


class _SizeLog(LRUPolicy):
    """LRU that records what the tier tells it of its size."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def resize(self, entries: int) -> None:
        self.sizes.append(entries)


def test_the_tier_tells_the_policy_where_its_entries_moved() -> None:
    """The first eviction's entries are the policy's to learn; after that the tier says so
    where the entries at evictions, smoothed, have moved by `RESIZE_AT`, up or down."""
    policy = _SizeLog()
    tier = MemoryTier(1000, policy=policy)
    for i in range(11):  # 100-byte values: the eleventh makes the first eviction, 10 entries
        tier.put(f"a{i}", bytes(100))
    for i in range(20):  # 80-byte values in place of 100-byte ones: 12 entries, within 1.25 x
        tier.put(f"b{i}", bytes(80))
    assert policy.sizes == []
    for i in range(2000):  # 10-byte values: 100 entries
        tier.put(f"c{i}", bytes(10))
    assert policy.sizes == sorted(policy.sizes) and 80 < policy.sizes[-1] <= 100
    told = len(policy.sizes)
    for i in range(500):  # 50-byte values: 20 entries
        tier.put(f"d{i}", bytes(50))
    assert len(policy.sizes) > told and 20 <= policy.sizes[-1] < 25


def test_a_steady_mix_of_value_sizes_is_not_a_new_size() -> None:
    """5% of the keys 10 KB, the rest 100 B, in 100 KB: the entries at an eviction swing with
    how many large values are resident though the mix never changes. Told at each eviction
    whose entries were past `RESIZE_AT`, the policies heard of a new size hundreds of times
    (and LIRS, ARC, W-TinyLFU and the pool hit less than never told); smoothed, a few."""
    policy = _SizeLog()
    tier = MemoryTier(100_000, policy=policy)
    for key in (np.random.default_rng(0).zipf(1.1, 30_000) % 20_000).tolist():
        if tier.get(f"k{key}") is None:
            large = key * 2654435761 % 1000 < 50
            tier.put(f"k{key}", bytes(10_000 if large else 100))
    assert tier.stats().evictions > 15_000
    assert len(policy.sizes) < 20


def _hit_ratio(
    make: Callable[[], EvictionPolicy], first: list[int], size: int, keys: list[int]
) -> float:
    """A 10,000-byte tier of the policy `make` gives, given values of the sizes `first` before
    the keys."""
    tier = MemoryTier(10_000, policy=make())
    for i, value_size in enumerate(first):
        tier.put(f"first{i}", bytes(value_size))
    hits = 0
    for key in keys:
        if tier.get(f"k{key}") is not None:
            hits += 1
        else:
            tier.put(f"k{key}", bytes(size))
    return hits / len(keys)


def _never_told(candidate: str) -> Callable[[], EvictionPolicy]:
    """The pool's `candidate` with `resize` a no-op: the size of its first eviction for good."""
    make = CANDIDATES[candidate].make
    kwargs = getattr(make, "keywords", None) or {}
    base: Any = type(make())

    class NeverTold(base):  # type: ignore[misc]
        def resize(self, entries: int) -> None:
            pass

    return lambda: NeverTold(**kwargs)


@pytest.mark.parametrize("policy", ["lirs", "s3fifo", "mq", "mq-short", "slru", "arc", "wtinylfu"])
def test_a_policy_alone_takes_the_size_its_values_give(policy: str) -> None:
    """Three 4 KB values make the first eviction at 2 entries; 10-byte values follow, about
    1,000 of which fit. Sized for 2 entries for good, each policy hit 0.005-0.07 less on a
    skewed workload than with no large values first (LIRS 0.717 against 0.753, S3-FIFO 0.680
    against 0.752, ARC 0.747 against 0.752); told the new size (smoothed, so it comes over a few
    turnovers), each wins back more than half of that (0.54 ARC, 0.83-0.99 the others)."""
    keys = (np.random.default_rng(0).zipf(1.2, 60_000) % 20_000).tolist()
    plain = _hit_ratio(CANDIDATES[policy].make, [], 10, keys)
    stale = _hit_ratio(_never_told(policy), [4000] * 3, 10, keys)
    told = _hit_ratio(CANDIDATES[policy].make, [4000] * 3, 10, keys)
    assert plain - stale > 0.004
    assert told - stale > 0.5 * (plain - stale)


def test_s3fifo_grown_fills_its_new_room_as_its_first_fill() -> None:
    """Where the cache grows, the keys past the small queue's share go to main, as at the first
    fill: on a loop 1.3 x the cache S3-FIFO then keeps most of main as it does with no large
    values first (0.47); with every key left in the small queue it hit nothing."""
    loop = [step % 1300 for step in range(30_000)]
    s3fifo = CANDIDATES["s3fifo"].make
    plain = _hit_ratio(s3fifo, [], 10, loop)
    assert plain > 0.4
    assert _hit_ratio(s3fifo, [4000] * 3, 10, loop) > 0.8 * plain
