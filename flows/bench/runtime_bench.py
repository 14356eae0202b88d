"""`preheat bench runtime`: tier operation costs next to the obvious peers, in one run.

- memory tier get/put ops/s next to `cachetools.LRUCache` and a plain dict (same keys, values,
  and sequence; capacity large enough that no run evicts, so the policy bookkeeping is measured);
- SSD tier get latency p50/p99 for 4 KiB values (the goal: p99 under 1 ms);
- Redis tier pipelined writes/s next to a raw redis-py pipeline and `redis-benchmark -t set -P 16`
  against the same server (redis-benchmark only where it is installed).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cache_runtime.services import RedisHandle
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client


def _ops_per_s(action: Callable[[str], object], keys: list[str]) -> float:
    started = time.perf_counter()
    for key in keys:
        action(key)
    return round(len(keys) / (time.perf_counter() - started), 1)


def _key_sequence(ops: int, distinct: int, distribution: str) -> list[str]:
    """Uniform keys (no key repeats more than chance: the worst case for the tier's read
    buffer, which saves work on repeated hits) or Zipf(0.99) ranks, YCSB's default skew and
    the shape of real cache traffic."""
    if distribution == "uniform":
        rng = random.Random(0)
        ids = [rng.randrange(distinct) for _ in range(ops)]
    elif distribution == "zipf":
        weights = 1.0 / np.arange(1, distinct + 1) ** 0.99
        choice = np.random.default_rng(0).choice(distinct, size=ops, p=weights / weights.sum())
        ids = choice.tolist()
    else:
        raise ValueError(f"distribution must be uniform or zipf, not {distribution!r}")
    return [f"ph|v1|exact|acme|m|{i:032x}" for i in ids]


def bench_memory(
    ops: int = 200_000, distinct: int = 10_000, distribution: str = "uniform"
) -> dict[str, Any]:
    keys = _key_sequence(ops, distinct, distribution)
    value = b"v" * 100
    ours = MemoryTier(capacity_bytes=distinct * 200)
    lru = MemoryTier(capacity_bytes=distinct * 200, policy="lru")
    plain: dict[str, bytes] = {}
    result: dict[str, Any] = {
        "keys": distribution,
        "policy": ours.policy.name,
        "preheat_put_ops_per_s": _ops_per_s(lambda k: ours.put(k, value), keys),
        "preheat_get_ops_per_s": _ops_per_s(ours.get, keys),
        "preheat_lru_put_ops_per_s": _ops_per_s(lambda k: lru.put(k, value), keys),
        "preheat_lru_get_ops_per_s": _ops_per_s(lru.get, keys),
        "dict_put_ops_per_s": _ops_per_s(lambda k: plain.__setitem__(k, value), keys),
        "dict_get_ops_per_s": _ops_per_s(plain.get, keys),
    }
    try:
        from cachetools import LRUCache
    except ImportError:  # a peer for comparison only; not a runtime dependency
        result["cachetools"] = None
        return result
    peer: LRUCache[str, bytes] = LRUCache(maxsize=distinct * 2)
    result["cachetools_put_ops_per_s"] = _ops_per_s(lambda k: peer.__setitem__(k, value), keys)
    result["cachetools_get_ops_per_s"] = _ops_per_s(peer.get, keys)
    # cachetools is not thread-safe (its docs say: guard it with a lock); the memory tier is, so
    # the like-for-like peer for a multi-threaded server is LRUCache behind a lock.
    locked: LRUCache[str, bytes] = LRUCache(maxsize=distinct * 2)
    lock = threading.Lock()

    def locked_put(key: str) -> None:
        with lock:
            locked[key] = value

    def locked_get(key: str) -> bytes | None:
        with lock:
            return locked.get(key)

    result["cachetools_locked_put_ops_per_s"] = _ops_per_s(locked_put, keys)
    result["cachetools_locked_get_ops_per_s"] = _ops_per_s(locked_get, keys)
    for op in ("get", "put"):
        result[f"lru_{op}_vs_cachetools"] = round(
            result[f"preheat_lru_{op}_ops_per_s"] / result[f"cachetools_{op}_ops_per_s"], 3
        )
        ours = result[f"preheat_{op}_ops_per_s"]
        result[f"{op}_vs_cachetools"] = round(ours / result[f"cachetools_{op}_ops_per_s"], 3)
        result[f"{op}_vs_cachetools_locked"] = round(
            ours / result[f"cachetools_locked_{op}_ops_per_s"], 3
        )
    return result


def bench_ssd(values: int = 2000, gets: int = 5000, size: int = 4096) -> dict[str, Any]:
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as work:
        tier = SSDTier(Path(work), capacity_bytes=values * size * 2)
        payload = rng.randbytes(size)
        for i in range(values):
            tier.put(f"k{i}", payload)
        latencies = []
        for _ in range(gets):
            key = f"k{rng.randrange(values)}"
            started = time.perf_counter()
            tier.get(key)
            latencies.append(time.perf_counter() - started)
        tier.close()
    micros = np.array(latencies) * 1e6
    return {
        "value_bytes": size,
        "get_p50_us": round(float(np.percentile(micros, 50)), 1),
        "get_p99_us": round(float(np.percentile(micros, 99)), 1),
        "p99_under_1ms": bool(np.percentile(micros, 99) < 1000),
    }


def _redis_benchmark_rps(url: str, requests: int, clients: int = 50) -> float | None:
    """SET/s of `redis-benchmark -t set -P 16` (50 clients is its default)."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return None
    port = url.rsplit(":", 1)[1].split("/")[0]
    command = [binary, "-h", "127.0.0.1", "-p", port, "-t", "set", "-P", "16"]
    command += ["-c", str(clients), "-n", str(requests), "-q", "--csv"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    for line in done.stdout.splitlines():
        fields = [f.strip('"') for f in line.split(",")]
        if fields and fields[0] == "SET":
            return float(fields[1])
    return None


def bench_redis(
    redis_url: str | None, writes: int = 200_000, batch: int = 20_000
) -> dict[str, Any]:
    with RedisHandle(redis_url) as url:
        client = redis_client(url, socket_timeout_s=5)
        tier = RedisTier(client, namespace="bench")
        items = [(f"ph|v1|exact|acme|m|{i:032x}", b"v" * 100, None) for i in range(writes)]
        started = time.perf_counter()
        for low in range(0, writes, batch):
            tier.put_many(items[low : low + batch])
        ours = writes / (time.perf_counter() - started)
        started = time.perf_counter()
        for low in range(0, writes, batch):
            pipe = client.pipeline(transaction=False)
            for key, value, _ in items[low : low + batch]:
                pipe.set(f"raw:{key}", value)
            pipe.execute()
        raw = writes / (time.perf_counter() - started)
        peer = _redis_benchmark_rps(url, writes)
        single = _redis_benchmark_rps(url, writes, clients=1)
        client.flushdb()
        tier.close()
    return {
        "preheat_pipelined_writes_per_s": round(ours, 1),
        "redis_py_pipeline_writes_per_s": round(raw, 1),
        "redis_benchmark_set_P16_per_s": peer,
        "redis_benchmark_set_P16_one_client_per_s": single,
        "vs_redis_benchmark": None if not peer else round(ours / peer, 3),
        "vs_redis_benchmark_one_client": None if not single else round(ours / single, 3),
    }


def bench_runtime(redis_url: str | None = None) -> dict[str, Any]:
    return {
        "memory": bench_memory(),
        "memory_zipf": bench_memory(distribution="zipf"),
        "ssd": bench_ssd(),
        "redis": bench_redis(redis_url),
    }
