"""What answer validity costs a lookup: `HybridCache` next to a plain Redis GET, in one run.

Against the same server and the same 1 KiB value, interleaved round by round (a small shared
machine moves by half with its neighbours' load, so each figure is the median of its rounds):

- `redis_get`: one redis-py GET of the value, the floor of any lookup that reaches Redis;
- `redis_mget_4`: one redis-py MGET of the value and three small keys: the floor of a lookup
  that reads three counters beside the value in one round trip;
- `answer_from_redis`: an exact answer found in Redis through a cache whose only tier is Redis:
  its three generation counters and the value in one pipelined round trip;
- `answer_from_memory`: the same answer held in the memory tier above Redis: the counters'
  round trip only;
- `kv_page_from_redis`: a KV page through the same Redis-only cache: no generation is read.

Each figure is the p50 of `lookups` calls in microseconds; the ratios to `redis_get` are what the
goals name (an answer lookup at most 1.5x a GET; a KV-page lookup the same as a GET).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey, PrefixKey
from cache_runtime.services import RedisHandle
from cache_runtime.tiers import MemoryTier, RedisTier, redis_client


def _p50_us(call: Callable[[], Any], lookups: int) -> float:
    times = []
    for _ in range(lookups):
        started = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - started)
    return statistics.median(times) / 1000


def bench_lookups(
    redis_url: str | None, lookups: int = 2000, rounds: int = 5, value_bytes: int = 1024
) -> dict[str, Any]:
    value = b"v" * value_bytes
    with RedisHandle(redis_url) as url:
        client = redis_client(url, socket_timeout_s=5)
        redis_only = HybridCache([RedisTier(client, namespace="bench-lookups")])
        layered = HybridCache(
            [MemoryTier(16 << 20), RedisTier(client, namespace="bench-lookups", name="redis2")]
        )
        answer = ExactKey.of("acme", "m", "What is the daily ATM limit?").to_string()
        page = PrefixKey.chain("acme", "m", [list(range(16))])[0].to_string()
        assert redis_only.put(answer, value) and redis_only.put(page, value)
        assert layered.put(answer, value)
        raw_name = RedisTier(client, namespace="bench-lookups").redis_key(page)
        counters = [f"bench-lookups:gen:c{i}" for i in range(3)]
        client.mset({name: "4001953625082658942" for name in counters})
        checks = {
            "redis_get": lambda: client.get(raw_name),
            "redis_mget_4": lambda: client.mget([*counters, raw_name]),
            "answer_from_redis": lambda: redis_only.get(answer),
            "answer_from_memory": lambda: layered.get(answer),
            "kv_page_from_redis": lambda: redis_only.get(page),
        }
        if redis_only.get(answer) != value or layered.get_with_tier(answer)[1] != "memory":
            raise RuntimeError("the benchmark's answer was not served as set up")
        runs: dict[str, list[float]] = {name: [] for name in checks}
        for _ in range(rounds):
            for name, call in checks.items():
                runs[name].append(_p50_us(call, lookups))
        client.delete(*counters)
        redis_only.close()
        layered.close()
    p50 = {name: round(statistics.median(values), 1) for name, values in runs.items()}
    base = p50["redis_get"]
    return {
        "p50_us": p50,
        "ratio_to_redis_get": {n: round(v / base, 3) for n, v in p50.items() if n != "redis_get"},
        "lookups": lookups,
        "rounds": rounds,
        "value_bytes": value_bytes,
    }
