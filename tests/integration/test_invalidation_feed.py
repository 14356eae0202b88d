"""Invalidation across processes, with a real Redis: a delete made by one cache instance reaches
the memory and SSD tiers of the others (each instance has its own feed, connections and origin,
as a separate gateway replica would), and a replica that may have missed one does not serve
answers from its own tiers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import FakeClock, wait_until

from cache_runtime.hybrid import HybridCache
from cache_runtime.invalidation import InvalidationFeed
from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.services import RedisClusterServers, RedisServer
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

pytestmark = pytest.mark.integration


def k(prompt: str) -> ExactKey:
    return ExactKey.of("acme", "m", prompt)


class Replica:
    """One gateway process's cache: memory (and SSD when given a directory) over the shared
    Redis (a Redis Cluster with `cluster`), with its own invalidation feed."""

    def __init__(
        self,
        url: str,
        namespace: str,
        ssd_dir: Path | None = None,
        cluster: bool = False,
        **feed_options: object,
    ) -> None:
        self.memory = MemoryTier(1 << 20)
        self.ssd = None if ssd_dir is None else SSDTier(ssd_dir, 1 << 20)
        tiers = [self.memory, *([self.ssd] if self.ssd else [])]
        tier_client = redis_client(url, socket_timeout_s=0.5, cluster=cluster)
        tiers.append(RedisTier(tier_client, namespace=namespace))
        options = {"stale_after_s": 1.0, "block_ms": 100, **feed_options}
        if ssd_dir is not None:
            options.setdefault("position_path", ssd_dir / "feed.position")
        self.feed = InvalidationFeed(
            redis_client(url, socket_timeout_s=2.0, cluster=cluster),
            namespace=namespace,
            **options,
        )
        self.cache = HybridCache(tiers, feed=self.feed)

    def close(self) -> None:
        self.cache.close()


@pytest.fixture
def namespace() -> str:
    return f"feed{uuid.uuid4().hex[:8]}"


class Restartable:
    """A Redis of the test's own, which it may stop and start again on the same port."""

    def __init__(self) -> None:
        self.current = RedisServer().start()
        self.url = self.current.url

    def stop(self) -> None:
        self.current.stop()

    def restart(self) -> None:
        self.current = RedisServer(port=self.current.port).start()


@pytest.fixture
def server() -> Iterator[Restartable]:
    started = Restartable()
    yield started
    started.stop()


def test_a_delete_in_one_replica_reaches_the_others_memory(redis_url: str, namespace: str) -> None:
    a, b = Replica(redis_url, namespace), Replica(redis_url, namespace)
    try:
        wait_until(lambda: a.feed.healthy() and b.feed.healthy())
        a.cache.put(k("nav"), b"NAV=101.2")
        assert b.cache.get(k("nav")) == b"NAV=101.2"  # promoted into b's memory
        assert b.memory.contains(k("nav").to_string())
        a.cache.invalidate(k("nav"))  # the fund's NAV was restated
        wait_until(lambda: not b.memory.contains(k("nav").to_string()))
        assert b.cache.get(k("nav")) is None
        # b's own deletes reach a the same way
        b.cache.put(k("fee"), b"fee=1%")
        assert a.cache.get(k("fee")) == b"fee=1%"
        b.cache.delete(k("fee"))
        wait_until(lambda: not a.memory.contains(k("fee").to_string()))
    finally:
        a.close()
        b.close()


def test_the_feed_works_over_a_redis_cluster(namespace: str) -> None:
    with RedisClusterServers(masters=3) as cluster:
        a = Replica(cluster.url, namespace, cluster=True)
        b = Replica(cluster.url, namespace, cluster=True)
        try:
            wait_until(lambda: a.feed.healthy() and b.feed.healthy())
            for i in range(20):  # keys on every master; the stream on one
                a.cache.put(k(f"q{i}"), b"v")
                assert b.cache.get(k(f"q{i}")) == b"v"
            for i in range(20):
                a.cache.delete(k(f"q{i}"))
            wait_until(
                lambda: not any(b.memory.contains(k(f"q{i}").to_string()) for i in range(20))
            )
            assert a.feed.pending() == 0
        finally:
            a.close()
            b.close()


