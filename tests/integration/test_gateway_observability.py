"""The gateway end to end, observability: the twelve metrics, latency and hits by outcome and
tier, the canary group, spans, the live request stream and /healthz; a failing metric never
fails a request. (The setting: test_gateway.py.)"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
import redis
from gateway_support import EMBEDDING_MODEL, MARKER, Running, complete, metric, start, unique

from cache_runtime.candidates import DEFAULT_POOL
from cache_runtime.keys import ExactKey
from models.serving.embeddings import MiniLM

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


# -- the twelve metrics and the traces ------------------------------------------------------------


def test_every_one_of_the_twelve_metrics_is_exported(gw: Running) -> None:
    from cache_runtime.serving.metrics import HELP

    complete(gw, unique("What is the overdraft limit?"))
    text = httpx.get(f"{gw.url}/metrics").text
    from prometheus_client.parser import text_string_to_metric_families

    exported = {family.name for family in text_string_to_metric_families(text)}
    assert set(HELP) <= exported, set(HELP) - exported
    assert metric(text, "preheat_gateway_slo_seconds") == 1.0
    assert metric(text, "preheat_gateway_cold_start_seconds", phase="load") > 0
    memory = metric(text, "preheat_gateway_accelerator_memory_bytes", device="cpu",
                    source="process_rss")  # fmt: skip
    assert memory > 10_000_000
    assert metric(text, "preheat_gateway_feature_load_seconds_count", what="minilm") == 1
    # the memory tier's pool: its first candidate leads until the shadows say otherwise
    assert metric(text, "preheat_cache_policy_leader", tier="memory", policy=DEFAULT_POOL[0]) == 1


def test_the_canary_group_is_served_without_the_cache_and_its_share_is_observed(
    backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    import random

    running, stop = start(
        backend, minilm, tmp_path / "data", None, inject={"rng": random.Random(5)},
        semantic=False, refresh_s=0, canary_share=0.5,
    )  # fmt: skip
    try:
        prompt = unique("What is the interest on a savings account?")
        running.cache.put(ExactKey.of("acme", running.model, prompt), MARKER.encode())
        answers = [complete(running, prompt) for _ in range(16)]
        opted_out = complete(running, prompt, extra_body={"cache": False})[0]
        text = httpx.get(f"{running.url}/metrics").text
    finally:
        stop()
    canary = [a for source, a in answers if source == "canary"]
    cached = [a for source, a in answers if source != "canary"]
    assert 0 < len(canary) < 16 and opted_out == "bypass"  # an opt-out is not in the control
    assert all(a.choices[0].text != MARKER for a in canary)  # the cache was off for them
    assert all(a.choices[0].text == MARKER for a in cached)
    assert metric(text, "preheat_gateway_canary_share") == pytest.approx(len(canary) / 16)
    assert metric(text, "preheat_gateway_canary_requests_total", group="canary") == len(canary)


def test_requests_cache_lookups_and_model_calls_are_spans_and_off_means_none(
    gw: Running, backend: Any, minilm: MiniLM, tmp_path: Path
) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cache_runtime.serving.metrics import tenant_label
    from cache_runtime.telemetry import TracingSettings, build_provider

    assert isinstance(gw.app.state.gateway.tracer, trace.NoOpTracer)  # the default: off
    exporter = InMemorySpanExporter()
    provider = build_provider(TracingSettings(), exporter)
    inject = {"tracer_provider": provider}
    running, stop = start(
        backend, minilm, tmp_path / "data", None, inject, semantic=False, refresh_s=0
    )
    try:
        prompt = unique("How do I report a stolen card?")
        complete(running, prompt)
        complete(running, prompt)
        with pytest.raises(openai.AuthenticationError):
            complete(running, prompt, key="sk-nobody")
    finally:
        stop()
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "gateway.request"]
    outcomes = [(s.attributes or {}).get("preheat.outcome") for s in requests]
    assert outcomes == ["miss", "exact-memory", "error_401"]
    first = dict(requests[0].attributes or {})
    assert first["preheat.route"] == "completions" and first["http.response.status_code"] == 200
    assert first["preheat.tenant"] == tenant_label("acme", "hashed") != "acme"
    children = [s for s in spans if s.parent is not None]
    assert {s.name for s in children} == {"cache.lookup", "model.generate"}
    request_ids = {s.context.span_id for s in requests}
    assert all(s.parent.span_id in request_ids for s in children)  # type: ignore[union-attr]
    lookups = [dict(s.attributes or {}) for s in children if s.name == "cache.lookup"]
    assert [(a["preheat.cache.kind"], a["preheat.cache.tier"]) for a in lookups] == [
        ("exact", "none"), ("exact", "memory"),
    ]  # fmt: skip
    provider.shutdown()


def test_a_failing_metric_never_fails_the_request(
    gw: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    signals = gw.app.state.gateway.signals

    def broken(*args: Any) -> None:
        raise RuntimeError("a metric bug")

    monkeypatch.setattr(signals, "generation", broken)
    monkeypatch.setattr(signals, "embeddings", broken)
    before = signals.metrics.value("preheat_gateway_degraded_total", component="metrics")
    source, answer = complete(gw, unique("Can I pay my bill online?"))
    embedded = gw.client().embeddings.create(model=EMBEDDING_MODEL, input=unique("bill"))

    assert source == "miss" and answer.choices[0].text is not None
    assert len(embedded.data[0].embedding) == 384
    after = signals.metrics.value("preheat_gateway_degraded_total", component="metrics")
    assert after == before + 2


# -- observability --------------------------------------------------------------------------------


def test_metrics_expose_latency_by_outcome_hits_by_tier_and_the_cache_counters(
    gw: Running,
) -> None:
    prompt = unique("What is the overdraft limit on a joint account? " * 3)  # two KV pages
    complete(gw, prompt)
    complete(gw, prompt)
    text = httpx.get(f"{gw.url}/metrics").text

    def value(prefix: str) -> float:
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        assert lines, prefix
        return float(lines[0].split()[-1])

    hit = 'preheat_gateway_request_seconds_count{outcome="exact-memory",route="completions"}'
    assert value(hit) >= 1
    assert value('preheat_gateway_request_seconds_count{outcome="miss",route="completions"}') >= 1
    assert value('preheat_gateway_hits_total{kind="exact",tier="memory"}') >= 1
    assert value('preheat_cache_lookups_total{kind="exact",result="hit",tier="memory"}') >= 1
    assert value('preheat_cache_writes_total{kind="prefix",result="stored",tier="redis"}') >= 1


def test_every_request_is_logged_to_the_live_stream(gw: Running) -> None:
    prompt = unique("When is my next card payment due?")
    complete(gw, prompt)
    complete(gw, prompt, key="sk-beta-1")
    gw.client().embeddings.create(model=EMBEDDING_MODEL, input=prompt)
    assert gw.app.state.gateway.producer.flush(10)

    client = redis.Redis.from_url(str(gw.redis_url))
    records = [orjson.loads(fields[b"r"]) for _, fields in client.xrange(gw.stream)]
    client.close()
    mine = [r for r in records if r.get("prompt") == prompt]
    assert sorted((r["tenant"], r["route"]) for r in mine) == [
        ("acme", "completions"), ("acme", "embeddings"), ("beta", "completions"),
    ]  # fmt: skip
    completion = next(r for r in mine if r["route"] == "completions")
    assert completion["prompt_tokens"] > 0 and completion["output_tokens"] > 0
    assert completion["latency_ms"] >= 0 and completion["request_id"]


def test_healthz_and_the_base64_default_of_the_client(gw: Running) -> None:
    assert httpx.get(f"{gw.url}/healthz").json() == {
        "status": "ok", "model": gw.model, "degraded": {}
    }  # fmt: skip
    body = {"model": EMBEDDING_MODEL, "input": "abc", "encoding_format": "base64"}
    reply = httpx.post(
        f"{gw.url}/v1/embeddings", json=body, headers={"Authorization": "Bearer sk-acme-1"}
    ).json()
    vector = np.frombuffer(base64.b64decode(reply["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-3
