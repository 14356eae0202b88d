"""The gateway end to end when a request meets a limit or the shared tier fails: oversized
requests refused before any work, a tenant over its slots told to retry while others are
served, a Redis stopped mid-test degrading the cache and not the requests. (The setting:
test_gateway.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import EMBEDDING_MODEL, MODEL_ANSWERED, Running, chat, complete, start, unique

from cache_runtime.services import RedisServer
from flows.gateway import CACHE_HEADER
from models.serving.embeddings import MiniLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


# -- limits ---------------------------------------------------------------------------------------


def test_oversized_requests_are_refused_before_any_work_with_the_parameter_named(
    gw: Running,
) -> None:
    headers = {"Authorization": "Bearer sk-acme-1", "content-type": "application/json"}
    huge = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}'
    reply = httpx.post(f"{gw.url}/v1/chat/completions", content=huge, headers=headers)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused as the bytes pass the limit
        yield huge[: 1 << 20]
        yield huge[1 << 20 :]

    streamed = httpx.post(f"{gw.url}/v1/chat/completions", content=chunks(), headers=headers)
    assert streamed.status_code == 413

    client = gw.client()
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(
            model=gw.model, messages=[{"role": "user", "content": "hi"}], max_tokens=10**6,
            temperature=0,
        )  # fmt: skip
    assert too_many.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as inputs:
        client.embeddings.create(model=EMBEDDING_MODEL, input=["a"] * 300)
    assert inputs.value.body["param"] == "input"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="word pieces"):
        client.embeddings.create(model=EMBEDDING_MODEL, input="word " * 400)


def test_a_tenant_over_its_slots_gets_429_with_retry_after_and_others_are_served(
    backend: Any, minilm: MiniLM, tmp_path: Path, redis_url: str
) -> None:
    import threading

    running, stop = start(
        backend, minilm, tmp_path / "data", redis_url, tenant_concurrency=1, tenant_queue=0,
        retry_after_s=3,
    )  # fmt: skip
    try:
        long = {"model": running.model, "prompt": unique("A long answer, please."),
                "max_tokens": 300, "temperature": 0.7, "stream": True}  # fmt: skip
        headers = {"Authorization": "Bearer sk-acme-1"}
        started = threading.Event()

        def occupy() -> None:
            with httpx.stream("POST", f"{running.url}/v1/completions", json=long,
                              headers=headers, timeout=60) as reply:  # fmt: skip
                for _ in reply.iter_lines():
                    started.set()

        holder = threading.Thread(target=occupy)
        holder.start()
        assert started.wait(30)  # acme's one slot is taken, its queue has no room
        refused = httpx.post(f"{running.url}/v1/completions", headers=headers, timeout=30,
                             json={**long, "stream": False, "max_tokens": 4})  # fmt: skip
        other = complete(running, unique("And for beta?"), key="sk-beta-1", max_tokens=4)
        holder.join(60)

        assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert other[0] in MODEL_ANSWERED  # another tenant is not limited by acme's flood
        assert complete(running, unique("Now it is free."), max_tokens=4)[0] in MODEL_ANSWERED
    finally:
        stop()


# -- failure of the shared tier -------------------------------------------------------------------


def test_a_redis_stopped_mid_test_degrades_the_cache_not_the_requests(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    """Killed by PID: answers cannot be validated without Redis, so they miss (and are not
    stored); KV pages and embeddings still hit from memory; /healthz says degraded, with the
    component and why, within 2 s; no request fails."""
    import os
    import signal
    import time

    server = RedisServer().start()
    running, stop = start(backend, minilm, tmp_path / "data", server.url)
    try:
        stored = unique("What is the minimum balance on a savings account? " * 3)
        assert complete(running, stored)[0] == "miss"
        assert complete(running, stored)[0] == "exact-memory"
        client = running.client()
        client.embeddings.create(model=EMBEDDING_MODEL, input="offline")
        os.kill(server.pid, signal.SIGKILL)
        killed = time.monotonic()
        while httpx.get(f"{running.url}/healthz").json()["status"] != "degraded":
            assert time.monotonic() - killed < 2, "healthz did not say degraded within 2 s"
        health = httpx.get(f"{running.url}/healthz").json()
        assert "generations" in health["degraded"] and "redis" in health["degraded"]["generations"]

        source, answer = complete(running, stored)
        assert source == "prefix" and answer.choices[0].text is not None  # pages still hit
        fresh_source, fresh = complete(running, unique("Who is my account manager?"))
        chat_source, reply = chat(running, unique("Lost card, what now?"))
        embedded = client.embeddings.with_raw_response.create(
            model=EMBEDDING_MODEL, input="offline"
        )
        metrics = httpx.get(f"{running.url}/metrics").text

        assert fresh_source == "miss" and fresh.choices[0].text is not None
        assert chat_source == "miss" and reply.choices[0].message.content is not None
        assert embedded.headers[CACHE_HEADER] == "exact-memory"
        assert len(embedded.parse().data[0].embedding) == 384
        missed = 'preheat_cache_lookups_total{kind="exact",result="unvalidated",tier="generations"}'
        lines = [line for line in metrics.splitlines() if line.startswith(missed)]
        assert lines and float(lines[0].split()[-1]) >= 3  # Redis really was down for them
        assert 'preheat_cache_degraded{component="generations"} 1.0' in metrics
        producer = running.app.state.gateway.producer
        assert producer.flush(10) and producer.stats.spooled >= 3  # the log went to the spool
    finally:
        stop()
        server.stop()