def test_answers_are_not_served_from_own_tiers_while_the_feed_is_behind(
    server: Restartable, namespace: str
) -> None:
    replica = Replica(server.url, namespace)
    page = PrefixKey.chain("acme", "m", [list(range(16))])[0]
    try:
        wait_until(replica.feed.healthy)
        replica.cache.put(k("rate"), b"rate=4.5%")
        replica.cache.put(page, b"kv page")
        server.stop()  # the feed cannot hear of other replicas' deletes any more
        wait_until(lambda: not replica.feed.healthy())
        assert replica.cache.get(k("rate")) is None  # held in memory, but maybe deleted
        assert replica.cache.get(page) == b"kv page"  # a KV page cannot go stale
        assert replica.cache.metrics.value(
            "preheat_cache_lookups_total", tier="memory", kind="exact", result="skipped"
        )
        server.restart()
        wait_until(replica.feed.healthy)
        assert replica.cache.get(k("rate")) == b"rate=4.5%"
    finally:
        replica.close()


def test_a_publish_that_failed_is_retried_until_the_others_hear_of_it(
    server: Restartable, namespace: str
) -> None:
    a, b = Replica(server.url, namespace), Replica(server.url, namespace)
    try:
        wait_until(lambda: a.feed.healthy() and b.feed.healthy())
        a.cache.put(k("limit"), b"limit=5M")
        assert b.cache.get(k("limit")) == b"limit=5M"
        server.stop()
        a.cache.delete(k("limit"))
        assert a.feed.pending() == 1
        assert a.cache.metrics.value("preheat_cache_errors_total", tier="all", op="publish") == 1
        assert b.memory.contains(k("limit").to_string())  # b cannot know yet, and serves
        wait_until(lambda: not b.feed.healthy())  # it for at most stale_after_s
        assert b.cache.get(k("limit")) is None
        server.restart()
        wait_until(lambda: a.feed.pending() == 0)
        wait_until(lambda: not b.memory.contains(k("limit").to_string()))
    finally:
        a.close()
        b.close()


def test_a_replica_that_may_have_missed_deletes_drops_its_own_answers(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A restart long after the node's last read (longer than the stream keeps entries): the
    SSD's answers go, its KV pages stay. A restart soon after keeps both."""
    clock = FakeClock()
    page = PrefixKey.chain("acme", "m", [list(range(16))])[0]
    first = Replica(redis_url, namespace, tmp_path / "ssd", retention_s=60.0, clock=clock)
    try:
        wait_until(first.feed.healthy)
        first.cache.put(k("quote"), b"quote=12.1")
        first.cache.put(page, b"kv page")
        wait_until(lambda: (tmp_path / "ssd" / "feed.position").exists())
    finally:
        first.close()
    assert first.ssd is not None

    clock.now += 30  # back within the retention: resumes where the node left off
    soon = Replica(redis_url, namespace, tmp_path / "ssd", retention_s=60.0, clock=clock)
    try:
        wait_until(soon.feed.healthy)
        assert soon.ssd is not None and soon.ssd.contains(k("quote").to_string())
    finally:
        soon.close()

    clock.now += 120  # down for longer than the stream keeps deletes
    late = Replica(redis_url, namespace, tmp_path / "ssd", retention_s=60.0, clock=clock)
    try:
        wait_until(late.feed.healthy)
        assert late.ssd is not None
        assert not late.ssd.contains(k("quote").to_string())
        assert late.ssd.contains(page.to_string())
        assert late.cache.get(k("quote")) == b"quote=12.1"  # Redis, which deletes reach, has it
    finally:
        late.close()


def test_feed_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="positive"):
        InvalidationFeed(None, retention_s=0)
    with pytest.raises(ValueError, match="longer than one blocking read"):
        InvalidationFeed(None, stale_after_s=0.1, block_ms=500)


