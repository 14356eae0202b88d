"""Live ingestion through a real Redis: exactly once into the lake, even when consumers die."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import orjson
import pytest
import redis
from helpers import wait_until

from cache_runtime.request_stream import RequestLogProducer
from data_contracts.lake import Lake
from models.ingest.pipeline import ingest_file
from models.ingest.stream import DEFAULT_GROUP, StreamConsumer

pytestmark = pytest.mark.integration
WORKER = Path(__file__).with_name("stream_worker.py")


def produce(client: redis.Redis, stream: str, n: int, **kwargs: object) -> RequestLogProducer:
    producer = RequestLogProducer(client, stream, **kwargs)
    for i in range(n):
        producer.log_request(
            tenant=f"t{i % 3}", request_id=f"req-{i}", prompt_tokens=100 + i, output_tokens=5,
            prefix_hashes=[i % 7, i], template_id=f"tpl{i % 5}", timestamp=1_709_510_400 + i,
        )  # fmt: skip
    producer.close()
    return producer


def test_produce_consume_exactly_once(redis_client: redis.Redis, lake: Lake) -> None:
    producer = produce(redis_client, "s1", 2500)
    assert producer.stats.sent == 2500 and producer.stats.dropped == 0
    consumer = StreamConsumer(redis_client, lake, "s1", "c1", batch_size=700)
    consumer.ensure_group()
    totals = consumer.drain(block_ms=100)
    assert (totals.read, totals.written, totals.acked, totals.quarantined) == (2500, 2500, 2500, 0)
    stored = lake.read("requests")
    assert len(stored) == 2500 and set(stored["request_id"]) == {f"req-{i}" for i in range(2500)}
    assert redis_client.xpending("s1", DEFAULT_GROUP)["pending"] == 0


def test_killed_consumer_mid_batch_loses_and_duplicates_nothing(
    redis_url: str, redis_client: redis.Redis, lake: Lake, tmp_path: Path
) -> None:
    produce(redis_client, "s2", 1000)
    marker = tmp_path / "written"
    victim = subprocess.Popen(
        [sys.executable, str(WORKER), redis_url, str(lake.root), "s2", str(marker)],
        env={**os.environ, "PYTHONPATH": str(Path.cwd())},
    )
    try:
        wait_until(marker.exists, timeout_s=60)  # its batch is in the lake, its XACK not yet sent
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
    assert lake.count("requests") == 400
    assert redis_client.xpending("s2", DEFAULT_GROUP)["pending"] == 400
    # a second consumer read 200 entries and died before writing anything
    redis_client.xreadgroup(DEFAULT_GROUP, "victim-2", {"s2": ">"}, count=200)
    survivor = StreamConsumer(redis_client, lake, "s2", "survivor", batch_size=300, min_idle_ms=0)
    totals = survivor.drain(block_ms=100)
    assert totals.claimed == 600  # the 400 + 200 that the dead consumers held
    assert totals.written == 600  # 400 duplicates dropped by the lake, 600 new
    stored = lake.read("requests")
    assert len(stored) == 1000 and stored["request_id"].is_unique
    assert redis_client.xpending("s2", DEFAULT_GROUP)["pending"] == 0


def test_malformed_entries_are_quarantined_and_acked(redis_client: redis.Redis, lake: Lake) -> None:
    redis_client.xadd(
        "s3", {"r": b'{"timestamp": 1709510400, "prompt_tokens": "x", "output_tokens": 1}'}
    )
    redis_client.xadd("s3", {"other": b"field"})
    redis_client.xadd("s3", {"r": b"\xff\xfe"})
    consumer = StreamConsumer(redis_client, lake, "s3", "c1")
    consumer.ensure_group()
    totals = consumer.drain(block_ms=100)
    assert (totals.read, totals.quarantined, totals.acked) == (3, 3, 3)
    reasons = sorted(lake.read("quarantine")["reason"])
    assert reasons[0].startswith("entry ") and "no 'r' field" in reasons[0]
    assert any("prompt_tokens: expected integer" in r for r in reasons)


def test_producer_spools_when_redis_is_down_and_spool_ingests_once(
    tmp_path: Path, lake: Lake
) -> None:
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    dead = redis.Redis(port=dead_port, socket_connect_timeout=0.2, socket_timeout=0.2)
    spool = tmp_path / "spool"
    producer = produce(dead, "s4", 300, spool_dir=spool, backoff_s=60)
    stats = producer.stats
    assert (stats.sent, stats.spooled, stats.dropped) == (0, 300, 0) and stats.redis_errors >= 1
    (spool_file,) = spool.glob("*.jsonl")
    report = ingest_file(spool_file, lake)
    assert (report.accepted, report.quarantined) == (300, 0)
    assert ingest_file(spool_file, lake).written == 0


def test_log_request_never_blocks_when_redis_hangs(tmp_path: Path) -> None:
    """A server that accepts and never answers: the worker hangs, the request path must not."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    hung = redis.Redis(port=listener.getsockname()[1], socket_timeout=30)
    producer = RequestLogProducer(hung, "s5", queue_size=5, batch_size=1)
    results = [
        producer.log_request(tenant="t", request_id=f"r{i}", prompt_tokens=1, output_tokens=1)
        for i in range(50)
    ]
    assert results.count(True) <= 6 and results.count(False) >= 44  # queue + the one in flight
    assert producer.stats.dropped == results.count(False)
    listener.close()
    for conn in accepted:
        conn.close()


def test_log_request_never_raises_on_unserialisable_values(redis_client: redis.Redis) -> None:
    import numpy as np

    producer = RequestLogProducer(redis_client, "s6")
    assert producer.log_request(
        tenant="t", request_id="np", prompt_tokens=np.int64(3), output_tokens=np.int32(1),
        prefix_hashes=np.array([1, 2], dtype=np.int64), latency_ms=np.float32(2.5),
    )  # fmt: skip
    assert not producer.log_request(tenant="t", request_id="big", prompt_tokens=1, output_tokens=1,
                                    prefix_hashes=[2**64])  # fmt: skip
    assert not producer.log_request(
        tenant="t", request_id="nan", prompt_tokens="x", output_tokens=1
    )
    assert producer.log_request(tenant="t", request_id="short", prompt_tokens=3, output_tokens=1,
                                prefix_hashes=[])  # fmt: skip
    producer.close()
    assert (producer.stats.sent, producer.stats.dropped) == (2, 2)
    entries = {
        orjson.loads(f[b"r"])["request_id"]: orjson.loads(f[b"r"])
        for _, f in redis_client.xrange("s6")
    }
    assert "prefix_hashes" not in entries["short"]  # [] is sent as "no blocks"
    assert entries["np"]["prefix_hashes"] == [1, 2]
