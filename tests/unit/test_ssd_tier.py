"""The SSD tier: checksums, heat-aware admission and eviction, index/data agreement, processes."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
from collections.abc import Iterator
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


@pytest.mark.parametrize("record", [b"short", b"x" * 40], ids=["under-header", "full-size"])
def test_a_row_from_before_write_ids_is_never_held(tier: SSDTier, record: bytes) -> None:
    """An index row without a write id (NULL, from before write ids) vouches for no record,
    whatever its length: `contains` agrees with `get`, so a warm-up does not skip the key."""
    assert tier.put("k", b"value")
    with tier._db() as db:
        db.execute("UPDATE heat SET wid = NULL WHERE key = 'k'")
    tier._data.set("k", record)
    assert not tier.contains("k")
    assert tier.get("k") is None


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


# -- regressions: expiry, crash between the two writes, races between processes ----------------


def test_touch_does_not_revive_an_expired_entry(tier: SSDTier, clock: FakeClock) -> None:
    assert tier.put("quote", b"price=100 (as of 10:00)", ttl_s=10)
    clock.now += 60  # expired, not yet dropped lazily
    assert tier.touch("quote", 3600) is False
    assert tier.get("quote") is None and not tier.contains("quote")


def _put_and_die_between_data_and_index(directory: str, key: str, value: bytes) -> None:
    """A process killed (OOM, power loss) after diskcache stored the value, before the heat
    index committed its row."""
    tier = SSDTier(Path(directory), capacity_bytes=1000)
    real_set = tier._data.set

    def set_then_die(*args, **kwargs):
        real_set(*args, **kwargs)
        os._exit(9)

    tier._data.set = set_then_die
    tier.put(key, value, ttl_s=5)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_crash_between_data_and_index_leaves_a_miss(tmp_path: Path, overwrite: bool) -> None:
    directory = tmp_path / "ssd"
    tier = SSDTier(directory, capacity_bytes=1000)
    if overwrite:
        assert tier.put("fx", b"1.0840 quoted 08:00", ttl_s=5)
    child = multiprocessing.get_context("spawn").Process(
        target=_put_and_die_between_data_and_index,
        args=(str(directory), "fx", b"1.0850 quoted 09:00" + b"!" * 900),
    )
    child.start()
    child.join(60)
    assert child.exitcode == 9
    assert tier.get("fx") is None and not tier.contains("fx")
    assert tier.check() == []  # the leftover is gone, not merely hidden
    assert tier.put("other", b"x" * 1000) and tier.check() == [] and tier.stats().bytes == 1000
    tier.close()


def _peer_loop(directory: str, clock: FakeClock, commands, results) -> None:
    tier = SSDTier(Path(directory), capacity_bytes=1000, half_life_s=60, clock=clock)
    for now, op, args, kwargs in iter(commands.get, None):
        clock.now = now
        results.put(getattr(tier, op)(*args, **kwargs))
    tier.close()


class _Peer:
    """Another process working on the same SSD directory, driven one call at a time; its clock
    follows `clock` (each call carries the time it is made at)."""

    def __init__(self, directory: Path, clock: FakeClock) -> None:
        self._clock = clock
        context = multiprocessing.get_context("spawn")
        self._commands, self._results = context.Queue(), context.Queue()
        self._process = context.Process(
            target=_peer_loop,
            args=(str(directory), clock, self._commands, self._results),
            daemon=True,
        )
        self._process.start()
        self.call("contains", "warm-up")  # started: its calls below take no start-up time

    def send(self, op: str, *args, **kwargs) -> None:
        self._commands.put((self._clock.now, op, args, kwargs))

    def result(self, timeout_s: float = 60):
        return self._results.get(timeout=timeout_s)

    def call(self, op: str, *args, **kwargs):
        self.send(op, *args, **kwargs)
        return self.result()

    def close(self) -> None:
        self._commands.put(None)
        self._process.join(10)
        if self._process.is_alive():  # stuck (a failed test): never outlive the test
            self._process.terminate()
            self._process.join(10)


@pytest.fixture
def peer(tier: SSDTier, tmp_path: Path, clock: FakeClock) -> Iterator[_Peer]:
    """A second process on `tier`'s directory, on the same (fake) time."""
    other = _Peer(tmp_path / "ssd", clock)
    yield other
    other.close()


def test_a_delete_racing_a_put_from_another_process_keeps_index_and_data_agreed(
    tier: SSDTier, peer: _Peer, clock: FakeClock
) -> None:
    assert tier.put("k", b"old" * 100)
    real_delete, landed = tier._data.delete, []

    def delete_while_the_other_process_puts(key, **kwargs):
        tier._data.delete = real_delete
        removed = real_delete(key, **kwargs)
        peer.send("put", "k", b"new" * 300)
        with contextlib.suppress(queue.Empty):  # with the fix it waits for the delete to commit
            landed.append(peer.result(timeout_s=1.0))
        return removed

    tier._data.delete = delete_while_the_other_process_puts
    tier.delete("k")
    assert (landed or [peer.result()]) == [True]
    assert tier.check() == []
    assert tier.get("k") == b"new" * 300 and tier.stats().bytes == 900


