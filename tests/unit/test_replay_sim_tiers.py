"""The fast replay's tiers against the real ones: the same operations, the same answers.

`SimSSDTier` must make every decision `SSDTier` makes (admission by heat, eviction order, ghost
rows, TTL expiry, demotions), so one random sequence of operations on a tight byte budget runs
through both and every return value, every demotion and what each holds afterwards are
compared. `SimRedisTier` is checked on its own contract (LRU by entries, TTL); the replay-level
agreement of whole nodes is in `tests/integration/test_replay.py`.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cache_runtime.tiers.ssd import SSDTier
from models.evaluation.replay.sim_tiers import SimRedisTier, SimSSDTier


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _operations(seed: int, count: int, keys: int) -> list[tuple]:
    """Random gets, puts (some with a caller's heat, a TTL or a pin), deletes and touches,
    and clock steps; values of a few sizes so byte budgets, not counts, decide."""
    rng = random.Random(seed)
    ops: list[tuple] = []
    for _ in range(count):
        key = f"k{min(int(rng.expovariate(0.15)), keys - 1)}"  # a few hot keys, a long tail
        roll = rng.random()
        if roll < 0.45:
            ops.append(("get", key))
        elif roll < 0.85:
            heat = rng.choice([None, None, 0.5, 3.0, 12.0])
            ttl = rng.choice([None, None, None, 5.0, 60.0])
            ops.append(("put", key, bytes(rng.choice([40, 64, 100])), ttl, rng.random() < 0.03,
                        heat))  # fmt: skip
        elif roll < 0.9:
            ops.append(("delete", key))
        elif roll < 0.93:
            ops.append(("touch", key, rng.choice([None, 30.0])))
        else:
            ops.append(("tick", rng.choice([0.0, 1.0, 7.0, 45.0])))
    return ops


def _apply(tier: object, op: tuple, clock: _Clock) -> object:
    kind = op[0]
    if kind == "tick":
        clock.now += op[1]
        return None
    if kind == "get":
        return tier.get(op[1])  # type: ignore[attr-defined]
    if kind == "put":
        _, key, value, ttl, pinned, heat = op
        return tier.put(key, value, ttl_s=ttl, pinned=pinned, heat=heat)  # type: ignore[attr-defined]
    if kind == "delete":
        return tier.delete(op[1])  # type: ignore[attr-defined]
    return tier.touch(op[1], op[2])  # type: ignore[attr-defined]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sim_ssd_tier_decides_as_the_real_one(tmp_path: Path, seed: int) -> None:
    clock_real, clock_sim = _Clock(), _Clock()
    capacity = 640  # 6-16 values: every few puts must evict or be refused
    real = SSDTier(tmp_path / "ssd", capacity, half_life_s=60.0, clock=clock_real)
    sim = SimSSDTier(capacity, half_life_s=60.0, clock=clock_sim, ghost_limit=100_000)
    demoted: dict[str, list] = {"real": [], "sim": []}
    real.on_evict = lambda key, value, ttl, _w: demoted["real"].append((key, len(value), ttl))
    sim.on_evict = lambda key, value, ttl, _w: demoted["sim"].append((key, len(value), ttl))
    keys = [f"k{i}" for i in range(40)]
    try:
        for step, op in enumerate(_operations(seed, 1500, len(keys))):
            assert _apply(sim, op, clock_sim) == _apply(real, op, clock_real), (step, op)
            assert demoted["sim"] == demoted["real"], (step, op)
            if step % 50 == 0:
                assert [sim.contains(k) for k in keys] == [real.contains(k) for k in keys]
                assert [sim.ttl_left(k) for k in keys] == [real.ttl_left(k) for k in keys]
        held = [k for k in keys if real.contains(k)]
        assert held and held == [k for k in keys if sim.contains(k)]
        real_stats, sim_stats = real.stats(), sim.stats()
        for name in ("hits", "misses", "puts", "rejected", "evictions", "expirations", "items",
                     "bytes"):  # fmt: skip
            assert getattr(sim_stats, name) == getattr(real_stats, name), name
        assert real_stats.evictions > 0 and real_stats.rejected > 0  # the budget was tested
        assert sim.check() == []
    finally:
        real.close()


def test_sim_ssd_tier_forgets_the_coldest_ghosts() -> None:
    clock = _Clock()
    tier = SimSSDTier(1000, clock=clock, ghost_limit=2)
    for key in ("a", "b", "a", "c"):  # a: two misses (hotter); b, then c: one each
        tier.get(key)
        clock.now += 1
    # c was the third ghost: the coldest, b (one miss, the older), went
    assert set(tier._rows) == {"a", "c"}  # the index is what is tested
    assert tier.put("a", bytes(10)) and tier.stats().items == 1  # a: stored, no longer a ghost
    tier.get("d")  # ghosts c and d: within the limit
    assert set(tier._rows) == {"a", "c", "d"}


def test_sim_redis_tier_is_an_lru_of_entries_with_expiry() -> None:
    clock = _Clock()
    tier = SimRedisTier(2, clock=clock)
    tier.put("a", b"1")
    tier.put("b", b"2")
    assert tier.get("a") == b"1"  # a is now the most recent
    tier.put("c", b"3")  # evicts b, the least recently used
    assert [tier.contains(k) for k in "abc"] == [True, False, True]
    tier.put("d", b"4", ttl_s=5.0)
    assert tier.ttl_left("d") == 5.0 and tier.ttl_left("a") == 0.0  # a went (LRU), d has 5 s
    clock.now += 5.0
    assert tier.get("d") is None and not tier.contains("d")
    assert tier.stats().items == 1  # c alone: d expired
    with pytest.raises(ValueError, match="capacity"):
        SimRedisTier(0)
