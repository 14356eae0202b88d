"""The pool selector: it switches to the candidate that wins (the switch itself:
test_pool_switch.py), and the candidates evict as their peers do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cache_runtime.candidates import CANDIDATES
from cache_runtime.policies import EvictionPolicy, Hint, LRUPolicy, keep_nothing, make_policy
from cache_runtime.pool import CHEAP_LEAD, PoolPolicy
from cache_runtime.queue_policies import LIRSPolicy, MQPolicy, S3FIFOPolicy
from cache_runtime.simulator import AppHints, replay, replay_with_app_hints
from cache_runtime.tiers.memory import MemoryTier
from cache_runtime.tinylfu import WTinyLFUPolicy

C = 200


def _loop(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """A loop a bit larger than the cache: recency keeps nothing, LIRS keeps most of it."""
    return np.tile(np.arange(int(1.3 * C)), 60), None


def _drift(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """A hot set that slides along: only recency matters, history misleads."""
    return np.arange(40_000) // 40 + rng.integers(0, C // 2, 40_000), None


def _interleave(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.empty(len(a) + len(b), dtype=np.int64)
    out[0::2], out[1::2] = a, b
    return out


def _hot_scan(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """A hot set of 70% of the cache between the blocks of a long scan."""
    scan = np.arange(10**6, 10**6 + 40_000)
    return _interleave(rng.integers(0, int(0.7 * C), 40_000), scan), None


def _frequency(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Skewed keys re-read at distances beyond the cache, with one-hit wonders between."""
    return _interleave(rng.zipf(1.05, 40_000) % (5 * C), np.arange(10**7, 10**7 + 40_000)), None