def test_get_never_serves_an_old_value_under_a_newer_expiry(
    tier: SSDTier, peer: _Peer, clock: FakeClock
) -> None:
    assert tier.put("nav", b"NAV=101.2 (yesterday)", ttl_s=60)
    clock.now += 3600  # expired an hour ago
    real_get = tier._data.get

    def read_then_the_other_process_refreshes(key, *args, **kwargs):
        tier._data.get = real_get
        stored = real_get(key, *args, **kwargs)
        assert peer.call("put", "nav", b"NAV=99.7 (today)", ttl_s=60)
        return stored

    tier._data.get = read_then_the_other_process_refreshes
    assert tier.get("nav") in (None, b"NAV=99.7 (today)")
    assert tier.get("nav") == b"NAV=99.7 (today)" and tier.check() == []


def test_lazy_expiry_never_drops_a_fresh_write_from_another_process(
    tier: SSDTier, peer: _Peer, clock: FakeClock
) -> None:
    assert tier.put("k", b"v1", ttl_s=10)
    clock.now += 20
    real_delete, landed = tier._data.delete, []

    def drop_while_the_other_process_puts(key, **kwargs):
        tier._data.delete = real_delete
        peer.send("put", "k", b"v2-fresh", ttl_s=600)
        with contextlib.suppress(queue.Empty):  # with the fix it waits for the drop to commit
            landed.append(peer.result(timeout_s=1.0))
        return real_delete(key, **kwargs)

    tier._data.delete = drop_while_the_other_process_puts
    assert tier.get("k") is None and tier.stats().expirations == 1
    assert (landed or [peer.result()]) == [True]
    assert tier.get("k") == b"v2-fresh" and peer.call("get", "k") == b"v2-fresh"
    assert tier.check() == []


def test_a_refused_overwrite_removes_the_old_value(tier: SSDTier, clock: FakeClock) -> None:
    """After put returns False the key's old value is not served: the caller holds a newer one
    (a hybrid cache keeps it in memory, and must not find the old one here once memory evicts
    it)."""
    assert tier.put("limit", b"limit=OK;" + b"." * 91)
    for hot in ("h1", "h2", "h3"):
        assert tier.put(hot, b"x" * 300)
        for _ in range(5):
            tier.get(hot)
    assert not tier.put("limit", b"limit=BREACHED;" + b"." * 185)  # colder than the hot set
    assert tier.get("limit") is None and not tier.contains("limit")
    assert tier.check() == [] and tier.stats().bytes == 900
    assert tier.put("small", b"s" * 50)
    assert not tier.put("small", b"s" * 2000)  # larger than the whole tier
    assert tier.get("small") is None and tier.check() == []


def test_evicted_values_are_handed_on_after_the_index_lock_is_released(tmp_path: Path) -> None:
    """The hybrid cache's demoter takes its own lock, which its deletes hold before this
    tier's: called under the index's write lock, a demotion would invert that order (two
    threads then wait on each other until sqlite's busy timeout). Each demotion also carries
    its value's write time, so the hybrid cache can drop one older than the key's last put."""
    import sqlite3
    import time

    tier = SSDTier(tmp_path / "ssd", capacity_bytes=250)
    seen: list[tuple[str, bool, int | None]] = []

    def on_evict(key: str, value: bytes, ttl_left: float | None, written_ns: int | None) -> None:
        other = sqlite3.connect(tier._index_path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # fails with "database is locked" under the lock
            other.execute("ROLLBACK")
            free = True
        except sqlite3.OperationalError:
            free = False
        finally:
            other.close()
        seen.append((key, free, written_ns))

    tier.on_evict = on_evict
    before = time.monotonic_ns()
    assert tier.put("a", b"a" * 100) and tier.put("b", b"b" * 100)
    assert tier.put("c", b"c" * 100, heat=10.0)  # evicts a colder one
    assert len(seen) == 1
    key, free, written_ns = seen[0]
    assert key in {"a", "b"} and free
    assert written_ns is not None and before <= written_ns <= time.monotonic_ns()


def test_a_put_that_cannot_get_the_lock_fails_fast(tmp_path: Path) -> None:
    """Another process holds the index's write lock (stuck, or a long transaction): a put
    waits `lock_timeout_s`, not sqlite's 30 s, and lands once the lock is free. (Which copy
    of an answer may be served is its generations' business, `HybridCache`, not the tier's.)"""
    import sqlite3
    import time

    tier = SSDTier(tmp_path / "ssd", 10_000, lock_timeout_s=0.2)
    assert tier.put("limit", b"limit=OK")
    stuck = sqlite3.connect(tier._index_path, isolation_level=None)
    stuck.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        assert not tier.put("limit", b"limit=NEW")
        assert time.monotonic() - started < 5
    finally:
        stuck.execute("ROLLBACK")
        stuck.close()
    assert tier.put("limit", b"limit=NEW") and tier.get("limit") == b"limit=NEW"
    assert tier.check() == []
