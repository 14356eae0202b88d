"""What one client can ask of the gateway: request size, and each tenant's share of the model.

- **Body size** (`BodyLimit`, an ASGI middleware): a body over `max_body_bytes` is refused with
  413 before it is read whole: by its `Content-Length` at once, else as soon as the bytes
  received pass the limit. A 20 MB chat body costs the gateway nothing but the refusal.
- **Model work per tenant** (`TenantSlots`): at most `concurrent` generation requests of one
  tenant run at once, at most `queued` more wait for a slot (in arrival order), and any more
  get 429 with `Retry-After`: one tenant's flood queues behind itself, not in front of another
  tenant's requests. The in-process model then serves the requests with the fewest tokens
  decoded first, and among equals the tenant that has used it least (`models.llm.batch_decoder`):
  a short request does not wait for a long generation to finish.
- Prompt tokens against the context, `max_tokens` and embedding inputs are checked where they
  are known (the runner, `EmbeddingService`), before any model work, with the parameter named.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from cache_runtime.serving.schemas import GatewayError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyLimit:
    """Refuse request bodies over `max_bytes` with OpenAI's error shape and 413."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        error = GatewayError(
            413, f"the request body is over the limit of {self.max_bytes} bytes",
            "request_too_large", None,
        )  # fmt: skip
        body = orjson.dumps({"error": {"message": error.message, "type": "invalid_request_error",
                                       "param": None, "code": error.kind}})  # fmt: skip
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


@dataclass
class _Tenant:
    running: int = 0
    waiting: list[asyncio.Future[None]] = field(default_factory=list)


class TenantSlots:
    """Per-tenant slots for model work (module docstring). Event-loop only: not thread-safe."""

    def __init__(self, concurrent: int, queued: int, retry_after_s: int = 1) -> None:
        if concurrent < 1 or queued < 0:
            raise ValueError("need concurrent >= 1 and queued >= 0")
        self.concurrent, self.queued, self.retry_after_s = concurrent, queued, retry_after_s
        self._tenants: dict[str, _Tenant] = {}

    async def acquire(self, tenant: str) -> None:
        """A slot for `tenant`, at once or in its turn.

        Raises:
            GatewayError: 429 when the tenant's queue is full."""
        state = self._tenants.setdefault(tenant, _Tenant())
        if state.running < self.concurrent and not state.waiting:
            state.running += 1
            return
        if len(state.waiting) >= self.queued:
            raise GatewayError(
                429, f"too many requests of this tenant at once ({self.concurrent} running, "
                f"{self.queued} waiting): retry after {self.retry_after_s} s",
                "rate_limit_exceeded", headers={"Retry-After": str(self.retry_after_s)},
            )  # fmt: skip
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiting.append(turn)
        try:
            await turn  # `release` hands its slot over: `running` stays as it is
        except asyncio.CancelledError:
            if turn in state.waiting:
                state.waiting.remove(turn)
            elif turn.done() and not turn.cancelled():
                self.release(tenant)  # handed a slot as the client left: pass it on
            raise

    def release(self, tenant: str) -> None:
        state = self._tenants[tenant]
        while state.waiting:
            turn = state.waiting.pop(0)
            if not turn.done():
                turn.set_result(None)
                return
        state.running -= 1
        if state.running == 0:
            del self._tenants[tenant]