def _tails(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Requests of four shared prefix blocks (of 60 prompts) and a private last block."""
    prompts = rng.integers(0, 60, 12_000)
    blocks = np.column_stack([prompts * 10 + j for j in range(4)] + [10**6 + np.arange(12_000)])
    return blocks.ravel(), np.arange(0, blocks.size, 5)


def _count_frequency(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """A fixed skewed set of 3x the cache: long-run counts pay, recency does not."""
    return rng.zipf(1.2, 60_000) % (3 * C), None


def _shifting_hot(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Hot sets of 80% of the cache that move on, one-time keys between: a key read often
    stops being read, and a long MQ lifetime keeps it in a high queue long after."""
    phases = [p * 10_000 + rng.integers(0, int(0.8 * C), 3_000) for p in range(12)]
    hot = np.concatenate(phases)
    return _interleave(hot, 10**7 + np.arange(hot.size)), None


def _pairs_among_skewed(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Skewed keys re-read at distances beyond the cache, between scan keys each read twice:
    MQ's long lifetime keeps a scan key read twice above them; counts that outlive eviction
    admit a skewed key over a scan key."""
    return _interleave(rng.zipf(1.05, 40_000) % (4 * C), 10**7 + np.arange(40_000) // 2), None


# candidate -> (a rival that leads first, the trace built to favour the candidate over it)
FAVOURED = {
    "lirs": ("lru", _loop),
    "lru": ("lirs", _drift),
    "slru": ("lru", _hot_scan),
    "arc": ("lru", _hot_scan),
    "s3fifo": ("lru", _frequency),
    "mq": ("lru", _count_frequency),
    "mq-short": ("mq", _shifting_hot),
    "prefix-arc": ("arc", _tails),
    "prefix-slru": ("slru", _tails),
    "wtinylfu": ("mq", _pairs_among_skewed),
}


def _standalone(name: str, accesses: np.ndarray, starts: np.ndarray) -> int:
    candidate = CANDIDATES[name]
    return int(replay(candidate.make(), accesses, starts, C, hints=candidate.hinted).sum())


@pytest.mark.parametrize("favoured", list(FAVOURED))
def test_the_selector_switches_to_the_candidate_the_trace_favours(favoured: str) -> None:
    rival, build = FAVOURED[favoured]
    accesses, starts = build(np.random.default_rng(0))
    accesses = np.asarray(accesses, dtype=np.int64)
    starts = np.arange(len(accesses)) if starts is None else starts
    assert _standalone(favoured, accesses, starts) > _standalone(rival, accesses, starts)

    pool = PoolPolicy((rival, favoured), capacity=C)
    hits = replay(pool, accesses, starts, C).sum()

    assert pool.leader_name == favoured and pool.switches[0][1] == favoured
    assert hits > _standalone(rival, accesses, starts)


def _closed_conversations(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, AppHints]:
    """14 conversations at a time, 6 turns each: a turn re-reads its conversation's blocks and
    adds 3; after the last turn the application closes it, and its blocks are never read
    again. The live blocks outgrow the cache; the dead ones are what to evict."""
    accesses: list[int] = []
    ongoing: list[bool] = []
    starts: list[int] = []
    cool_after: dict[int, list[int]] = {}
    live: dict[int, list[int]] = {}  # open conversation -> its blocks, 3 a turn so far
    opened = block = 0
    while opened < 600 or live:
        while len(live) < 14 and opened < 600:
            live[opened] = []
            opened += 1
        conversation = int(rng.choice(list(live)))
        blocks = live[conversation]
        past_first_turn = bool(blocks)
        starts.append(len(accesses))
        blocks.extend(range(block, block + 3))
        block += 3
        accesses.extend(blocks)
        ongoing.extend([past_first_turn] * len(blocks))
        if len(blocks) == 6 * 3:
            cool_after[len(accesses) - 1] = list(blocks)
            del live[conversation]
    app = AppHints(np.array(ongoing), cool_after)
    return np.array(accesses, dtype=np.int64), np.array(starts), app


def test_the_selector_takes_the_hinted_lirs_where_the_applications_ends_pay() -> None:
    """The ninth candidate's trace: with the application's "conversation ended" LIRS evicts
    the closed conversations' blocks first; plain LIRS keeps them as LIR (their reuse was
    short) while live ones leave. The pool, plain LIRS leading, hands over to its hinted twin."""
    accesses, starts, app = _closed_conversations(np.random.default_rng(0))
    plain = replay(LIRSPolicy(), accesses, starts, C, hints=False).sum()
    hinted = replay_with_app_hints(LIRSPolicy(), accesses, starts, C, app).sum()
    assert hinted > 1.2 * plain

    pool = PoolPolicy(("lirs", "prefix-lirs"), capacity=C)
    hits = replay_with_app_hints(pool, accesses, starts, C, app).sum()

    assert pool.leader_name == "prefix-lirs" and pool.switches[0][1] == "prefix-lirs"
    assert hits > 1.2 * plain


def test_the_whole_pool_follows_lirs_on_a_loop() -> None:
    accesses, _ = _loop(np.random.default_rng(0))
    pool = PoolPolicy(capacity=C)
    hits = replay(pool, accesses, np.arange(len(accesses)), C).sum()
    assert pool.leader_name in ("lirs", "prefix-lirs")  # twins: no hints on this trace
    assert hits >= 0.98 * _standalone("lirs", accesses, np.arange(len(accesses)))


@pytest.mark.parametrize("build", [_loop, _frequency, _hot_scan])
def test_s3fifo_hits_what_libcachesim_s3fifo_hits(build: object) -> None:
    """The same algorithm as the peer it is measured against, first fill included: on a loop
    larger than the cache, keys of the first fill that wait in the small queue all leave (this
    policy hit 0.012 of gli at 10% where libCacheSim's hits 0.160, until `_first_fill`)."""
    from cache_runtime.traces import AccessTrace
    from models.evaluation.bench.cache_bench import libcachesim_hits

    accesses, _ = build(np.random.default_rng(3))  # type: ignore[operator]
    accesses = np.asarray(accesses, dtype=np.int64)
    starts = np.arange(len(accesses))
    trace = AccessTrace("generated", accesses, starts)
    ours = replay(S3FIFOPolicy(), accesses, starts, C, hints=False).sum()
    peer = libcachesim_hits("S3FIFO", trace, C, oracle=None).sum()  # type: ignore[arg-type]
    assert abs(int(ours) - int(peer)) <= 0.001 * len(accesses)  # ghost sizes round apart


def test_lirs_hints_send_a_tail_and_an_ended_conversation_out_first() -> None:
    from cache_runtime.policies import Hint

    lirs = LIRSPolicy()
    for key in range(100):
        lirs.on_insert(key, 0.0, None)  # type: ignore[arg-type]
    assert lirs.victim(lambda _: False) == 0  # the limit is set: the bottom LIR steps down
    lirs.on_remove(0)  # type: ignore[arg-type]
    lirs.on_insert(100, 0.0, None)  # type: ignore[arg-type]  # HIR, in the queue
    lirs.on_cold(50)  # type: ignore[arg-type]  # a LIR key: its conversation ended
    assert lirs.victim(lambda _: False) == 50
    lirs.on_remove(50)  # type: ignore[arg-type]
    lirs.on_insert(199, 0.0, None)  # type: ignore[arg-type]  # LIR: 50 left a LIR slot
    lirs.on_insert(200, 0.0, Hint.TAIL)  # type: ignore[arg-type]
    lirs.on_insert(201, 0.0, None)  # type: ignore[arg-type]
    assert lirs.victim(lambda _: False) == 200


def test_a_hinted_candidate_shares_its_twins_shadow_until_the_first_hint() -> None:
    """Without hints a hinted shadow would replicate its plain twin's, so the two share one;
    the first hint forks them. Fed the same calls (hints from the middle on), the pool of both
    must score each exactly as a pool of either alone: a late fork, or a copy that is not
    exact, shows up as a different count of hits."""
    from cache_runtime.policies import Hint

    both, hinted, plain = (
        PoolPolicy(names, sample_rate=1.0, capacity=50)
        for names in (("prefix-lirs", "lirs"), ("prefix-lirs",), ("lirs",))
    )
    rng = np.random.default_rng(5)
    keys = (rng.zipf(1.3, 4000) % 300).tolist()
    resident: set[int] = set()
    hints_given = False
    for step, key in enumerate(keys):
        late = step >= len(keys) // 2
        hint = Hint.TAIL if late and key % 3 == 0 else None
        pools = (both, hinted, plain)
        if key in resident:
            for pool in pools:
                pool.on_access(key, 0.0)
        else:
            if len(resident) >= 50:
                gone = both.victim(lambda _: False)
                for pool in pools:
                    pool.on_remove(gone)  # type: ignore[arg-type]
                resident.discard(gone)  # type: ignore[arg-type]
            for pool in pools:
                pool.on_insert(key, 0.0, hint)
            resident.add(key)
            hints_given |= hint is not None
        if late and key % 7 == 0:
            for pool in pools:
                pool.on_cold(key)
            hints_given = True
        assert len(both._shadows or ()) == (2 if hints_given else 1)
        assert both.selector.wins == hinted.selector.wins + plain.selector.wins, step
    # the hints changed what the hinted shadow hit
    assert hinted.selector.wins != plain.selector.wins


def test_hysteresis_keeps_a_tie_from_flapping() -> None:
    rng = np.random.default_rng(1)
    accesses = rng.integers(0, 3 * C, 40_000)  # uniform: every policy hits about 1/3
    # sampled (a rate of 0.32): where every key is sampled a switch needs half the lead
    pool = PoolPolicy(("lru", "arc", "s3fifo"), capacity=C, hysteresis=0.02, min_shadow=64)
    replay(pool, accesses, np.arange(len(accesses)), C)
    assert (pool.effective_rate or 1.0) < 0.5 and len(pool.switches) <= 2


def _drive(pool: PoolPolicy, keys: np.ndarray, hint_from: int) -> None:
    """`keys` through `pool` as a cache of C entries would: the last key of every five comes
    with the tail hint from the `hint_from`-th on (no hint before)."""
    for n, key in enumerate(keys.tolist()):
        if key in pool._keys:
            pool.on_access(key, 0.0)
            continue
        if len(pool._keys) >= C:
            pool.on_remove(pool.victim(lambda _: False))  # type: ignore[arg-type]
        pool.on_insert(key, 0.0, Hint.TAIL if n >= hint_from and n % 5 == 4 else None)


@pytest.mark.parametrize(("window", "accesses"), [(64, 20_000), (4096, 3_000)])
def test_the_selector_gets_the_candidates_hits_through_the_memo(window: int, accesses: int) -> None:
    """The pool turns the shadows' hits into the candidates' through a memo, checked against the
    candidates' shadows as they are now: the first hint, half-way, gives the hinted twins
    shadows of their own (and the memo is rebuilt for them); the selector has counted the
    window (its own count: test_selector.py)."""
    accesses_ = np.random.default_rng(7).zipf(1.2, accesses) % (3 * C)
    pool = PoolPolicy(capacity=C, window=window, min_shadow=1, sample_rate=0.5)
    _drive(pool, accesses_, hint_from=accesses // 2)

    selector = pool.selector
    counted = [sum((bits >> i) & 1 for bits in selector.window) for i in range(len(pool.pool))]
    assert selector.wins == counted and any(counted)
    assert len(selector.window) == min(window, selector.seen) and selector.forked
    assert (len(selector.window) == window) == (window == 64)  # full at 64, not at 4096
    for hits, result in pool._by_hits.items():
        assert result == sum(1 << i for i, j in enumerate(pool._slots) if (hits >> j) & 1)
    assert len(set(pool._slots)) == len(pool.pool)  # forked twins: the memo rebuilt for them


def _victims(name: str, keep: Callable[[object], bool] | None) -> list[object]:
    """The keys candidate `name` evicts, as a cache of 60 entries, asked with `keep` (None:
    through `evict`, as a shadow asks)."""
    policy, resident, victims = CANDIDATES[name].make(), set(), []
    for key in (np.random.default_rng(3).zipf(1.2, 20_000) % 600).tolist():
        if key in resident:
            policy.on_access(key, 0.0)
            continue
        if len(resident) >= 60:
            if keep is None:
                gone = policy.evict()
            else:
                gone = policy.victim(keep)
                policy.on_remove(gone)
            resident.discard(gone)
            victims.append(gone)
        policy.on_insert(key, 0.0, None)
        resident.add(key)
    return victims


@pytest.mark.parametrize(
    "name", ["lru", "mq", "mq-short", "arc", "slru", "s3fifo", "lirs", "wtinylfu"]
)
def test_a_cache_that_protects_nothing_skips_keep_and_evicts_the_same(name: str) -> None:
    """The replays pass `keep_nothing`, which the victims do not call, and the shadows call
    `evict` (the victim and its removal at once); any other `keep` that protects nothing must
    get the same victims."""
    protecting_nothing = _victims(name, lambda _: False)
    assert _victims(name, keep_nothing) == protecting_nothing == _victims(name, None)


@pytest.mark.parametrize("policy", [S3FIFOPolicy, MQPolicy, LIRSPolicy, WTinyLFUPolicy])
def test_candidates_evict_only_resident_keys_and_honour_keep(policy: type) -> None:
    rng = np.random.default_rng(2)
    live, resident = policy(), set()
    pinned = {"k0", "k1"}
    for key_id in rng.zipf(1.3, 5000) % 300:
        key = f"k{key_id}"
        if key in resident:
            live.on_access(key, 0.0)
            continue
        if len(resident) >= 40:
            gone = live.victim(pinned.__contains__)
            assert gone in resident and gone not in pinned
            live.on_remove(gone)
            resident.discard(gone)
        live.on_insert(key, 0.0, None)
        resident.add(key)
    assert set(live.ranked()) == resident


POOLS: dict[str, Callable[[], EvictionPolicy]] = {
    "pool, every key sampled": PoolPolicy,
    "pool, sampled (rebuilds, handovers)": lambda: PoolPolicy(sample_rate=0.25, min_shadow=4),
}


@pytest.mark.parametrize(
    "name", ["lru", "mq", "mq-short", "arc", "slru", "s3fifo", "lirs", "wtinylfu", *POOLS]
)
def test_a_victim_is_found_while_any_resident_key_may_go(name: str) -> None:
    """The memory tier protects pinned keys and every KV page with cached children (on a
    prefix-cache trace, most of it): a policy asked for a victim must name an unprotected
    resident key whenever there is one, or the tier refuses the put and the cache stops
    taking new pages. S3-FIFO gave up after two passes (its counters need four) or while its
    small queue was all protected: in the tier on Mooncake's pages at 20% it refused 2,886
    puts. The pools are sent to another candidate every 2,000 accesses, so that the victims
    come from the following, the rebuilds and the handovers too."""
    rng = np.random.default_rng(5)
    policy, resident = (POOLS[name] if name in POOLS else CANDIDATES[name].make)(), set()
    for i, key in enumerate((rng.zipf(1.2, 20_000) % 500).tolist()):
        if isinstance(policy, PoolPolicy) and i % 2000 == 1999:
            policy.selector.target = (i // 2000 + 1) % len(policy.pool)
        if key in resident:
            policy.on_access(key, 0.0)
            continue
        if len(resident) >= 50:
            protected = {k for k in resident if k % 7 or rng.random() < 0.5}  # about 93%
            gone = policy.victim(protected.__contains__)
            if resident <= protected:
                assert gone is None
                continue
            assert gone in resident and gone not in protected, (gone, len(protected))
            policy.on_remove(gone)
            resident.discard(gone)
        policy.on_insert(key, 0.0, None)
        resident.add(key)


def test_s3fifo_asks_its_small_queue_once_main_is_all_kept() -> None:
    """A ghost that returns goes to main, which can push main over its share while the small
    queue is under it: a victim is then sought in main first, and where every key of main is
    kept the small queue must still be asked (the review's case: the loop gave up there)."""
    policy = S3FIFOPolicy()
    for key in range(20):
        policy.on_insert(key, 0.0)
    first = policy.victim(keep_nothing)  # learns a capacity of 20: small [0, 1], main the rest
    assert first == 0
    policy.on_remove(0)
    policy.on_insert(0, 0.0)  # from the ghost: into main (19 keys, over its 18)
    assert policy.victim(lambda key: key != 1) == 1


def _fill(policy: WTinyLFUPolicy, keys: list[int], capacity: int, resident: set[int]) -> int:
    """`keys` through `policy` as a cache of `capacity` entries; returns the hits."""
    hits = 0
    for key in keys:
        if key in resident:
            policy.on_access(key, 0.0)
            hits += 1
            continue
        if len(resident) >= capacity:
            gone = policy.victim(keep_nothing)
            policy.on_remove(gone)  # type: ignore[arg-type]
            resident.discard(gone)  # type: ignore[arg-type]
        policy.on_insert(key, 0.0, None)
        resident.add(key)
    return hits


def test_wtinylfu_keeps_its_window_share_when_the_tier_protects_its_pages() -> None:
    """Under prefix closure a page is a parent as soon as the next page of its prompt is
    written, so most of the window is protected. Those keys move on to probation (they cannot
    lose a contest): the window keeps its share and a victim looks at a few keys, not every
    cached page (Mooncake's pages at 10% through the tier: 11,606 `keep` calls per victim
    before, 71 after)."""
    calls, victims = [0], [0]

    class Counting(WTinyLFUPolicy):
        def victim(self, keep: Callable[[object], bool]) -> object | None:
            def counted(key: object) -> bool:
                calls[0] += 1
                return keep(key)

            victims[0] += 1
            return super().victim(counted)

    policy = Counting()
    tier = MemoryTier(200 * 10, policy=policy)
    rng = np.random.default_rng(4)
    for _ in range(3000):
        prompt = int(rng.integers(60)) if rng.random() < 0.8 else int(rng.integers(10**6))
        parent = None
        for depth in range(int(rng.integers(2, 9))):
            page = f"{prompt}/{depth}"
            if tier.get(page) is None:
                assert tier.put(page, b"x" * 10, parent=parent)
                assert not policy._capacity or len(policy._window) <= policy._window_size + 1
            parent = page
    assert victims[0] > 1000 and calls[0] / victims[0] < 50
    assert tier.check() == []


def test_wtinylfu_admits_by_counts_that_outlive_eviction() -> None:
    """A scan read once cannot push out keys read often: each scan key leaves through the
    window, its count (1) below main's victim's. A key read often while in the window is
    admitted over main's victim, read once. (A count that outlives the key's eviction: the
    next test.)"""
    policy, resident = WTinyLFUPolicy(), set()
    popular = list(range(80))
    _fill(policy, popular * 4 + list(range(80, 100)), 100, resident)  # full: 80 read four times
    _fill(policy, list(range(1000, 1300)), 100, resident)  # a scan of 3 x the cache
    assert set(popular) <= resident
    assert _fill(policy, popular, 100, resident) == 80
    policy, resident = WTinyLFUPolicy(), set()
    _fill(policy, list(range(10)) + [100] * 5, 10, resident)  # 100: in the window, read 5 times
    _fill(policy, [200], 10, resident)  # pushes 100 out of the window: admitted, a key read once
    assert 100 in resident and len(set(range(10)) - resident) == 2  # (200's own insert evicted)
    lru, lru_resident = LRUPolicy(), set()
    _fill(lru, popular * 4 + list(range(80, 100)) + list(range(1000, 1300)), 100, lru_resident)
    assert not set(popular) & lru_resident  # recency alone lost every one


def _evicted(
    policy: WTinyLFUPolicy, keys: list[int], capacity: int, resident: set[int]
) -> list[int]:
    """`_fill`'s replay, returning what each miss evicted, in order."""
    gone: list[int] = []
    for key in keys:
        before = set(resident)
        _fill(policy, [key], capacity, resident)
        gone += sorted(before - resident)
    return gone


def test_wtinylfu_remembers_the_count_of_a_key_it_evicted() -> None:
    """A popular key that main gave up comes back in over a key read less often: its count
    (3 requests before it left, 4 with its return) outlived its eviction. Forgotten at
    eviction (a count dropped in `on_remove`), it would come back as a stranger (count 1) and
    leave again through the window."""
    policy, resident = WTinyLFUPolicy(), set()
    _fill(policy, list(range(10)) * 3, 10, resident)  # 0..9 read three times; full, size unknown
    assert _evicted(policy, [50] * 5, 10, resident) == [9]  # 50 enters the window, read 5 times
    assert _evicted(policy, [51], 10, resident) == [0]  # 50 (5) admitted: popular 0 (3) leaves
    assert _evicted(policy, [52], 10, resident) == [51]  # a stranger (1) loses to 1 (3)
    assert _evicted(policy, [0, 53], 10, resident) == [52, 1]  # 0 (4) admitted over 1 (3)
    assert 0 in resident and policy._counts[0] == 4


def test_wtinylfu_halves_its_counts_every_ten_times_its_size() -> None:
    """The past fades: after 10 x the cache's size requests every count is halved (and the
    keys counted once forgotten), as Caffeine's sketch does."""
    policy, resident = WTinyLFUPolicy(), set()
    _fill(policy, list(range(10)) * 3, 10, resident)  # 30 requests, capacity unknown yet
    _fill(policy, [10], 10, resident)  # the first eviction: the size is 10 from now on
    assert policy._counts[0] == 3 and policy._counts[10] == 1
    _fill(policy, [0] * 68, 10, resident)  # 99 requests so far
    assert policy._counts[0] == 15  # capped, as a 4-bit counter
    _fill(policy, [0], 10, resident)  # the 100th
    assert policy._counts == {0: 7} | {k: 1 for k in range(1, 10)}  # 3 // 2: the fill's keys


def test_pool_and_rate_are_checked() -> None:
    with pytest.raises(ValueError, match="choose from"):
        PoolPolicy(("lru", "belady"))
    with pytest.raises(ValueError, match="sample_rate"):
        PoolPolicy(sample_rate=0)
    assert PoolPolicy(capacity=1000, min_shadow=250).effective_rate == 0.25
    assert PoolPolicy(capacity=100, min_shadow=50).effective_rate == 1.0  # 0.5 or more: all
    assert PoolPolicy(capacity=10**6).effective_rate == pytest.approx(1 / 16)


def test_where_every_key_is_sampled_a_challenger_needs_a_smaller_lead() -> None:
    """There the cache follows the exact shadow, so a switch costs only a refill."""
    exact, sampled = PoolPolicy(capacity=100), PoolPolicy(capacity=10_000)
    assert exact.effective_rate == 1.0 and (sampled.effective_rate or 1.0) < 1.0
    lead = sampled.selector.lead
    assert exact.selector.lead == pytest.approx(CHEAP_LEAD * lead) and CHEAP_LEAD < 1


def test_the_tier_serves_the_pool_by_default() -> None:
    tier = MemoryTier(1000)
    assert isinstance(tier.policy, PoolPolicy) and make_policy("preheat").name == "preheat"


def test_the_shadows_start_again_where_the_cache_holds_many_times_the_entries() -> None:
    """A byte budget holds as many entries as its values allow. Filled first by large values, a
    node cache later holds hundreds of small ones (warm-up's KV pages, then traffic's answers),
    and the other way round: the shadows are rebuilt for what it holds when the tier says
    its entries moved (`RESIZE_AT`), where they used to stay at the size of the first
    eviction, every key sampled into two-entry shadows for good."""
    pool = PoolPolicy()
    tier = MemoryTier(10_000, policy=pool)
    for i in range(3):
        tier.put(f"big{i}", bytes(4000))  # the third makes the first eviction: 2 entries
    assert pool.effective_rate == 1.0 and pool._shadows is not None
    assert {shadow.capacity for shadow in pool._shadows} == {2}
    for step in range(6000):  # a loop of 1,500 keys of 10 bytes: about 1,000 fit
        key = f"k{step % 1500}"
        if tier.get(key) is None:
            tier.put(key, bytes(10))
    assert tier.stats().items >= 500 and tier.check() == []
    rate = pool.effective_rate
    assert rate is not None and rate <= 128 / 500  # sampled, as a cache of 500+ entries is
    assert {shadow.capacity for shadow in pool._shadows} == {128}
    for step in range(6000):  # a loop of 300 100-byte values: 100 fit, all sampled
        key = f"m{step % 300}"
        if tier.get(key) is None:
            tier.put(key, bytes(100))
    assert pool.effective_rate == 1.0 and tier.check() == []
    assert tier.stats().items < 256  # the 1,000-entry shadows' sample would be 1/8 of keys
    assert max(shadow.capacity for shadow in pool._shadows) < 1.25 * 100


def test_after_a_resize_the_live_policy_takes_the_new_size() -> None:
    """The leader's own sizes were learned at the first eviction too (LIRS's LIR set of 3 among
    4 entries): told the cache now holds 43, the live policy takes that size in place, as a
    policy alone does (the shadows start again: the test above)."""
    pool = PoolPolicy()
    for i in range(4):
        pool.on_insert(i, 0.0)
    pool.on_remove(pool.victim(keep_nothing))  # the first eviction: 4 entries
    for i in range(4, 44):
        pool.on_insert(i, 0.0)
    pool.resize(43)
    live = pool._live
    assert isinstance(live, LIRSPolicy) and live._lir_limit == 42


def test_a_resize_keeps_the_hinted_twins_apart() -> None:
    """Twins share a shadow until the first hint; a resize after it gives each its own again."""
    pool = PoolPolicy()
    for i in range(4):
        pool.on_insert(i, 0.0)
    pool.on_remove(pool.victim(keep_nothing))  # the first eviction: 4 entries
    pool.on_insert(4, 0.0, Hint.TAIL)  # the first hint forks the twins
    forked = len(pool._shadows or ())
    for i in range(5, 40):  # as if smaller values came: ten times the entries
        pool.on_insert(i, 0.0)
    pool.resize(39)  # what the memory tier says (`RESIZE_AT`)
    pool.on_remove(pool.victim(keep_nothing))
    assert pool._shadows is not None
    assert len(pool._shadows) == forked > len(set(pool.selector.family))
    assert {shadow.capacity for shadow in pool._shadows} == {39}


def test_the_cache_publishes_what_its_pool_decided() -> None:
    """The memory tier's pool, in the cache's metrics when they are read: the leader (LIRS, once
    a loop larger than the tier has shown LRU keeps nothing), the switches, the sampling rate."""
    from cache_runtime.hybrid import HybridCache

    tier = MemoryTier(C * 100, policy=PoolPolicy(("lru", "lirs")))
    cache = HybridCache([tier])
    cache.refresh_gauges()
    value = cache.metrics.value
    assert value("preheat_cache_policy_leader", tier="memory", policy="lru") == 1
    assert value("preheat_cache_policy_sample_rate", tier="memory") == 0  # not filled yet
    for key in np.tile(np.arange(int(1.3 * C)), 20).tolist():
        if tier.get(f"b{key}") is None:
            tier.put(f"b{key}", bytes(100))
    cache.refresh_gauges()
    assert value("preheat_cache_policy_leader", tier="memory", policy="lirs") == 1
    assert value("preheat_cache_policy_leader", tier="memory", policy="lru") == 0
    assert value("preheat_cache_policy_switches", tier="memory") >= 1
    assert value("preheat_cache_policy_sample_rate", tier="memory") == 1.0  # 200 entries: all


def test_settings_describe_the_default_pool_and_refuse_unknown_candidates() -> None:
    from pydantic import ValidationError

    from cache_runtime.settings import PolicySettings

    built = PoolPolicy.from_settings(PolicySettings())
    default = PoolPolicy()
    assert built.pool == default.pool and built.sample_rate == default.sample_rate
    assert built.hysteresis == default.hysteresis and built.min_shadow == default.min_shadow
    assert PoolPolicy.from_settings(PolicySettings(pool=("lru", "lirs"))).pool == ("lru", "lirs")
    with pytest.raises(ValidationError, match="unknown candidates"):
        PolicySettings(pool=("lru", "belady"))


def test_the_node_cache_evicts_by_the_pool_its_settings_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway and warm-up build their memory tier with `node_cache(node_settings(...))`:
    `PREHEAT_POLICY__*` must reach it (it did not: every node ran the default pool)."""
    from cache_runtime.node_cache import node_cache, node_settings

    def memory_policy() -> EvictionPolicy:
        cache = node_cache(node_settings(tmp_path, None), memory_bytes=1 << 20, ssd_bytes=0)
        try:
            (memory,) = cache.tiers
            return memory.policy
        finally:
            cache.close()

    monkeypatch.setenv("PREHEAT_POLICY__POOL", '["lru", "mq"]')
    monkeypatch.setenv("PREHEAT_POLICY__SAMPLE_RATE", "0.25")
    monkeypatch.setenv("PREHEAT_POLICY__HYSTERESIS", "0.01")
    configured = memory_policy()
    assert isinstance(configured, PoolPolicy)
    assert configured.pool == ("lru", "mq") and configured.leader_name == "lru"
    assert configured.sample_rate == 0.25 and configured.hysteresis == 0.01
    for name in ("POOL", "SAMPLE_RATE", "HYSTERESIS"):
        monkeypatch.delenv(f"PREHEAT_POLICY__{name}")
    default = memory_policy()
    assert isinstance(default, PoolPolicy) and default.pool == PoolPolicy().pool
