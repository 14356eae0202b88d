"""The SSD tier: checksums, heat-aware admission and eviction, index/data agreement, processes."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from helpers import FakeClock

from cache_runtime.tiers import Tier
from cache_runtime.tiers.ssd import SSDTier


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tier(tmp_path: Path, clock: FakeClock):
    ssd = SSDTier(tmp_path / "ssd", capacity_bytes=1000, half_life_s=60, clock=clock)
    yield ssd
    ssd.close()


def test_is_a_tier(tier: SSDTier) -> None:
    assert isinstance(tier, Tier)


def test_bit_flipped_small_value_is_dropped_not_served(tier: SSDTier) -> None:
    assert tier.put("k", b"precious answer")
    stored = bytearray(tier._data.get("k"))
    stored[-1] ^= 0x01  # one bit, as a failing disk would
    tier._data.set("k", bytes(stored))
    assert tier.check() == ["k: checksum mismatch"]
    assert tier.get("k") is None
    assert tier.stats().errors == 1 and not tier.contains("k") and tier.check() == []


def test_truncated_large_value_file_is_detected(tmp_path: Path, clock: FakeClock) -> None:
    tier = SSDTier(tmp_path / "ssd", capacity_bytes=10**7, clock=clock)
    value = bytes(range(256)) * 1024  # 256 KiB: diskcache keeps it in its own file
    assert tier.put("kv-page", value)
    (data_file,) = [p for p in (tmp_path / "ssd" / "data").rglob("*.val")]
    data_file.write_bytes(data_file.read_bytes()[:1000])  # a torn write
    assert tier.get("kv-page") is None
    assert tier.stats().errors == 1 and tier.check() == []
    tier.close()


def test_one_off_write_cannot_flush_hot_entries(tier: SSDTier, clock: FakeClock) -> None:
    for key in ("a", "b", "c", "d"):
        assert tier.put(key, b"x" * 250)
        for _ in range(5):
            tier.get(key)
    assert not tier.put("scan", b"y" * 250)  # colder than everything it would displace
    assert all(tier.contains(k) for k in "abcd") and tier.stats().rejected == 1


def test_a_warmed_entry_keeps_the_heat_it_was_warmed_with(tier: SSDTier, clock: FakeClock) -> None:
    """Rehydrated after a restart with its known heat, a block outlives newer one-off writes."""
    assert tier.put("warmed", b"w" * 250, heat=5.0)
    for key in ("a", "b", "c"):
        clock.now += 1
        assert tier.put(key, b"x" * 250)
    clock.now += 1
    assert tier.put("newcomer", b"n" * 250)  # evicts the oldest one-off, not the warmed block
    assert tier.contains("warmed") and not tier.contains("a")


def test_a_key_that_keeps_missing_earns_its_place(tier: SSDTier, clock: FakeClock) -> None:
    for key in ("a", "b", "c", "d"):
        tier.put(key, b"x" * 250)
    clock.now += 600  # ten half-lives: old heat has decayed
    for _ in range(3):
        assert tier.get("new") is None
    assert tier.put("new", b"z" * 250)
    assert tier.contains("new") and sum(tier.contains(k) for k in "abcd") == 3
    assert tier.stats().evictions == 1 and tier.check() == []


def test_eviction_follows_decayed_not_total_frequency(tier: SSDTier, clock: FakeClock) -> None:
    tier.put("yesterday", b"x" * 500)
    for _ in range(20):
        tier.get("yesterday")
    clock.now += 3600  # sixty half-lives later
    tier.put("today", b"x" * 500)
    tier.get("today")
    tier.get("incoming")
    tier.get("incoming")
    assert tier.put("incoming", b"x" * 500)
    assert not tier.contains("yesterday") and tier.contains("today")


def test_pinned_entries_stay_and_ttl_expires(tier: SSDTier, clock: FakeClock) -> None:
    assert tier.put("pinned", b"p" * 500, pinned=True)
    assert tier.put("short", b"s" * 100, ttl_s=10)
    for i in range(10):
        tier.get(f"hot{i}")
        tier.get(f"hot{i}")
        tier.put(f"hot{i}", b"h" * 400)
    assert tier.contains("pinned")
    clock.now += 11
    assert tier.get("short") is None and tier.stats().expirations >= 1


def _hammer(directory: str, worker: int) -> list[str]:
    tier = SSDTier(Path(directory), capacity_bytes=20_000)
    for i in range(150):
        key = f"k{(i * 7 + worker) % 60}"
        tier.put(key, f"{key}:{'v' * (i % 90)}".encode())
        value = tier.get(f"k{i % 60}")
        if value is not None:
            assert value.startswith(f"k{i % 60}:".encode())
    tier.close()
    return []


def test_several_processes_share_one_directory_safely(tmp_path: Path) -> None:
    directory = tmp_path / "shared-ssd"
    SSDTier(directory, capacity_bytes=20_000).close()
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        pool.starmap(_hammer, [(str(directory), w) for w in range(3)])
    tier = SSDTier(directory, capacity_bytes=20_000)
    assert tier.check() == []
    tier.close()


def test_eviction_demotes_with_the_remaining_ttl_and_never_an_expired_value(
    tier: SSDTier, clock: FakeClock
) -> None:
    demoted: dict[str, float | None] = {}
    tier.on_evict = lambda key, value, ttl, written: demoted.__setitem__(key, ttl)
    tier.put("expired", b"x" * 400, ttl_s=5)
    tier.put("lasting", b"x" * 400, ttl_s=500)
    clock.now += 100
    for _ in range(3):
        tier.get("new")
    assert tier.put("new", b"y" * 900)  # evicts both
    assert "expired" not in demoted
    assert demoted["lasting"] == pytest.approx(400)