# -- the feed on its own, stepped by hand ------------------------------------------------------


class Applied:
    """What a feed hands the cache: the keys to delete, and whether it asked for a drop."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.drops = 0

    def apply(self, deletions: list[tuple[str, float]]) -> None:
        self.keys.extend(key for key, _published in deletions)

    def drop(self) -> bool:
        self.drops += 1
        return True


def feed_of(url: str, namespace: str, **options: object) -> InvalidationFeed:
    options = {"stale_after_s": 1.0, "block_ms": 50, **options}
    return InvalidationFeed(redis_client(url, socket_timeout_s=2.0), namespace, **options)


def test_health_follows_the_monotonic_clock_and_a_full_batch_is_not_caught_up(
    redis_url: str, namespace: str
) -> None:
    wall, steady = FakeClock(), FakeClock(100.0)
    publisher = feed_of(redis_url, namespace)
    reader = feed_of(redis_url, namespace, clock=wall, monotonic=steady)
    seen = Applied()
    try:
        assert reader.poll(seen.apply, seen.drop, block=False) and reader.healthy()
        assert publisher.publish([f"k{i}" for i in range(1500)])
        assert reader.poll(seen.apply, seen.drop, block=False)
        assert len(seen.keys) == 1000 and not reader.healthy()  # more wait: not caught up
        assert reader.poll(seen.apply, seen.drop, block=False) and reader.healthy()
        assert seen.keys == [f"k{i}" for i in range(1500)]
        wall.now -= 3600  # a wall clock stepped back changes nothing...
        steady.now += 1.5  # ...time without a read does
        assert not reader.healthy()
    finally:
        publisher.close()
        reader.close()


def test_entries_no_feed_wrote_are_skipped_not_fatal(redis_url: str, namespace: str) -> None:
    reader, publisher = feed_of(redis_url, namespace), feed_of(redis_url, namespace)
    seen = Applied()
    try:
        assert reader.poll(seen.apply, seen.drop, block=False)
        raw = redis_client(redis_url)
        raw.xadd(reader.stream, {"something": "else"})
        raw.xadd(reader.stream, {"key": b"\xff\xfe", "origin": "x"})
        raw.close()
        publisher.publish(["after"])
        assert reader.poll(seen.apply, seen.drop, block=False)
        assert seen.keys == ["after"] and reader.malformed == 2
    finally:
        reader.close()
        publisher.close()


def test_a_restart_that_cannot_reach_redis_at_first_still_detects_a_gap(
    server: Restartable, namespace: str, tmp_path: Path
) -> None:
    """The node read the stream recently, so a restart resumes from its position; but Redis is
    down for longer than the retention before the first read: deletes may have been trimmed."""
    wall, steady = FakeClock(), FakeClock(100.0)
    position = tmp_path / "feed.position"
    options = {"retention_s": 60.0, "clock": wall, "monotonic": steady, "position_path": position}
    first = feed_of(server.url, namespace, **options)
    seen = Applied()
    assert first.poll(seen.apply, seen.drop, block=False) and position.exists()
    first.close()
    assert seen.drops == 1  # its first start: nothing vouched for the SSD before it
    server.stop()
    restarted = feed_of(server.url, namespace, **options)
    try:
        assert not restarted.poll(seen.apply, seen.drop, block=False)
        wall.now += 3600
        steady.now += 3600
        server.restart()
        assert restarted.poll(seen.apply, seen.drop, block=False)
        assert seen.drops == 2 and restarted.healthy()
    finally:
        restarted.close()


def test_the_stream_does_not_count_as_a_cached_value(redis_url: str, namespace: str) -> None:
    tier = RedisTier(redis_client(redis_url), namespace=namespace)
    feed = feed_of(redis_url, namespace)
    try:
        tier.put(k("x").to_string(), b"v")
        assert feed.publish([k("y").to_string()])
        stats = tier.stats()
        assert (stats.items, stats.bytes) == (1, 1)
    finally:
        tier.close()
        feed.close()


def test_another_replicas_delete_leaves_the_shared_tier_to_the_invalidating_one(
    redis_url: str, namespace: str
) -> None:
    """b never put the key: applying a's delete touches b's own tiers only, so it cannot wipe
    the value a stored in Redis after its delete (a refill). Where b did put it lately, b's
    copy in Redis may be older than a's delete, and goes too."""
    a, b = Replica(redis_url, namespace), Replica(redis_url, namespace)
    try:
        wait_until(lambda: a.feed.healthy() and b.feed.healthy())
        b.feed._stop.set()  # b reads by hand from here on: its deletes land when told
        b.feed._thread.join(10)

        def b_reads() -> None:
            assert b.feed.poll(b.cache._apply_remote_deletes, b.cache._drop_own_answers, False)

        a.cache.put(k("nav"), b"NAV=1")
        assert b.cache.get(k("nav")) == b"NAV=1"
        a.cache.delete(k("nav"))
        a.cache.put(k("nav"), b"NAV=2")  # the refill, before b has heard of the delete
        b_reads()
        assert not b.memory.contains(k("nav").to_string())
        assert b.cache.get(k("nav")) == b"NAV=2"

        a.cache.delete(k("fee"))
        b.cache.put(k("fee"), b"fee from the old source")  # b's put lands after a's delete
        b_reads()
        assert a.cache.get(k("fee")) is None  # gone from Redis too
    finally:
        a.close()
        b.close()


