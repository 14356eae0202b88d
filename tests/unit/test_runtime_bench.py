"""The runtime benchmark runs and reports what it claims (numbers are not asserted: noisy)."""

from __future__ import annotations

import pytest

from models.evaluation.bench.runtime_bench import bench_memory, bench_redis, bench_ssd


def test_memory_and_ssd_sections() -> None:
    memory = bench_memory(ops=2000, distinct=100)
    assert memory["preheat_get_ops_per_s"] > 0 and memory["dict_get_ops_per_s"] > 0
    ssd = bench_ssd(values=50, gets=100)
    assert 0 < ssd["get_p50_us"] <= ssd["get_p99_us"]


@pytest.mark.integration
def test_redis_section(redis_url: str) -> None:
    redis = bench_redis(redis_url, writes=2000, batch=500)
    assert redis["preheat_pipelined_writes_per_s"] > 0
    assert redis["redis_py_pipeline_writes_per_s"] > 0


@pytest.mark.integration
def test_lookups_section(redis_url: str) -> None:
    from models.evaluation.bench.lookup_bench import bench_lookups

    result = bench_lookups(redis_url, lookups=50, rounds=1)
    names = ("redis_get", "redis_mget_4", "answer_from_redis", "answer_from_memory",
             "kv_page_from_redis")  # fmt: skip
    assert all(result["p50_us"][name] > 0 for name in names)
    assert set(result["ratio_to_redis_get"]) == set(names) - {"redis_get"}
