"""A small OpenAI-compatible server over an `HFBackend`, with a real prefix cache.

It stands in for vLLM / SGLang in the demo and the tests: `OpenAICompatibleBackend` warms it
exactly as it would warm them. Like vLLM with automatic prefix caching, it keeps the KV of every
prompt's full 16-token pages (in an in-process `HybridCache` memory tier), reuses them for any
later prompt with the same prefix, and reports how many prompt tokens it reused in
`usage.prompt_tokens_details.cached_tokens`; `GET /stats` sums them up.

Endpoints: `POST /v1/completions` (prompt: a string or a list of strings), `POST
/v1/chat/completions` (both with `stream`: `server_stream`), `GET /v1/models`, `GET /healthz`,
`GET /stats`.
Errors have OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

One tenant for the whole server (as a vLLM instance without `cache_salt`): warm-ups and
requests of every user share its prefix cache, which is the point of warming it.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from cache_runtime.hybrid import HybridCache
from cache_runtime.tiers import MemoryTier
from models.llm.backends import Completion, DecodeListener, HFBackend
from models.llm.server_stream import chunk_maker, stream_answer

SERVER_TENANT = "server"


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI fields this server does not use

    model: str
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)  # OpenAI's default
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


@dataclass
class ServerStats:
    """Totals since start; `cached_tokens` is what the prefix cache saved."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    pages_stored: int = 0


def _usage(completions: list[Completion]) -> dict[str, Any]:
    prompt = sum(c.prompt_tokens for c in completions)
    completion = sum(c.completion_tokens for c in completions)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(c.cached_tokens for c in completions)},
    }


def chat_prompt(tokenizer: Any, messages: list[ChatMessage]) -> str:
    """The tokenizer's chat template when it has one, else `role: content` lines and an open
    `assistant:` turn (the tiny model's MiniLM tokenizer has no template)."""
    turns = [{"role": m.role, "content": m.content} for m in messages]
    if getattr(tokenizer, "chat_template", None):
        return str(tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True))
    return "".join(f"{t['role']}: {t['content']}\n" for t in turns) + "assistant:"


class _Engine:
    """The app's state: the backend, its prefix cache and the counters."""

    def __init__(self, backend: HFBackend, served_name: str, cache: HybridCache) -> None:
        self.backend, self.served_name, self.cache = backend, served_name, cache
        self.created = int(time.time())
        self.stats = ServerStats()
        self._stats_lock = threading.Lock()

    def check(self, model: str) -> None:
        if model != self.served_name:
            raise APIError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")

    def complete(
        self,
        prompt: str,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        listener: DecodeListener | None = None,
    ) -> Completion:
        try:
            done = self.backend.complete(
                prompt, max_tokens, temperature, self.cache, SERVER_TENANT, seed, None, listener
            )
        except ValueError as error:
            raise APIError(400, str(error), "BadRequestError", "prompt") from error
        with self._stats_lock:
            s = self.stats
            s.requests += 1
            s.prompt_tokens += done.prompt_tokens
            s.cached_tokens += done.cached_tokens
            s.completion_tokens += done.completion_tokens
            s.pages_stored += done.pages_stored
        return done


def _error_response(error: APIError) -> JSONResponse:
    body = {
        "message": error.message, "type": error.kind, "param": error.param, "code": error.status,
    }  # fmt: skip
    return JSONResponse({"error": body}, status_code=error.status)


def _streamed(
    engine: _Engine, route: str, prompt: str, max_tokens: int,
    request: CompletionRequest | ChatRequest,
) -> StreamingResponse:  # fmt: skip
    def run(listener: DecodeListener) -> Completion:
        return engine.complete(prompt, max_tokens, request.temperature, request.seed, listener)

    include_usage = bool((request.stream_options or {}).get("include_usage"))
    chunk = chunk_maker(route, engine.served_name)
    return stream_answer(run, chunk, include_usage, lambda done: _usage([done]))


