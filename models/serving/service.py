"""`Gateway`: the state behind the routes, and what each route does with a request.

Plain methods over injected parts (runner, cache, embedder, log producer), so the app
(`app.py`) is only HTTP: parse, call, format.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from cache_runtime.generations import GenerationsUnavailable
from cache_runtime.keys import parse_key
from cache_runtime.serving.auth import KeyRing, Principal, bearer
from cache_runtime.serving.limits import TenantSlots
from cache_runtime.serving.schemas import (
    SESSION_ID,
    ChatRequest,
    CompletionRequest,
    EndSessionRequest,
    GatewayError,
    GenerationRequest,
    InvalidateRequest,
    bad_request,
)
from models.serving.chain import Chain, Served
from models.serving.runners import Job, prefix_hashes
from models.serving.validity import decoding_of

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from cache_runtime.request_stream import RequestLogProducer
    from cache_runtime.serving.metrics import GatewayMetrics
    from models.serving.embeddings import EmbeddingService
    from models.serving.signals import Signals
    from models.serving.streaming import AnswerSink

log = logging.getLogger(__name__)
OPT_OUT_VALUES = frozenset({"off", "bypass", "no-store", "false", "0"})


class _CanarySink:
    """A control-group request's stream says `canary`, as its non-streamed answer does."""

    def __init__(self, sink: AnswerSink) -> None:
        self._sink = sink

    def begin(self, outcome: str, key: str | None) -> None:
        self._sink.begin("canary", key)

    def text(self, delta: str) -> bool:
        return self._sink.text(delta)


def opted_out(body_cache: bool, header: str | None) -> bool:
    """`cache: false` in the body or `x-preheat-cache: off` on the request."""
    return not body_cache or (header or "").strip().lower() in OPT_OUT_VALUES


