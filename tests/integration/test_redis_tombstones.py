"""Tombstones in Redis, with a real Redis (and a 3-master Redis Cluster): an answer computed
before another process invalidated it never lands in Redis after the invalidation, even when
the writer has not heard of it yet (no invalidation feed here: the tombstone alone must do it)."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
from helpers import wait_until

from cache_runtime.hybrid import HybridCache
from cache_runtime.invalidation import InvalidationFeed
from cache_runtime.keys import ExactKey, PrefixKey, SemanticKey
from cache_runtime.services import RedisClusterServers, RedisServer
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client

pytestmark = pytest.mark.integration


def k(prompt: str) -> ExactKey:
    return ExactKey.of("acme", "m", prompt)


class OneDirection:
    """An embedder under which every prompt is alike: one bucket, similarity 1."""

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), 8), np.float32)  # (texts, 8)
        vectors[:, 0] = 1
        return vectors


@pytest.fixture
def namespace() -> str:
    return f"tomb{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["standalone", "cluster"])
def server(request: pytest.FixtureRequest, redis_url: str) -> Iterator[tuple[str, bool]]:
    """(url, is a cluster): the session's Redis, or a 3-master Redis Cluster of its own."""
    if request.param == "standalone":
        yield redis_url, False
        return
    with RedisClusterServers(masters=3) as cluster:
        yield cluster.url, True


def delete_stalled_after_redis(
    cache: HybridCache, key: str
) -> tuple[threading.Thread, threading.Event]:
    """Start deleting `key` from `cache` (memory over Redis) in a thread, Redis first, and
    return once Redis is cleared, with the delete stalled there until the event is set: its
    own tiers are then cleared late, as when an SSD waits for its node's lock. Later deletes
    run whole."""
    shared = cache.tiers[-1]
    deleted, release = threading.Event(), threading.Event()
    real_delete = shared.delete

    def delete(key: str, **options: object) -> bool:
        result = real_delete(key, **options)  # type: ignore[arg-type]
        if not deleted.is_set():
            deleted.set()
            assert release.wait(10)
        return result

    cache.tiers = [shared, cache.tiers[0]]
    shared.delete = delete  # type: ignore[method-assign]
    deleting = threading.Thread(target=cache.delete, args=(key,))
    deleting.start()
    assert deleted.wait(10)
    return deleting, release


def replica(url: str, cluster: bool, namespace: str) -> tuple[HybridCache, MemoryTier]:
    """One serving process's cache: its own memory over the shared Redis, no feed."""
    memory = MemoryTier(1 << 20)
    shared = RedisTier(redis_client(url, cluster=cluster), namespace=namespace)
    return HybridCache([memory, shared]), memory


def test_an_answer_computed_before_another_replicas_invalidation_never_lands_in_redis(
    server: tuple[str, bool], namespace: str
) -> None:
    url, cluster = server
    (a, a_memory), (b, _), (c, _) = (replica(url, cluster, namespace) for _ in range(3))
    try:
        a.put(k("nav"), b"NAV=101.2 (yesterday)")
        assert a_memory.contains(k("nav").to_string())
        looked_up = time.monotonic_ns()  # a's lookup; it computes from the old source
        b.invalidate(k("nav"))  # the NAV was restated: b invalidates; a has not heard yet
        assert not a.put(k("nav"), b"NAV=101.2 (yesterday)", since_ns=looked_up)
        assert c.get(k("nav")) is None  # no process reads it from Redis
        assert a.get(k("nav")) is None  # and a dropped its own older copy
        assert a.metrics.writes.labels("redis", "exact", "invalidated")._value.get() == 1
        # a refill (no lookup time: computed from the new source) is written as ever
        assert a.put(k("nav"), b"NAV=100.9")
        assert c.get(k("nav")) == b"NAV=100.9"
    finally:
        for cache in (a, b, c):
            cache.close()


