"""Tracing is off unless configured (no provider, no exporter, no spans); configured, warm-up
batches are spans with what they did."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from cache_runtime import telemetry
from cache_runtime.telemetry import TracingSettings, build_provider
from models.warmup.execute import WarmItem
from models.warmup.run import BackendSpec, NodeResources, open_job, release_resources, run_batch


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("EXPORTER", "ENDPOINT", "SERVICE_NAME"):
        monkeypatch.delenv(f"PREHEAT_TRACING_{name}", raising=False)
    telemetry.shutdown()
    yield
    telemetry.shutdown()


def test_off_by_default_means_no_provider_no_exporter_and_no_spans() -> None:
    assert TracingSettings().exporter == "off"
    assert build_provider(TracingSettings()) is None
    assert telemetry.installed() is None
    tracer = telemetry.tracer("preheat.test")
    assert isinstance(tracer, trace.NoOpTracer)
    with tracer.start_as_current_span("anything") as span:
        assert not span.is_recording()
    # nothing was installed behind OTel's global API either
    assert not isinstance(trace.get_tracer_provider(), TracerProvider)


def test_the_environment_turns_the_console_exporter_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PREHEAT_TRACING_EXPORTER", "console")
    monkeypatch.setenv("PREHEAT_TRACING_SERVICE_NAME", "gw-test")
    with telemetry.tracer("preheat.test").start_as_current_span("hello") as span:
        span.set_attribute("preheat.answer", 42)
    provider = telemetry.installed()
    assert provider is not None and provider.force_flush()
    err = capsys.readouterr()
    assert '"name": "hello"' in err.err and '"preheat.answer": 42' in err.err
    assert "gw-test" in err.err and err.out == ""  # stdout stays the CLI's JSON


def test_otlp_needs_an_endpoint_and_builds_without_sending() -> None:
    with pytest.raises(ValidationError, match="needs an endpoint"):
        TracingSettings(exporter="otlp")
    provider = build_provider(
        TracingSettings(exporter="otlp", endpoint="http://127.0.0.1:9/v1/traces")
    )
    assert isinstance(provider, TracerProvider)
    provider.shutdown()  # no span was made: nothing is sent


def test_a_warm_up_batch_is_a_span_with_its_plan_and_counts(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    telemetry.install(build_provider(TracingSettings(), exporter))
    resources = NodeResources(BackendSpec("null"), str(tmp_path), memory_bytes=1 << 20,
                              ssd_bytes=0)  # fmt: skip
    items = [
        WarmItem(0, "acme", "response:a", "response", None, "memory", "Hello there"),
        WarmItem(1, "acme", "response:b", "response", None, "memory", None),  # unresolved
    ]
    try:
        opened = open_job(items, resources)
        stats = run_batch(opened.items, opened.job, index=3)
    finally:
        release_resources(resources)

    (span,) = exporter.get_finished_spans()
    attributes = dict(span.attributes or {})
    assert span.name == "warmup.batch"
    assert attributes["preheat.warmup.plan_id"] == opened.job.plan_id
    assert attributes["preheat.warmup.batch"] == 3 and attributes["preheat.warmup.items"] == 2
    assert attributes["preheat.warmup.done"] == stats.done == 1
    assert attributes["preheat.warmup.unresolved"] == 1