@dataclass
class Gateway:
    keys: KeyRing
    chain: Chain
    cache: HybridCache
    signals: Signals
    served_model: str
    default_max_tokens: int
    embeddings: EmbeddingService | None = None
    producer: RequestLogProducer | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)
    tracer: trace.Tracer = field(default_factory=trace.NoOpTracer)
    slots: TenantSlots = field(default_factory=lambda: TenantSlots(2, 8))  # see `limits.py`

    @property
    def metrics(self) -> GatewayMetrics:
        return self.signals.metrics

    # -- who --------------------------------------------------------------------------------

    def principal(self, authorization: str | None) -> Principal:
        found = self.keys.identify(bearer(authorization))
        if found is None:
            raise GatewayError(401, "Incorrect or missing API key.", "invalid_api_key")
        return found

    def tenant(self, authorization: str | None) -> str:
        found = self.principal(authorization)
        if found.tenant is None:
            raise GatewayError(403, "an admin key cannot make model requests", "permission_denied")
        span = trace.get_current_span()
        if span.is_recording():  # the request's span: the tenant as metrics show it
            span.set_attribute("preheat.tenant", self.signals.label(found.tenant))
        return found.tenant

    def admin(self, authorization: str | None) -> None:
        if not self.principal(authorization).admin:
            raise GatewayError(403, "this endpoint needs an admin key", "permission_denied")

    # -- generation ----------------------------------------------------------------------------

    def job(self, route: str, request: GenerationRequest) -> Job:
        if request.model != self.served_model:
            raise GatewayError(404, f"The model `{request.model}` does not exist.",
                               "model_not_found", "model")  # fmt: skip
        decoding = decoding_of(request, self.default_max_tokens)
        if isinstance(request, ChatRequest):
            return self.chain.runner.job(route, None, request.messages, decoding)
        assert isinstance(request, CompletionRequest)
        return self.chain.runner.job(route, request.prompt_text(), None, decoding)

    def generate(
        self,
        route: str,
        request: GenerationRequest,
        tenant: str,
        header: str | None,
        session: str | None = None,
        sink: AnswerSink | None = None,
        job: Job | None = None,
    ) -> Served:
        """Answer through the chain; a `canary_share` of the requests that would use the cache
        form the control group, answered with the cache off (outcome `canary`). `session`:
        the `x-preheat-session` header (see `end_session`); `sink`: a streamed request's
        (`Chain.serve`); `job`: the request's, when the caller already built (and so checked)
        it."""
        started = time.perf_counter()
        if session is not None and not re.fullmatch(SESSION_ID, session):
            raise bad_request(
                "x-preheat-session must be 1 to 128 printable ASCII characters", "session"
            )
        job = replace(job or self.job(route, request), session=session)
        eligible = not opted_out(request.cache, header)
        canary = eligible and self.signals.canary_draw()
        if canary and sink is not None:
            sink = _CanarySink(sink)
        served = self.chain.serve(tenant, job, eligible and not canary, sink)
        if canary:
            served = replace(served, outcome="canary")
        ids = self._prompt_ids(job, served)
        self.log(tenant, route, job, served, started, ids)
        self.record(self.signals.generation, tenant, route, served, ids, eligible)
        return served

    def record(self, observe: Callable[..., None], *args: Any) -> None:
        """Hand an observation to the metrics, which never fail a request: a failure there is
        logged and counted."""
        try:
            observe(*args)
        except Exception:
            log.exception("recording a metric failed")
            self.metrics.degraded.labels("metrics").inc()

    def _prompt_ids(self, job: Job, served: Served) -> list[int] | None:
        """The prompt's tokens, when the log or the metrics need them (None upstream)."""
        if served.prompt_ids is not None:
            return served.prompt_ids
        if self.producer is None and not self.signals.wants_tokens:
            return None
        try:
            return self.chain.runner.tokens(job.key_text)
        except Exception:
            log.exception("tokenizing the prompt failed")
            return None

    def log(
        self,
        tenant: str,
        route: str,
        job: Job,
        served: Served,
        started: float,
        ids: list[int] | None,
    ) -> None:
        """One record on the live stream; a failure here is counted, never raised."""
        if self.producer is None:
            return
        try:
            self.producer.log_request(
                tenant=tenant, request_id=uuid.uuid4().hex, prompt=job.text,
                prompt_tokens=served.prompt_tokens, output_tokens=served.completion_tokens,
                prefix_hashes=prefix_hashes(ids), template_id=served.template, route=route,
                latency_ms=(time.perf_counter() - started) * 1000,
            )  # fmt: skip
        except Exception:
            log.exception("request log failed")
            self.metrics.degraded.labels("request_log").inc()

    def log_embeddings(
        self, tenant: str, texts: list[str], tokens: list[int], started: float
    ) -> None:
        if self.producer is None:
            return
        try:
            latency = (time.perf_counter() - started) * 1000
            for text, count in zip(texts, tokens, strict=True):
                self.producer.log_request(
                    tenant=tenant, request_id=uuid.uuid4().hex, prompt=text,
                    prompt_tokens=count, output_tokens=0,
                    route="embeddings", latency_ms=latency,
                )  # fmt: skip
        except Exception:
            log.exception("request log failed")
            self.metrics.degraded.labels("request_log").inc()

    def end_session(self, tenant: str, body: EndSessionRequest) -> dict[str, Any]:
        """The caller's conversation ended: the KV pages only it read (as sent with
        `x-preheat-session`) are cooled; pages other conversations read stay warm. Sessions
        are the tenant's own: the same id under another key is another session."""
        cooled = self.cache.end_session(tenant, body.session)
        return {"session": body.session, "cooled": cooled}

    # -- admin ---------------------------------------------------------------------------------

    def invalidate(self, body: InvalidateRequest) -> dict[str, Any]:
        """Invalidate one tenant's answers (see `InvalidateRequest`): when this returns, no
        process serves them, exact or semantic. `held`: whether a tier of this node held the
        exact answer (key and request). 503 when Redis cannot take the invalidation (nothing
        was invalidated: retry)."""
        tenant = body.tenant
        if tenant not in self.keys.tenants:
            raise bad_request(f"unknown tenant {tenant!r}", "tenant")
        what = body.what()
        result: dict[str, Any] = {"tenant": tenant, "invalidated": what}
        try:
            if what == "template_id":
                self.cache.invalidate_template(tenant, str(body.template_id))
            elif what == "all":
                self.cache.invalidate_tenant(tenant)
            else:
                key = self._key_of(tenant, body) if what == "key" else self._request_key(body)
                result |= {"key": key, "held": bool(self.cache.delete(key))}
        except GenerationsUnavailable as error:
            raise GatewayError(503, str(error), "service_unavailable") from None
        return result

    def _key_of(self, tenant: str, body: InvalidateRequest) -> str:
        try:
            key = parse_key(str(body.key))
        except ValueError as error:
            raise bad_request(str(error), "key") from None
        if key.tenant != tenant:
            raise bad_request("the key belongs to another tenant", "key")
        if key.kind not in ("exact", "semantic"):
            raise bad_request("only answers (exact or semantic keys) can be invalidated", "key")
        return key.to_string()

    def _request_key(self, body: InvalidateRequest) -> str:
        """The exact key the request's answer is stored under."""
        request = {"model": self.served_model, **(body.request or {})}
        try:
            parsed: GenerationRequest = (
                ChatRequest.model_validate(request) if "messages" in request
                else CompletionRequest.model_validate(request)
            )  # fmt: skip
        except ValueError as error:
            raise bad_request(f"request: {' '.join(str(error).split())[:300]}") from None
        route = "chat" if isinstance(parsed, ChatRequest) else "completions"
        return self.chain.exact_key(body.tenant, self.job(route, parsed)).to_string()

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:
                log.exception("closing a gateway resource failed")