@pytest.mark.parametrize("skew_s", [30.0, -30.0])
def test_a_writer_whose_clock_is_off_is_refused_all_the_same(
    redis_url: str, namespace: str, skew_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guarded put sends its lookup's age, which Redis dates on its own clock, the one that
    timed the tombstone: a host whose wall clock runs 30 s ahead (or behind) of Redis's gets
    its answer from before the invalidation refused like any other."""
    (a, _), (b, _) = (replica(redis_url, False, namespace) for _ in range(2))
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
    try:
        a.put(k("nav"), b"NAV=101.2 (yesterday)")
        looked_up = time.monotonic_ns()
        b.invalidate(k("nav"))
        assert not a.put(k("nav"), b"NAV=101.2 (yesterday)", since_ns=looked_up)
        assert b.get(k("nav")) is None
        assert a.put(k("nav"), b"NAV=100.9")  # from the new source: written as ever
        assert b.get(k("nav")) == b"NAV=100.9"
    finally:
        for cache in (a, b):
            cache.close()


@pytest.mark.parametrize("skew_s", [0.0, 30.0])
def test_a_put_that_reaches_redis_late_does_not_land_an_invalidated_answer(
    redis_url: str, namespace: str, skew_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis pauses (a failover, a slow command) while a guarded put is on its way, so the
    script runs 1.5 s after the put measured its lookup's age. Its lookup's wall time still
    refuses it; if this host's clock also runs ahead (30 s), the script stores it, but the reply
    came too late to be trusted: the put deletes it again and is refused all the same."""
    (b, _), (c, _) = (replica(redis_url, False, namespace) for _ in range(2))
    shared = RedisTier(redis_client(redis_url, socket_timeout_s=5.0), namespace=namespace)
    a = HybridCache([MemoryTier(1 << 20), shared])
    admin = redis.Redis.from_url(redis_url)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
    try:
        a.put(k("nav"), b"NAV=101.2 (yesterday)")
        looked_up = time.monotonic_ns()
        b.invalidate(k("nav"))
        admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        assert not a.put(k("nav"), b"NAV=101.2 (yesterday)", since_ns=looked_up)
        assert c.get(k("nav")) is None  # after the pause: never the old NAV in Redis
        assert a.get(k("nav")) is None  # nor in a's memory
        if skew_s:
            assert shared.stats().errors >= 1  # the late "stored", taken back
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        for cache in (a, b, c):
            cache.close()


class TakenBack(RedisTier):
    """A Redis tier whose guarded puts all come back too late to trust: each is stored, then
    taken back (what `put_unless_invalidated` does with a slow "stored" reply)."""

    def put_unless_invalidated(self, key: str, value: bytes, **options: object) -> str:  # type: ignore[override]
        assert super().put_unless_invalidated(key, value, **options) == "stored"  # type: ignore[arg-type]
        self.delete(key)
        return "taken_back"


def test_a_put_taken_back_reaches_the_processes_that_read_it_meanwhile(
    redis_url: str, namespace: str
) -> None:
    """Between a late "stored" and its take-back another process may have read the answer into
    its own memory: the take-back is published like an invalidation, and that copy goes."""
    feeds = [
        InvalidationFeed(redis_client(redis_url, socket_timeout_s=2.0), namespace, block_ms=50)
        for _ in range(2)
    ]
    a = HybridCache(
        [MemoryTier(1 << 20), TakenBack(redis_client(redis_url), namespace=namespace)],
        feed=feeds[0],
    )
    c_memory = MemoryTier(1 << 20)
    c = HybridCache(
        [c_memory, RedisTier(redis_client(redis_url), namespace=namespace)], feed=feeds[1]
    )
    try:
        wait_until(lambda: feeds[0].healthy() and feeds[1].healthy())
        c_memory.put(k("nav").to_string(), b"NAV read in the window")  # c read it meanwhile
        assert not a.put(k("nav"), b"NAV read in the window", since_ns=time.monotonic_ns())
        assert a.metrics.writes.labels("redis", "exact", "invalidated")._value.get() == 1
        wait_until(lambda: not c_memory.contains(k("nav").to_string()))
        assert c.get(k("nav")) is None and a.get(k("nav")) is None
    finally:
        for cache in (a, c):
            cache.close()


def test_put_unless_invalidated_compares_the_lookup_with_the_servers_time_of_the_delete(
    server: tuple[str, bool], namespace: str
) -> None:
    url, cluster = server
    tier = RedisTier(redis_client(url, cluster=cluster), namespace=namespace)
    other = RedisTier(redis_client(url, cluster=cluster), namespace=namespace)  # a process
    admin = redis_client(url, cluster=cluster)
    key = k("limit").to_string()
    try:
        before = time.monotonic_ns() - 500_000_000  # a lookup that began before the delete
        assert tier.put_unless_invalidated(key, b"v1", ttl_s=None, looked_up_ns=before) == (
            "stored"
        )
        assert other.delete(key)
        tombstone = tier.redis_key(key) + ":invalidated"
        assert 0 < admin.pttl(tombstone) <= 3600_000  # remembered for tombstone_ttl_s
        assert tier.put_unless_invalidated(key, b"v1", ttl_s=None, looked_up_ns=before) == (
            "invalidated"
        )
        assert tier.get(key) is None
        # a lookup that began after the delete, but within the allowance for a put's transit
        # (and a host clock ahead of Redis's): refused; once past it, written
        after = time.monotonic_ns()
        assert tier.put_unless_invalidated(key, b"v2", ttl_s=30, looked_up_ns=after) == (
            "invalidated"
        )
        time.sleep(tier.transit_allowance_s + 0.05)  # the allowance itself is under test
        later = time.monotonic_ns()
        assert tier.put_unless_invalidated(key, b"v2", ttl_s=30, looked_up_ns=later) == "stored"
        assert tier.get(key) == b"v2"
        assert 0 < admin.pttl(tier.redis_key(key)) <= 30_000  # its TTL came along
        assert tier.stats().items == 1  # the tombstone is not a cached value
        # semantic answers too; KV pages cannot go stale and leave no tombstone
        bucket = SemanticKey("acme", "t1", 7).to_string()
        tier.put(bucket, b"s")
        other.delete(bucket)
        assert tier.put_unless_invalidated(bucket, b"s", ttl_s=None, looked_up_ns=before) == (
            "invalidated"
        )
        # a tombstone the caller names as its own does not refuse; another delete since does.
        # Its own: the tier's last delete, once settled (complete in every tier of its cache)
        # before the lookup
        looked_up = time.monotonic_ns()
        assert other.own_mark(bucket, looked_up) == ""  # not settled
        other.settle(bucket)
        assert other.own_mark(bucket, looked_up) == ""  # settled after the lookup
        mark = other.own_mark(bucket, time.monotonic_ns())
        assert mark
        assert (
            other.put_unless_invalidated(
                bucket, b"s", ttl_s=None, looked_up_ns=before, own_mark=mark
            )
            == "stored"
        )
        tier.delete(bucket)  # someone else's
        assert (
            other.put_unless_invalidated(
                bucket, b"s", ttl_s=None, looked_up_ns=before, own_mark=mark
            )
            == "invalidated"
        )
        page = PrefixKey.chain("acme", "m", [list(range(16))])[0].to_string()
        tier.put(page, b"kv")
        assert tier.delete(page)
        assert admin.exists(tier.redis_key(page) + ":invalidated") == 0
        with pytest.raises(ValueError, match="only answers"):
            tier.put_unless_invalidated(page, b"kv", ttl_s=None, looked_up_ns=after)
    finally:
        tier.close()
        other.close()
        admin.close()


def test_a_lookup_older_than_the_tombstones_last_is_refused(redis_url: str, namespace: str) -> None:
    tier = RedisTier(redis_client(redis_url), namespace=namespace, tombstone_ttl_s=60.0)
    try:
        key = k("old").to_string()
        # no tombstone any more could say whether it was invalidated since: refused
        long_ago = time.monotonic_ns() - 120 * 10**9
        refused = tier.put_unless_invalidated(key, b"v", ttl_s=None, looked_up_ns=long_ago)
        assert refused == "invalidated"
        lately = time.monotonic_ns() - 30 * 10**9
        assert tier.put_unless_invalidated(key, b"v", ttl_s=None, looked_up_ns=lately) == "stored"
        with pytest.raises(ValueError, match="tombstone_ttl_s"):
            RedisTier(redis_client(redis_url), namespace=namespace, tombstone_ttl_s=0)
    finally:
        tier.close()


def test_a_redis_that_is_down_degrades_the_conditional_put_never_the_request(
    namespace: str,
) -> None:
    server = RedisServer().start()
    memory = MemoryTier(1 << 20)
    shared = RedisTier(redis_client(server.url, socket_timeout_s=0.2), namespace=namespace)
    cache = HybridCache([memory, shared])
    try:
        server.stop()
        key = k("fee").to_string()
        now = time.monotonic_ns()
        assert shared.put_unless_invalidated(key, b"x", ttl_s=None, looked_up_ns=now) == ("failed")
        assert shared.stats().errors >= 1
        assert cache.put(k("fee"), b"fee=1%", since_ns=time.monotonic_ns())  # memory took it
        assert cache.get(k("fee")) == b"fee=1%"
    finally:
        cache.close()
        server.stop()


def test_a_tenant_acl_user_may_run_the_scripts(redis_url: str, namespace: str) -> None:
    """The scripts touch only their declared keys, both under the tenant's prefix."""
    admin = redis.Redis.from_url(redis_url)
    user = f"tomb-{namespace}"
    admin.execute_command(
        "ACL", "SETUSER", user, "on", ">s3cret", f"~{namespace}:acme:*", "+@all", "-@dangerous"
    )
    tier = RedisTier(redis_client(redis_url, username=user, password="s3cret"), namespace=namespace)
    try:
        key = k("q").to_string()
        now = time.monotonic_ns()
        assert tier.put_unless_invalidated(key, b"v", ttl_s=None, looked_up_ns=now) == "stored"
        assert tier.delete(key)
        assert tier.stats().errors == 0
    finally:
        tier.close()
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def test_an_evicted_answer_is_not_demoted_into_redis_after_another_replicas_invalidation(
    redis_url: str, namespace: str
) -> None:
    def small_replica() -> HybridCache:
        shared = RedisTier(redis_client(redis_url), namespace=namespace)
        return HybridCache([MemoryTier(4096), shared])

    a, b, c = small_replica(), small_replica(), small_replica()
    try:
        a.put(k("nav"), b"OLD" * 100)  # in a's memory and in Redis
        b.invalidate(k("nav"))  # a has not heard (no feed here)
        for i in range(40):  # a goes on serving: its memory evicts the old answer
            a.put(k(f"other{i}"), b"x" * 300)
        assert a.metrics.demotions.labels("redis")._value.get() > 0  # others were demoted
        assert c.get(k("nav")) is None
    finally:
        for cache in (a, b, c):
            cache.close()


def test_clearing_an_older_copy_leaves_no_tombstone(redis_url: str, namespace: str) -> None:
    """Redis outside `write_through` (write-back): each put clears Redis's older copy, which is
    not an invalidation; a tombstone there would refuse every other process's fresh answers."""
    admin = redis.Redis.from_url(redis_url)

    def write_back_replica() -> HybridCache:
        shared = RedisTier(redis_client(redis_url), namespace=namespace)
        return HybridCache([MemoryTier(1 << 20), shared], write_through=["memory"])

    a, b = write_back_replica(), write_back_replica()
    try:
        looked_up = time.monotonic_ns()
        assert a.put(k("nav"), b"NAV=100.9", since_ns=looked_up)
        assert b.put(k("nav"), b"NAV=100.9", since_ns=looked_up)
        assert list(admin.scan_iter(match=f"{namespace}:*invalidated")) == []
    finally:
        a.close()
        b.close()
        admin.close()


def test_a_refill_is_refused_if_another_replica_invalidates_after_it_began(
    redis_url: str, namespace: str
) -> None:
    (a, _), (b, _), (c, _) = (replica(redis_url, False, namespace) for _ in range(3))
    source = {"nav": "NAV=100.9"}
    read, release = threading.Event(), threading.Event()

    def recompute() -> bytes:
        value = source["nav"]
        read.set()
        assert release.wait(10)  # the model call, still running when a invalidates
        return value.encode()

    try:
        refill = b.invalidate(k("nav"), refill=recompute)
        assert refill is not None and read.wait(10)
        source["nav"] = "NAV=99.0"  # restated again after b's refill read its source
        a.invalidate(k("nav"))
        release.set()
        assert refill.result(10) is False
        assert c.get(k("nav")) is None
        # a refill that no other invalidation overtakes is stored, its own tombstone
        # notwithstanding (it is younger than the clock-skew allowance)
        assert a.invalidate(k("nav"), refill=lambda: source["nav"].encode()).result(10)
        assert c.get(k("nav")) == b"NAV=99.0"
    finally:
        release.set()
        for cache in (a, b, c):
            cache.close()


def test_a_delete_still_deletes_when_redis_is_out_of_memory(namespace: str) -> None:
    """With `noeviction` at maxmemory Redis refuses the tombstone's SET; the DEL must happen."""
    with RedisServer(extra_args=("--maxmemory-policy", "noeviction")) as server:
        admin = redis.Redis.from_url(server.url)
        tier = RedisTier(redis_client(server.url), namespace=namespace)
        key = k("nav").to_string()
        try:
            assert tier.put(key, b"OLD")
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) - 1024)
            assert tier.delete(key)
            assert tier.get(key) is None and tier.stats().errors == 0
        finally:
            admin.config_set("maxmemory", 0)
            tier.close()
            admin.close()


