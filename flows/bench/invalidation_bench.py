"""How long a delete in one process takes to reach another process's memory tier, next to the
floor of any Redis-based broadcast: one pub/sub message from publisher to subscriber.

Two `HybridCache`s (memory over one Redis, each with its own `InvalidationFeed`, connections and
origin: two gateway replicas in one process) share a key; the clock runs from the call of
`a.delete(key)` to the moment b's memory tier no longer holds it. The peer publishes one message
on a Redis channel and waits for a subscriber thread to receive it (no delete anywhere: the
floor, not a like-for-like system; no peer in the field keeps other processes' local tiers in
step). Latencies in milliseconds; the ratio
compares medians (this machine is noisy).

Also what the tombstone check costs a put: `RedisTier.put_unless_invalidated` (one server-side
script: read the tombstone, write the answer) next to a plain redis-py SET of the same key and
value on the same server, interleaved.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import numpy as np

from cache_runtime.hybrid import HybridCache
from cache_runtime.invalidation import InvalidationFeed
from cache_runtime.keys import ExactKey
from cache_runtime.services import RedisHandle
from cache_runtime.tiers import MemoryTier, RedisTier, redis_client

_TIMEOUT_S = 5.0


def _replica(url: str, namespace: str) -> tuple[HybridCache, MemoryTier]:
    memory = MemoryTier(16 << 20)
    feed = InvalidationFeed(
        redis_client(url, socket_timeout_s=5.0),
        namespace=namespace,
        publish_client=redis_client(url),
    )
    tiers = [memory, RedisTier(redis_client(url), namespace=namespace)]
    return HybridCache(tiers, feed=feed), memory


def _wait(done: Any) -> float:
    """Seconds until `done()` is true (spinning, with a yield to the reader thread)."""
    started = time.perf_counter()
    while not done():
        if time.perf_counter() - started > _TIMEOUT_S:
            raise TimeoutError("the delete never reached the other replica")
        time.sleep(0)
    return time.perf_counter() - started


def _percentiles(seconds: list[float]) -> dict[str, float]:
    millis = np.array(seconds) * 1000
    return {
        "p50_ms": round(float(np.percentile(millis, 50)), 3),
        "p99_ms": round(float(np.percentile(millis, 99)), 3),
    }


def _feed_latencies(url: str, deletes: int) -> list[float]:
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    a, _ = _replica(url, namespace)
    b, b_memory = _replica(url, namespace)
    latencies = []
    try:
        for i in range(deletes):
            key = ExactKey.of("acme", "m", f"question {i}")
            a.put(key, b"answer")
            b.get(key)  # promoted into b's memory
            text = key.to_string()
            started = time.perf_counter()
            a.delete(key)
            _wait(lambda text=text: not b_memory.contains(text))
            latencies.append(time.perf_counter() - started)
    finally:
        a.close()
        b.close()
    return latencies


def _pubsub_latencies(url: str, messages: int) -> list[float]:
    """A subscriber thread (as the feed's reader is a thread) marks each message's arrival."""
    publisher, listener = redis_client(url), redis_client(url, socket_timeout_s=5.0)
    channel = f"bench-{uuid.uuid4().hex[:8]}"
    pubsub = listener.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    _wait(lambda: pubsub.get_message(timeout=0.01) is None and pubsub.subscribed)
    arrived: list[str] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.5)
            if message is not None:
                arrived.append(message["data"].decode())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    latencies = []
    try:
        for i in range(messages):
            started = time.perf_counter()
            publisher.publish(channel, str(i))
            _wait(lambda i=i: bool(arrived) and arrived[-1] == str(i))
            latencies.append(time.perf_counter() - started)
    finally:
        stop.set()
        thread.join(5)
        pubsub.close()
        publisher.close()
        listener.close()
    return latencies


def _guarded_put_latencies(url: str, puts: int) -> tuple[list[float], list[float]]:
    """(guarded puts, plain SETs) in seconds, alternating, each of a key invalidated before."""
    namespace = f"bench{uuid.uuid4().hex[:8]}"
    tier, client = RedisTier(redis_client(url), namespace=namespace), redis_client(url)
    guarded, plain = [], []
    value = b"v" * 100
    try:
        for i in range(puts):
            key = ExactKey.of("acme", "m", f"question {i}").to_string()
            tier.delete(key)  # a tombstone to check: this tier's own, settled, so it passes
            tier.settle(key)
            looked_up = time.monotonic_ns() + 1  # strictly after the settle
            mark = tier.own_mark(key, looked_up)
            started = time.perf_counter()
            outcome = tier.put_unless_invalidated(
                key, value, ttl_s=None, looked_up_ns=looked_up, own_mark=mark
            )
            guarded.append(time.perf_counter() - started)
            if outcome != "stored":
                raise RuntimeError(f"a guarded put after its tombstone was {outcome}")
            name = tier.redis_key(key)
            started = time.perf_counter()
            client.set(name, value)
            plain.append(time.perf_counter() - started)
    finally:
        tier.close()
        client.close()
    return guarded, plain


def bench_invalidation(redis_url: str | None = None, deletes: int = 200) -> dict[str, Any]:
    with RedisHandle(redis_url) as url:
        ours = _percentiles(_feed_latencies(url, deletes))
        peer = _percentiles(_pubsub_latencies(url, deletes))
        guarded, plain = (_percentiles(run) for run in _guarded_put_latencies(url, deletes * 5))
    return {
        "deletes": deletes,
        "preheat_delete_to_other_replica": ours,
        "redis_pubsub_message": peer,
        "p50_vs_pubsub": round(ours["p50_ms"] / peer["p50_ms"], 3) if peer["p50_ms"] else None,
        "guarded_put": guarded,
        "redis_py_set": plain,
        "guarded_put_p50_vs_set": round(guarded["p50_ms"] / plain["p50_ms"], 3)
        if plain["p50_ms"]
        else None,
    }
