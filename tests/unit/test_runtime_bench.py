"""The runtime benchmark runs and reports what it claims (numbers are not asserted: noisy)."""

from __future__ import annotations

import pytest

from flows.bench.runtime_bench import bench_memory, bench_redis, bench_ssd


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
def test_invalidation_section(redis_url: str) -> None:
    from flows.bench.invalidation_bench import bench_invalidation

    result = bench_invalidation(redis_url, deletes=20)
    for name in ("preheat_delete_to_other_replica", "redis_pubsub_message", "guarded_put"):
        assert 0 < result[name]["p50_ms"] <= result[name]["p99_ms"]
    assert result["p50_vs_pubsub"] > 0
    assert result["guarded_put_p50_vs_set"] > 0  # and each guarded put was stored