def test_standalone_answer_keys_keep_their_names(redis_url: str, namespace: str) -> None:
    """Only a cluster needs the hash tag: a standalone Redis keeps the names answers had, so an
    upgrade neither strands what is cached nor misses it when invalidating."""
    tier = RedisTier(redis_client(redis_url), namespace=namespace)
    try:
        key = k("nav").to_string()
        assert tier.redis_key(key) == f"{namespace}:acme:{key}"
    finally:
        tier.close()


def test_a_semantic_bucket_invalidated_after_the_lookup_is_not_written_back(
    redis_url: str, namespace: str
) -> None:
    """The gateway's semantic store reads a bucket, adds the new answer and writes it back: a
    bucket another replica invalidated meanwhile must not come back with its old entries."""
    from flows.gateway.semantic import SemanticLayer

    def layer() -> SemanticLayer:
        return SemanticLayer(replica(redis_url, False, namespace)[0], OneDirection(), 0.5)

    a, b, c = layer(), layer(), layer()
    try:
        a.store("acme", "m", "tag", "what is the NAV?", None, ("NAV=101.2", "stop", 5))
        looked_up = time.monotonic_ns()  # a's lookup of another prompt, before b's invalidation
        assert b.invalidate_prompt("acme", "m", "what is the NAV?", None) == 1
        a.store("acme", "m", "tag", "what is the fee?", None, ("fee=1%", "stop", 3), looked_up)
        assert c.lookup("acme", "m", "tag", "what is the NAV?", None) is None
    finally:
        for one in (a, b, c):
            one.cache.close()