def _completions(engine: _Engine, request: CompletionRequest) -> dict[str, Any] | StreamingResponse:
    engine.check(request.model)
    prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
    if not prompts:
        raise APIError(400, "prompt must not be an empty list", "BadRequestError", "prompt")
    if request.stream:
        if len(prompts) > 1:
            raise APIError(400, "stream takes one prompt", "BadRequestError", "prompt")
        return _streamed(engine, "completions", prompts[0], request.max_tokens, request)
    done = [
        engine.complete(p, request.max_tokens, request.temperature, request.seed) for p in prompts
    ]
    choices = [
        {"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
        for i, c in enumerate(done)
    ]
    return {
        "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
        "created": int(time.time()), "model": engine.served_name, "choices": choices,
        "usage": _usage(done),
    }  # fmt: skip


def _chat(engine: _Engine, request: ChatRequest) -> dict[str, Any] | StreamingResponse:
    engine.check(request.model)
    max_tokens = request.max_completion_tokens or request.max_tokens or 16
    prompt = chat_prompt(engine.backend.tokenizer, request.messages)
    if request.stream:
        return _streamed(engine, "chat", prompt, max_tokens, request)
    done = engine.complete(prompt, max_tokens, request.temperature, request.seed)
    message = {"role": "assistant", "content": done.text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": done.finish_reason}
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": engine.served_name, "choices": [choice],
        "usage": _usage([done]),
    }  # fmt: skip


def create_app(
    backend: HFBackend,
    served_name: str | None = None,
    cache: HybridCache | None = None,
    cache_bytes: int = 256 << 20,
) -> FastAPI:
    """The app over `backend`, served as `served_name` (default: the backend's model id).

    `cache`: the prefix cache (default: a memory tier of `cache_bytes`, closed with the app).
    The caller keeps ownership of `backend` and of a cache it passes in.
    """
    owned = cache is None
    engine = _Engine(backend, served_name or backend.model_id, cache or _memory_cache(cache_bytes))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        yield
        if owned:
            engine.cache.close()

    app = FastAPI(title="preheat OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> JSONResponse:
        return _error_response(error)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return _error_response(APIError(400, message, "BadRequestError", where or None))

    _add_routes(app, engine)
    return app


def _add_routes(app: FastAPI, engine: _Engine) -> None:
    # Plain `def` handlers run in FastAPI's thread pool; the backend's lock serialises the model.
    @app.post("/v1/completions")
    def completions(request: CompletionRequest) -> Any:
        return _completions(engine, request)

    @app.post("/v1/chat/completions")
    def chat(request: ChatRequest) -> Any:
        return _chat(engine, request)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        card = {
            "id": engine.served_name, "object": "model", "created": engine.created,
            "owned_by": "preheat", "root": engine.backend.source or engine.backend.model_id,
        }  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        with engine._stats_lock:
            return {**vars(engine.stats), "device": engine.backend.device}


def _memory_cache(capacity_bytes: int) -> HybridCache:
    return HybridCache([MemoryTier(capacity_bytes)])


def serve_in_thread(
    app: FastAPI, host: str = "127.0.0.1", port: int = 0, ready_timeout_s: float = 30.0
) -> tuple[str, Callable[[], None]]:
    """Start uvicorn on `host:port` (0: a free port) in a daemon thread; return once
    `/healthz` answers, with (base URL, stop function). The stop function asks uvicorn to
    shut down (running the app's lifespan exit) and joins the thread.

    The socket is bound here, before the thread starts, so the port is known without parsing
    logs and cannot be taken by someone else between choosing and binding it.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    base_url = f"http://{host}:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="preheat-openai-server", daemon=True
    )
    thread.start()

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()

    try:
        _wait_ready(base_url, thread, ready_timeout_s)
    except BaseException:
        stop()
        raise
    return base_url, stop


def _wait_ready(base_url: str, thread: threading.Thread, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:
        for _ in _polls(deadline):
            if not thread.is_alive():
                raise RuntimeError(f"the server thread for {base_url} exited while starting")
            try:
                if client.get(f"{base_url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
    raise TimeoutError(f"{base_url}/healthz did not answer within {timeout_s} s")


def _polls(deadline: float, interval_s: float = 0.02) -> Iterator[None]:
    while time.monotonic() < deadline:
        yield
        time.sleep(interval_s)


def main(argv: list[str] | None = None) -> None:
    """`python -m models.llm.openai_server MODEL_DIR [--host H] [--port P] [--name N]`."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model_dir", help="a save_pretrained directory with its tokenizer")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--name", default=None, help="served model name (default: model id)")
    args = parser.parse_args(argv)
    backend = HFBackend.from_path(args.model_dir)
    try:
        uvicorn.run(create_app(backend, args.name), host=args.host, port=args.port)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
