"""`create_app(config)`: the gateway's HTTP surface (FastAPI).

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (both streaming or not),
`POST /v1/embeddings`, `GET /v1/models`, `POST /v1/sessions/end`, `GET /healthz`,
`GET /metrics`, `POST /admin/invalidate`. Errors have OpenAI's shape, so the official client
raises its usual exceptions (401 `AuthenticationError`, 403 `PermissionDeniedError`, 404
`NotFoundError`, ...). A request's `x-preheat-session` header names the client's conversation;
`POST /v1/sessions/end` ends it (the KV pages only it read go first).

Handlers check the API key before reading the body (an unknown key gets 401 whatever it sent),
then run the blocking work — cache tiers, the model — in the thread pool, so a slow Redis or a
long generation never stalls the event loop. Every answer says where it came from in
`x-preheat-cache` (`exact-memory`, `semantic-ssd`, `prefix`, `miss`, `bypass`; for embeddings
one value per input, comma-separated; `canary` for the control group served with the cache
off) and, when cacheable, its exact key in `x-preheat-key` (what `POST /admin/invalidate`
takes). Each request is a `gateway.request` span (route, outcome, status, hashed tenant) over
the chain's `cache.lookup` and `model.generate` spans.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from cache_runtime.node_cache import EMBEDDING_MODEL_ID
from cache_runtime.serving.limits import BodyLimit
from cache_runtime.serving.metrics import exposition
from cache_runtime.serving.schemas import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    EndSessionRequest,
    GatewayError,
    GenerationRequest,
    InvalidateRequest,
    bad_request,
)
from flows.gateway import openai_format as fmt
from models.serving.assembly import build_gateway
from models.serving.embeddings import encoded
from models.serving.service import opted_out
from models.serving.streaming import StreamSink
from models.templates.embeddings import DIMENSIONS

if TYPE_CHECKING:
    from cache_runtime.serving.config import GatewayConfig
    from models.serving.chain import Served
    from models.serving.service import Gateway

log = logging.getLogger(__name__)

_Body = TypeVar("_Body", bound=BaseModel)
CACHE_HEADER = "x-preheat-cache"
KEY_HEADER = "x-preheat-key"
SESSION_HEADER = "x-preheat-session"


def create_app(config: GatewayConfig, **inject: Any) -> FastAPI:
    """The gateway app. `inject`: parts to use instead of building them from `config`
    (`runner`, `cache`, `minilm`, `producer`, `keys`, `tracer_provider`, `forecast_loader`,
    `rng`; see `models.serving.assembly.build_gateway`) — they stay the caller's to close; the
    rest is closed when the app shuts down."""
    gateway = build_gateway(config, **inject)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        gateway.close()

    app = FastAPI(title="preheat gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, error: GatewayError) -> Response:
        return _json(fmt.error_body(error), error.status, error.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        """404, 405 and the rest of what the router answers itself, in OpenAI's shape."""
        kind = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "error")
        message = {404: f"no route {request.url.path}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(
            error.status_code, str(error.detail))  # fmt: skip
        found = GatewayError(error.status_code, message, kind, None, dict(error.headers or {}))
        return _json(fmt.error_body(found), found.status, found.headers)

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)

    _generation_routes(app, gateway)
    _embedding_routes(app, gateway)
    _model_routes(app, gateway)
    _session_and_admin_routes(app, gateway)
    return app


def _json(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def _parse(model: type[_Body], raw: bytes) -> _Body:
    """The body as `model`, or a 400 naming the request's own parameter (`messages`, not
    pydantic's `messages.0.content.str`) and where in it the problem is."""
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as error:
        first = error.errors()[0] if error.errors() else {}
        if first.get("type") == "json_invalid":
            raise bad_request(f"the body is not valid JSON: {first.get('msg', '')}") from None
        path = [str(p) for p in first.get("loc", ()) if not _union_branch(p)]
        param = path[0] if path else None
        where = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in path).lstrip(".")
        message = first.get("msg", "invalid value")
        raise bad_request(f"{where}: {message}" if where else message, param) from None


