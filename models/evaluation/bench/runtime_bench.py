"""`preheat bench runtime`: tier operation costs next to the obvious peers, in one run.

- memory tier get/put ops/s next to `cachetools.LRUCache` and a plain dict (same keys, values,
  and sequence; capacity large enough that no run evicts, so the policy bookkeeping is measured);
- SSD tier get latency p50/p99 for 4 KiB values (the goal: p99 under 1 ms);
- Redis tier pipelined writes/s next to a raw redis-py pipeline and `redis-benchmark -P 16` SETs
  of the same keys and values against the same server (redis-benchmark only where installed);
- an answer lookup (generations and value in one pipelined round trip) and a KV-page lookup
  through `HybridCache` next to a plain Redis GET of the same value (`lookup_bench.py`).
"""

from __future__ import annotations

import csv
import random
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

import numpy as np

from cache_runtime.services import RedisHandle
from cache_runtime.tiers import MemoryTier, RedisTier, SSDTier, redis_client


def _ops_per_s(
    action: Callable[[str], object], keys: list[str], finish: Callable[[], object] | None = None
) -> float:
    """`finish` runs inside the timed region: the memory tier's reads still buffered at the
    end are handed to its policy there, so their cost is counted too."""
    started = time.perf_counter()
    for key in keys:
        action(key)
    if finish is not None:
        finish()
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


class _Contender(NamedTuple):
    put: Callable[[str, bytes], object]
    get: Callable[[str], object]
    finish: Callable[[], object] | None = None  # settles deferred work (the tier's read buffer)


def _contenders(distinct: int) -> dict[str, Callable[[], _Contender]]:
    """name -> a factory of a fresh contender for one round. cachetools is a peer for comparison
    only, not a runtime dependency; it is not thread-safe (its docs say: guard it with a lock)
    while the memory tier is, so the like-for-like peer for a threaded server is LRUCache behind
    a lock, reported too."""

    def tier(policy: str) -> Callable[[], _Contender]:
        def make() -> _Contender:
            memory = MemoryTier(capacity_bytes=distinct * 200, policy=policy)
            return _Contender(memory.put, memory.get, memory.stats)  # stats() drains

        return make

    def plain() -> _Contender:
        table: dict[str, bytes] = {}
        return _Contender(table.__setitem__, table.get)

    try:
        from cachetools import LRUCache
    except ImportError:  # installed with the dev tools; without it, the tier and a dict only
        return {"preheat": tier("preheat"), "preheat_lru": tier("lru"), "dict": plain}

    def cachetools_bare() -> _Contender:
        cache: LRUCache[str, bytes] = LRUCache(maxsize=distinct * 2)
        return _Contender(cache.__setitem__, cache.get)

    def cachetools_locked() -> _Contender:
        cache: LRUCache[str, bytes] = LRUCache(maxsize=distinct * 2)
        lock = threading.Lock()

        def put(key: str, value: bytes) -> None:
            with lock:
                cache[key] = value

        def get(key: str) -> bytes | None:
            with lock:
                return cache.get(key)

        return _Contender(put, get)

    return {
        "preheat": tier("preheat"),
        "preheat_lru": tier("lru"),
        "cachetools": cachetools_bare,
        "cachetools_locked": cachetools_locked,
        "dict": plain,
    }


def bench_memory(
    ops: int = 200_000, distinct: int = 10_000, distribution: str = "uniform", rounds: int = 5
) -> dict[str, Any]:
    """Each round gives every contender a fresh cache, `ops` puts then `ops` gets of the same
    keys (no eviction: the capacity holds them all, so policy bookkeeping is what is measured),
    contenders interleaved; each reports its median round (this machine is noisy)."""
    keys = _key_sequence(ops, distinct, distribution)
    value = b"v" * 100
    contenders = _contenders(distinct)
    runs: dict[str, dict[str, list[float]]] = {n: {"put": [], "get": []} for n in contenders}
    for _ in range(rounds):
        for name, make in contenders.items():
            put, get, finish = make()
            runs[name]["put"].append(_ops_per_s(lambda k, put=put: put(k, value), keys, finish))
            runs[name]["get"].append(_ops_per_s(get, keys, finish))
    result: dict[str, Any] = {
        "keys": distribution,
        "policy": MemoryTier(1).policy.name,
        "rounds": rounds,
    }
    for name, ops_per_s in runs.items():
        for op, values in ops_per_s.items():
            result[f"{name}_{op}_ops_per_s"] = round(statistics.median(values), 1)
    if "cachetools" not in runs:
        result["cachetools"] = None
        return result
    for op in ("get", "put"):
        peer = result[f"cachetools_{op}_ops_per_s"]
        result[f"lru_{op}_vs_cachetools"] = round(result[f"preheat_lru_{op}_ops_per_s"] / peer, 3)
        ours = result[f"preheat_{op}_ops_per_s"]
        result[f"{op}_vs_cachetools"] = round(ours / peer, 3)
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