def test_semantic_stores_of_one_bucket_made_meanwhile_are_both_kept() -> None:
    """A bucket holds many prompts' answers: another request writing it between this one's
    lookup and its store is no reason to drop this store (only a delete is)."""
    from flows.gateway.semantic import SemanticLayer

    layer = SemanticLayer(HybridCache([MemoryTier(1 << 20)]), OneDirection(), 0.5)
    try:
        a_looked_up = time.monotonic_ns()
        b_looked_up = time.monotonic_ns()
        layer.store("acme", "m", "t", "what is the fee?", None, ("fee=1%", "stop", 3), b_looked_up)
        layer.store("acme", "m", "t", "what is the NAV?", None, ("NAV=1", "stop", 3), a_looked_up)
        assert layer.lookup("acme", "m", "t", "what is the fee?", None) is not None
        assert layer.lookup("acme", "m", "t", "what is the NAV?", None) is not None
    finally:
        layer.cache.close()


def test_a_delete_is_published_before_the_deleting_process_clears_its_own_slow_tiers(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Another process must hear of the delete as soon as Redis has it: while this process's
    SSD waits for its node's lock, the other would otherwise read its own old copy and could
    write it back to Redis with a lookup time later than the tombstone."""

    def feed() -> InvalidationFeed:
        client = redis_client(redis_url, socket_timeout_s=5.0)
        return InvalidationFeed(client, namespace=namespace, block_ms=100)

    ssd = SSDTier(tmp_path / "ssd", 1 << 20, lock_timeout_s=6.0)
    a_tiers = [MemoryTier(1 << 20), ssd, RedisTier(redis_client(redis_url), namespace=namespace)]
    a = HybridCache(a_tiers, feed=feed())
    b_memory = MemoryTier(1 << 20)
    b_tiers = [b_memory, RedisTier(redis_client(redis_url), namespace=namespace)]
    b = HybridCache(b_tiers, feed=feed())
    locked, release = threading.Event(), threading.Event()

    def hold_the_node_lock() -> None:  # another process's SSD write on the node
        db = sqlite3.connect(next((tmp_path / "ssd").glob("*.sqlite")), isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(10)
        db.execute("COMMIT")
        db.close()

    try:
        wait_until(lambda: a._feed.healthy() and b._feed.healthy())  # type: ignore[union-attr]
        a.put(k("nav"), b"NAV=101.2")
        assert b.get(k("nav")) == b"NAV=101.2" and b_memory.contains(k("nav").to_string())
        holder = threading.Thread(target=hold_the_node_lock)
        holder.start()
        assert locked.wait(10)
        deleting = threading.Thread(target=a.delete, args=(k("nav"),))
        deleting.start()
        # heard while a's SSD delete still waits for the lock (up to 6 s): published first
        wait_until(lambda: not b_memory.contains(k("nav").to_string()), timeout_s=3.0)
        assert deleting.is_alive()
    finally:
        release.set()
        for cache in (a, b):
            cache.close()


def test_a_demotion_is_checked_from_the_answers_own_time_when_a_publish_never_comes(
    redis_url: str, namespace: str
) -> None:
    """The invalidating process died (or its publish failed) after its Redis delete: this
    process's feed keeps catching up past the tombstone, but its evicted old answer must still
    not go back into Redis."""
    feed = InvalidationFeed(redis_client(redis_url, socket_timeout_s=5.0), namespace=namespace)
    a_tiers = [MemoryTier(4096), RedisTier(redis_client(redis_url), namespace=namespace)]
    a = HybridCache(a_tiers, feed=feed)
    (x, _), (c, _) = (replica(redis_url, False, namespace) for _ in range(2))  # x: no feed
    try:
        a.put(k("nav"), b"OLD" * 100)
        x.invalidate(k("nav"))  # never published
        invalidated_at = time.monotonic()
        # the feed catches up past the invalidation (and the allowance): from its catch-up
        # alone, the old answer would look current
        wait_until(
            lambda: (
                (age := feed.applied_age()) is not None
                and time.monotonic() - age > invalidated_at + 1.5
            )
        )
        for i in range(40):  # a's memory evicts the old answer into Redis
            a.put(k(f"other{i}"), b"x" * 300)
        assert c.get(k("nav")) is None
        assert a.metrics.writes.labels("redis", "exact", "invalidated")._value.get() >= 1
    finally:
        for cache in (a, x, c):
            cache.close()


def test_a_bucket_read_during_this_processs_own_delete_is_not_written_back(
    redis_url: str, namespace: str
) -> None:
    """Between the Redis delete and the clearing of this process's own tiers, a request can
    still read the old bucket here; its write-back must not put it back into Redis."""
    a, _ = replica(redis_url, False, namespace)
    c, _ = replica(redis_url, False, namespace)
    bucket = SemanticKey("acme", "t@m", 0).to_string()
    release = threading.Event()
    try:
        a.put(bucket, b"[old entry]")
        deleting, release = delete_stalled_after_redis(a, bucket)
        looked_up = time.monotonic_ns()  # a request of a, after the Redis delete
        old = a.tiers[1].get(bucket)  # its own memory: not cleared yet
        assert old == b"[old entry]"
        assert not a.put(bucket, old + b"[new entry]", since_ns=looked_up)
        release.set()
        deleting.join(10)
        # nor once the delete is over, however long it took: the lookup was made during it
        assert not a.put(bucket, old + b"[new entry]", since_ns=looked_up)
        assert c.get(bucket) is None
    finally:
        release.set()
        for cache in (a, c):
            cache.close()


def test_two_semantic_writes_of_one_bucket_at_once_keep_the_bucket(
    redis_url: str, namespace: str
) -> None:
    """Two requests storing into one bucket at the same moment: the second is refused (a miss
    for its entry); before, both ended superseded and deleted the bucket for everyone."""
    admin = redis.Redis.from_url(redis_url)
    writing, release = threading.Event(), threading.Event()

    class Held(RedisTier):
        def put_unless_invalidated(self, *args: object, **kwargs: object) -> str:
            writing.set()
            assert release.wait(10)
            return super().put_unless_invalidated(*args, **kwargs)  # type: ignore[arg-type]

    a = HybridCache([MemoryTier(1 << 20), Held(redis_client(redis_url), namespace=namespace)])
    bucket = SemanticKey("acme", "t@m", 1).to_string()
    results: dict[int, bool] = {}
    try:
        first_lookup, second_lookup = time.monotonic_ns(), time.monotonic_ns()
        first = threading.Thread(
            target=lambda: results.update({1: a.put(bucket, b"[e1]", since_ns=first_lookup)})
        )
        first.start()
        assert writing.wait(10)
        results[2] = a.put(bucket, b"[e2]", since_ns=second_lookup)  # while the first writes
        release.set()
        first.join(10)
        assert results == {1: True, 2: False}
        assert a.get(bucket) == b"[e1]"
        assert admin.exists(a.tiers[1].redis_key(bucket) + ":invalidated") == 0  # type: ignore[attr-defined]
    finally:
        release.set()
        a.close()
        admin.close()


def test_answers_are_not_demoted_while_the_feed_may_have_missed_a_delete(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """An answer this process may not have heard was invalidated is not carried into a tier
    that other processes read (the node's SSD); KV pages, which cannot go stale, still are."""
    now = [0.0]
    feed = InvalidationFeed(
        redis_client(redis_url, socket_timeout_s=5.0), namespace=namespace, monotonic=lambda: now[0]
    )
    ssd = SSDTier(tmp_path / "ssd", 1 << 20)
    tiers = [MemoryTier(4096), ssd, RedisTier(redis_client(redis_url), namespace=namespace)]
    b = HybridCache(tiers, write_through=["memory", "redis"], feed=feed)
    try:
        wait_until(feed.healthy)
        now[0] += 3600.0  # the feed has not caught up for an hour
        assert not feed.healthy()
        b.put(k("nav"), b"OLD" * 100)
        for i in range(40):
            b.put(k(f"other{i}"), b"x" * 300)
        assert not ssd.contains(k("nav").to_string())
    finally:
        b.close()


def test_a_put_is_refused_while_any_delete_of_its_key_is_still_running(
    redis_url: str, namespace: str
) -> None:
    """Two deletes of one key overlap (an invalidation and a superseded put's cleanup, say):
    the second ending is no sign that the first has cleared every tier."""
    a, _ = replica(redis_url, False, namespace)
    c, _ = replica(redis_url, False, namespace)
    bucket = SemanticKey("acme", "t@m", 2).to_string()
    release = threading.Event()
    try:
        a.put(bucket, b"[old entry]")
        first, release = delete_stalled_after_redis(a, bucket)
        a.delete(bucket)  # the second delete runs whole and ends
        looked_up = time.monotonic_ns()
        old = a.tiers[1].get(bucket) or b"[old entry]"  # what the first has not cleared
        assert not a.put(bucket, old + b"[new entry]", since_ns=looked_up)
        release.set()
        first.join(10)
        assert c.get(bucket) is None
    finally:
        release.set()
        for cache in (a, c):
            cache.close()


def test_an_own_delete_after_the_lookup_refuses_it_even_once_the_fence_is_forgotten(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fences are kept only for copies in flight; a generation can outlast them. Another
    process invalidates after the lookup, then this one does too (its tombstone replaces the
    other's): its own tombstone, left after the lookup, must still refuse the answer."""
    from cache_runtime import fences

    monkeypatch.setattr(fences, "_TTL_NS", 0)  # forget every fence but the newest at once
    monkeypatch.setattr(fences, "_LIMIT", 0)
    (a, _), (b, _) = (replica(redis_url, False, namespace) for _ in range(2))
    try:
        looked_up = time.monotonic_ns()  # a misses and starts generating
        b.invalidate(k("fee"))
        a.invalidate(k("fee"))
        a.put(k("other"), b"x")  # traffic: the fence of k("fee") goes
        assert k("fee").to_string() not in a._fences
        assert not a.put(k("fee"), b"fee=2% (old)", since_ns=looked_up)
        assert b.get(k("fee")) is None
    finally:
        a.close()
        b.close()