def _union_branch(part: object) -> bool:
    """A `loc` element pydantic adds for the branch of a union it tried (`str`, `list[...]`)."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part)


def _timed(
    gateway: Gateway, route: str, handle: Callable[[], Awaitable[tuple[Response, str]]]
) -> Callable[[], Awaitable[Response]]:
    """`handle` in the request's span, its latency and outcome recorded whatever happens. A
    4xx is the client's error: recorded on the span, not as the span's failure."""

    async def run() -> Response:
        started = time.perf_counter()
        outcome, status = "error", 500
        span_options: dict[str, Any] = {"kind": SpanKind.SERVER, "record_exception": False,
                                        "set_status_on_exception": False}  # fmt: skip
        with gateway.tracer.start_as_current_span("gateway.request", **span_options) as span:
            try:
                response, outcome = await handle()
                status = response.status_code
                return response
            except GatewayError as error:
                outcome, status = f"error_{error.status}", error.status
                raise
            finally:
                gateway.record(gateway.signals.finished, route, outcome,
                               time.perf_counter() - started)  # fmt: skip
                if span.is_recording():
                    span.set_attribute("preheat.route", route)
                    span.set_attribute("preheat.outcome", outcome)
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR, outcome))

    return run


def _generation_routes(app: FastAPI, gateway: Gateway) -> None:
    async def generation(request: Request, route: str, model: type[GenerationRequest]) -> Response:
        async def handle() -> tuple[Response, str]:
            tenant = gateway.tenant(request.headers.get("authorization"))
            body = _parse(model, await request.body())
            # checked before it takes a slot: a request that cannot run is refused at once
            job = await run_in_threadpool(gateway.job, route, body)
            args = (route, body, tenant, request.headers.get(CACHE_HEADER),
                    request.headers.get(SESSION_HEADER))  # fmt: skip
            await gateway.slots.acquire(tenant)  # 429 when the tenant's queue is full
            held = True
            try:
                if body.stream:
                    sink = StreamSink(asyncio.get_running_loop())
                    work = asyncio.ensure_future(
                        run_in_threadpool(gateway.generate, *args, sink, job)
                    )
                    if await sink.began(work):  # the model is decoding: stream it as it goes
                        held = False  # the stream releases the slot when it ends
                        release = lambda: gateway.slots.release(tenant)  # noqa: E731
                        stream = _live_stream(gateway, route, body, sink, work, release)
                        return stream, str(sink.outcome)
                    served = await work  # answered whole (a cache hit), or failed before decoding
                else:
                    served = await run_in_threadpool(gateway.generate, *args, None, job)
            finally:
                if held:
                    gateway.slots.release(tenant)
            headers = {CACHE_HEADER: served.outcome}
            if served.key is not None:
                headers[KEY_HEADER] = served.key
            if body.stream:
                usage = body.stream_options is not None and body.stream_options.include_usage
                events = fmt.stream_events(served, gateway.served_model, route, usage)
                stream = StreamingResponse(events, media_type="text/event-stream", headers=headers)
                return stream, served.outcome
            shape = fmt.chat_body if route == "chat" else fmt.completion_body
            return _json(shape(served, gateway.served_model), headers=headers), served.outcome

        return await _timed(gateway, route, handle)()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generation(request, "chat", ChatRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generation(request, "completions", CompletionRequest)


def _live_stream(
    gateway: Gateway,
    route: str,
    body: GenerationRequest,
    sink: StreamSink,
    work: asyncio.Future[Served],
    release: Callable[[], None],
) -> StreamingResponse:
    """The SSE response of an answer the model is decoding now (`streaming.py`)."""
    usage = body.stream_options is not None and body.stream_options.include_usage
    headers = {CACHE_HEADER: str(sink.outcome)}
    if sink.key is not None:
        headers[KEY_HEADER] = sink.key

    async def events() -> AsyncIterator[bytes]:
        stream = fmt.LiveStream(gateway.served_model, route)
        try:
            for event in stream.opening():
                yield event
            async for piece in sink.pieces(work):
                yield stream.piece(piece)
            try:
                ending = stream.closing(await work, usage)
            except GatewayError as error:
                ending = stream.error(error)
            except Exception:
                log.exception("a streamed generation failed")
                ending = stream.error(GatewayError(500, "the model failed", "server_error"))
            for event in ending:
                yield event
        finally:
            sink.cancel()  # the client went away, or all was sent: the model stops either way
            release()

    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _embedding_routes(app: FastAPI, gateway: Gateway) -> None:
    """`POST /v1/embeddings`: MiniLM vectors, one cache outcome per input in the header."""

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        async def handle() -> tuple[Response, str]:
            tenant = gateway.tenant(request.headers.get("authorization"))
            body = _parse(EmbeddingRequest, await request.body())
            if body.model != EMBEDDING_MODEL_ID:
                raise GatewayError(404, f"The model `{body.model}` does not exist.",
                                   "model_not_found", "model")  # fmt: skip
            if body.dimensions is not None and body.dimensions != DIMENSIONS:
                raise bad_request(  # MiniLM is not trained to be cut: no shorter vectors
                    f"dimensions: {EMBEDDING_MODEL_ID} gives {DIMENSIONS} dimensions only",
                    "dimensions",
                )  # fmt: skip
            assert gateway.embeddings is not None
            texts = body.texts(gateway.embeddings.decode)
            use_cache = not opted_out(body.cache, request.headers.get(CACHE_HEADER))
            started = time.perf_counter()
            done = await run_in_threadpool(gateway.embeddings.embed, tenant, texts, use_cache)
            gateway.record(gateway.signals.embeddings, tenant, texts, done.outcomes, done.encode_s)
            gateway.log_embeddings(tenant, texts, done.tokens, started)
            vectors = [encoded(v, body.encoding_format) for v in done.vectors]
            outcome = ",".join(done.outcomes)
            body_out = fmt.embeddings_body(vectors, EMBEDDING_MODEL_ID, sum(done.tokens))
            return _json(body_out, headers={CACHE_HEADER: outcome}), _summary(done.outcomes)

        return await _timed(gateway, "embeddings", handle)()


def _model_routes(app: FastAPI, gateway: Gateway) -> None:
    """`GET /v1/models` and `GET /v1/models/{id}`: the served model and the embedding model."""

    def cards() -> list[dict[str, Any]]:
        return [
            {"id": name, "object": "model", "created": 0, "owned_by": "preheat"}
            for name in (gateway.served_model, EMBEDDING_MODEL_ID)
        ]

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        gateway.tenant(request.headers.get("authorization"))
        return _json({"object": "list", "data": cards()})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        gateway.tenant(request.headers.get("authorization"))
        for card in cards():
            if card["id"] == model_id:
                return _json(card)
        raise GatewayError(404, f"The model `{model_id}` does not exist.", "model_not_found",
                           "model")  # fmt: skip


def _session_and_admin_routes(app: FastAPI, gateway: Gateway) -> None:
    """Ending a session, invalidating a key, and the node's health and metrics."""

    @app.post("/v1/sessions/end")
    async def end_session(request: Request) -> Response:
        tenant = gateway.tenant(request.headers.get("authorization"))
        body = _parse(EndSessionRequest, await request.body())
        return _json(await run_in_threadpool(gateway.end_session, tenant, body))

    @app.post("/admin/invalidate")
    async def invalidate(request: Request) -> Response:
        gateway.admin(request.headers.get("authorization"))
        body = _parse(InvalidateRequest, await request.body())
        return _json(await run_in_threadpool(gateway.invalidate, body))

    @app.get("/healthz")
    async def healthz() -> Response:
        """`ok`, or `degraded` with each degraded component and why (still serving: answers
        miss while Redis is down, KV pages and embeddings keep hitting)."""
        problems = await run_in_threadpool(gateway.cache.health)
        status = "degraded" if problems else "ok"
        return _json({"status": status, "model": gateway.served_model, "degraded": problems})

    @app.get("/metrics")
    def metrics() -> Response:
        gateway.cache.refresh_gauges()
        registries = (gateway.cache.metrics.registry, gateway.metrics.registry)
        return Response(exposition(registries), media_type=CONTENT_TYPE_LATEST)


def _summary(outcomes: list[str]) -> str:
    """One latency label for a batch of embeddings: its single outcome, else `mixed`."""
    distinct = set(outcomes)
    return distinct.pop() if len(distinct) == 1 else "mixed"