def _redis_benchmark_rps(
    url: str, requests: int, key_pattern: str, value: bytes, clients: int = 50
) -> float | None:
    """SET/s of `redis-benchmark -P 16` (50 clients is its default) writing `requests` SETs of
    `value` to keys shaped like `key_pattern` (its `__rand_int__` becomes 12 random digits,
    `-r requests` of them), against the server at `url`.

    A custom `SET key value` command rather than `-t set`, whose keys are 16 bytes and whose
    default value is 3 bytes: the peer writes what the tier writes, so the two numbers compare.
    None where redis-benchmark is not installed (it is a peer, never a dependency) or the URL
    is TLS or a socket (it would need the certificates spelled out again).
    """
    binary = shutil.which("redis-benchmark")
    parsed = urlsplit(url)
    if binary is None or parsed.scheme != "redis":
        return None
    command = [binary, "-h", parsed.hostname or "127.0.0.1", "-p", str(parsed.port or 6379)]
    if parsed.path.strip("/"):
        command += ["--dbnum", parsed.path.strip("/")]
    if parsed.username:
        command += ["--user", unquote(parsed.username)]
    if parsed.password:
        command += ["-a", unquote(parsed.password)]
    command += ["-P", "16", "-c", str(clients), "-n", str(requests), "-r", str(requests)]
    command += ["-q", "--csv", "SET", key_pattern, value.decode()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    rows = [row for row in csv.reader(done.stdout.splitlines()) if row and row[0] != "test"]
    return float(rows[-1][1]) if rows else None


def _clear_bench_keys(client: Any, owned: bool) -> None:
    """Empty the server we started; on a configured one delete only the bench's own keys."""
    if owned:
        client.flushdb()
        return
    names = list(client.scan_iter(match="bench:*", count=10_000))
    for low in range(0, len(names), 10_000):
        client.unlink(*names[low : low + 10_000])


def bench_redis(
    redis_url: str | None, writes: int = 200_000, batch: int = 20_000, rounds: int = 3
) -> dict[str, Any]:
    """Redis tier bulk writes/s (`put_many` of `batch` entries at a time, no TTL) next to its
    peers on the same server: `redis-benchmark -P 16` with 50 clients and with one (SETs of
    the same 100 B value to keys of the same length and shape, `writes` of them) and a plain
    redis-py pipeline of SETs.

    The tier and redis-benchmark run in `rounds` interleaved rounds, each on an emptied
    database, and each figure is the median over its rounds: on a small shared machine one
    run of either moves by half with the neighbours' load. The redis-py pipeline is slow
    (~2 s) and only a reference: it runs once.
    """
    value = b"v" * 100
    owned = redis_url is None  # a server RedisHandle started: ours to empty
    with RedisHandle(redis_url) as url:
        client = redis_client(url, socket_timeout_s=5)
        tier = RedisTier(client, namespace="bench")
        items = [(f"ph|v1|exact|acme|m|{i:032x}", value, None) for i in range(writes)]
        # the tier's Redis key for the first item, with its 32-digit id made 20 zeros and the
        # 12 random digits redis-benchmark puts in place of __rand_int__
        key_pattern = tier.redis_key(items[0][0])[:-12] + "__rand_int__"
        ours: list[float] = []
        peer: list[float] = []
        single: list[float] = []
        for _ in range(rounds):
            _clear_bench_keys(client, owned)
            started = time.perf_counter()
            for low in range(0, writes, batch):
                tier.put_many(items[low : low + batch])
            ours.append(writes / (time.perf_counter() - started))
            for results, clients in ((peer, 50), (single, 1)):
                _clear_bench_keys(client, owned)
                rps = _redis_benchmark_rps(url, writes, key_pattern, value, clients=clients)
                if rps is not None:
                    results.append(rps)
        _clear_bench_keys(client, owned)
        started = time.perf_counter()
        for low in range(0, writes, batch):
            pipe = client.pipeline(transaction=False)
            for key, item_value, _ in items[low : low + batch]:
                pipe.set(f"bench:raw:{key}", item_value)
            pipe.execute()
        raw = writes / (time.perf_counter() - started)
        _clear_bench_keys(client, owned)
        tier.close()
    mine = statistics.median(ours)
    peer_rps = round(statistics.median(peer), 1) if peer else None
    single_rps = round(statistics.median(single), 1) if single else None
    return {
        "writes": writes,
        "value_bytes": len(value),
        "rounds": rounds,
        "preheat_pipelined_writes_per_s": round(mine, 1),
        "redis_py_pipeline_writes_per_s": round(raw, 1),
        "redis_benchmark_set_P16_per_s": peer_rps,
        "redis_benchmark_set_P16_one_client_per_s": single_rps,
        "vs_redis_benchmark": None if not peer_rps else round(mine / peer_rps, 3),
        "vs_redis_benchmark_one_client": None if not single_rps else round(mine / single_rps, 3),
    }


def bench_runtime(redis_url: str | None = None) -> dict[str, Any]:
    from models.evaluation.bench.lookup_bench import bench_lookups

    return {
        "memory": bench_memory(),
        "memory_zipf": bench_memory(distribution="zipf"),
        "ssd": bench_ssd(),
        "redis": bench_redis(redis_url),
        "lookups": bench_lookups(redis_url),
    }
