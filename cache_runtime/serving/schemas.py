"""The OpenAI request bodies the gateway accepts (pydantic), and its one error type.

Unknown fields are kept (`extra="allow"`), not dropped: a field the gateway does not know may
change the answer (`logit_bias`, `response_format`), so it is forwarded to an upstream server
and made part of the response-cache key there, and refused by the in-process model, which
cannot honour it (see `models/serving/validity.py`). Silently ignoring it would cache — and
serve — an answer to a different request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator


class GatewayError(Exception):
    """A request the gateway answers with an OpenAI-shaped error body and this HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", param)


class Message(BaseModel):
    """A chat message; `content` as a string or as text parts (other part types are refused).
    Roles as OpenAI's; only an assistant turn may come without content (its tool calls)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (a string or text parts)")
        return self

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request("only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """What completions and chat share: the model, decoding, delivery and the cache opt-out."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default: sampling
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: StrictBool = False  # "yes" is no boolean: refused, as OpenAI does
    stream_options: StreamOptions | None = None
    user: str | None = None  # metadata only: never the tenant
    cache: StrictBool = True  # `extra_body={"cache": False}` opts this request out of caching

    def extras(self) -> dict[str, Any]:
        """Fields this model does not declare, with a value (None counts as absent)."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}


class CompletionRequest(GenerationRequest):
    prompt: str | list[str]

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise bad_request("send one prompt per request", "prompt")
        return self.prompt[0]


class ChatRequest(GenerationRequest):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    # text, texts, one token array or several (of the encoder's own tokenizer, as OpenAI's)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    cache: StrictBool = True

    def texts(self, decode: Callable[[list[int]], str] | None = None) -> list[str]:
        """The inputs as texts; token arrays decoded with `decode` (the encoder's tokenizer)."""
        raw = self.input
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            raw = [raw]  # one token array
        items = [raw] if isinstance(raw, str) else list(raw)
        if not items or any(not t for t in items):
            raise bad_request("input must be a non-empty string or list of them", "input")
        if any(not isinstance(t, str) for t in items):
            if decode is None:
                raise bad_request("token arrays are not accepted here", "input")
            items = [t if isinstance(t, str) else decode(t) for t in items]  # type: ignore[arg-type]
        return [str(t) for t in items]


class InvalidateRequest(BaseModel):
    """Invalidate one tenant's cached answers: one answer by its key string (`x-preheat-key`),
    a request's answer (`request`: its body, as the client sent it), every answer of a
    template, or (`all: true`) every answer of the tenant. Each way reaches the answer by every
    path: exact, and the semantic entries of paraphrases that point at it."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1)
    key: str | None = None
    request: dict[str, Any] | None = None
    template_id: str | None = Field(None, min_length=1)
    all: bool | None = None

    def what(self) -> str:
        names = ("key", "request", "template_id", "all")
        given = [n for n in names if getattr(self, n) not in (None, False)]
        if len(given) != 1:
            raise bad_request("give exactly one of key, request, template_id, all")
        return given[0]


# A session id: 1-128 printable ASCII characters. ASCII because a header arrives as latin-1
# and a JSON body as unicode: "café" in one would never match "café" in the other.
SESSION_ID = r"[\x21-\x7e]{1,128}"


class EndSessionRequest(BaseModel):
    """The application's "conversation ended" for one of the caller's sessions: the KV pages
    only that conversation read become the first to go (`HybridCache.end_session`)."""

    model_config = ConfigDict(extra="forbid")

    session: str = Field(pattern=f"^{SESSION_ID}$")