def test_a_process_whose_first_reads_fail_still_applies_the_deletes_published_meanwhile(
    server: Restartable, namespace: str
) -> None:
    """No position file (memory and Redis only): reading starts from when the feed was built,
    not from the stream's newest entry at the first read that works."""
    server.stop()
    late = feed_of(server.url, namespace)
    seen = Applied()
    try:
        assert not late.poll(seen.apply, seen.drop, block=False)
        server.restart()
        deleter = feed_of(server.url, namespace)
        assert deleter.publish(["deleted-while-late-could-not-read"])
        deleter.close()
        assert late.poll(seen.apply, seen.drop, block=False)
        assert seen.keys == ["deleted-while-late-could-not-read"] and seen.drops == 0
    finally:
        late.close()


def test_a_stream_lost_with_its_redis_is_a_gap(server: Restartable, namespace: str) -> None:
    """Redis restarted without persistence: the entry a reader resumes after is gone though
    too young to be trimmed, so deletes may be lost with it."""
    reader, publisher = feed_of(server.url, namespace), feed_of(server.url, namespace)
    seen = Applied()
    try:
        assert reader.poll(seen.apply, seen.drop, block=False)
        assert publisher.publish(["before"])
        assert reader.poll(seen.apply, seen.drop, block=False) and seen.keys == ["before"]
        server.stop()
        assert not reader.poll(seen.apply, seen.drop, block=False)
        server.restart()  # empty: the stream and any deletes in it are gone
        assert reader.poll(seen.apply, seen.drop, block=False)
        assert seen.drops == 1
    finally:
        reader.close()
        publisher.close()


def test_a_position_file_from_the_future_is_not_trusted(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    position = tmp_path / "feed.position"
    clock = FakeClock()
    stamp = {"last_id": f"{int((clock.now - 7200) * 1000)}-0", "entry": True}
    position.write_text(json.dumps({**stamp, "read_at": clock.now + 86_400}))
    feed = feed_of(redis_url, namespace, clock=clock, position_path=position)
    seen = Applied()
    try:
        assert feed.poll(seen.apply, seen.drop, block=False)
        assert seen.drops == 1  # the SSD's answers are not vouched for
    finally:
        feed.close()
