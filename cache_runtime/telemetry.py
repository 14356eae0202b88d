"""OpenTelemetry traces for the gateway and warm-up: off unless configured, then to the console
(stderr) or an OTLP/HTTP collector.

Off (the default) installs nothing: no `TracerProvider` exists, `tracer()` hands out OTel's
`NoOpTracer`, so spans cost a few microseconds and nothing is exported or sent anywhere.
Configured from `TracingSettings` (`PREHEAT_TRACING_EXPORTER=console|otlp`,
`PREHEAT_TRACING_ENDPOINT=http://collector:4318/v1/traces`), read on the first `tracer()` call of
a process — a Prefect worker's warm-up batches, the gateway — or set with `install()` (the CLI,
tests with an in-memory exporter).

Rejected: `opentelemetry.trace.set_tracer_provider`. The global provider can be set once per
process and never replaced, so two gateways in one process (tests, a benchmark) could not have
their own, and a test could not turn tracing off again. The provider lives here instead; code
that wants the global one can still pass it to `install()`.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Literal

from opentelemetry import trace
from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

Exporter = Literal["off", "console", "otlp"]


class TracingSettings(BaseSettings):
    """Where spans go.

    Attributes:
        exporter: `off` (no provider, no exporter, no network), `console` (one JSON object per
            span on stderr: stdout is the CLI's JSON) or `otlp` (OTLP over HTTP/protobuf).
        endpoint: the collector's traces URL for `otlp` (e.g. `http://127.0.0.1:4318/v1/traces`);
            required, so an unset variable never sends spans to a default address.
        service_name: the `service.name` resource attribute.
    """

    model_config = SettingsConfigDict(env_prefix="PREHEAT_TRACING_", extra="forbid")

    exporter: Exporter = "off"
    endpoint: str | None = None
    service_name: str = "preheat"

    @model_validator(mode="after")
    def _endpoint_for_otlp(self) -> TracingSettings:
        if self.exporter == "otlp" and not self.endpoint:
            raise ValueError("the otlp exporter needs an endpoint (PREHEAT_TRACING_ENDPOINT)")
        return self


def build_provider(
    settings: TracingSettings, exporter: SpanExporter | None = None
) -> TracerProvider | None:
    """A provider exporting as `settings` say (or to `exporter`, e.g. an in-memory one in
    tests); None when tracing is off and no exporter is given."""
    given = exporter is not None
    if exporter is None:
        if settings.exporter == "off":
            return None
        exporter = _exporter(settings)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    # Batching keeps the exporter's I/O off the request path; an in-memory exporter (given by
    # the caller) is read right after the request, so it gets its spans synchronously.
    provider.add_span_processor(
        SimpleSpanProcessor(exporter) if given else BatchSpanProcessor(exporter)
    )
    return provider


def _exporter(settings: TracingSettings) -> SpanExporter:
    if settings.exporter == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(service_name=settings.service_name, out=sys.stderr)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=settings.endpoint)


_lock = threading.Lock()
_state: dict[str, TracerProvider | None] = {}  # "provider" once configured (None: off)


def install(provider: TracerProvider | None) -> None:
    """Use `provider` for this process's `tracer()` calls from now on (None: off); the one it
    replaces is flushed and shut down."""
    with _lock:
        previous = _state.get("provider")
        _state["provider"] = provider
    if previous is not None and previous is not provider:
        previous.shutdown()


def installed() -> TracerProvider | None:
    """The process's provider, configured from the environment on first use."""
    with _lock:
        if "provider" not in _state:
            _state["provider"] = build_provider(TracingSettings())
        return _state["provider"]


def tracer(name: str) -> trace.Tracer:
    """A tracer of the process's provider; OTel's no-op tracer when tracing is off."""
    provider = installed()
    return provider.get_tracer(name) if provider is not None else trace.NoOpTracer()


def shutdown() -> None:
    """Flush and drop the process's provider (the CLI calls it on exit)."""
    install(None)
    with _lock:
        _state.pop("provider", None)
