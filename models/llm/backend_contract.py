"""What a warm-up backend is to its callers: the protocol, what one warm-up did, and errors.

The warm-up executor, the OpenAI-compatible server and the gateway name these types without
caring which backend runs (`hf_backend.HFBackend` in this process, or
`openai_backend.OpenAICompatibleBackend` for a remote server); both backends share the one rule
for storing a generated answer (`answer_generations`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from cache_runtime.keys import ExactKey

DEFAULT_RESPONSE_TOKENS = 16


class BackendError(RuntimeError):
    """A warm-up call that failed for a reason worth retrying (HTTP error, timeout, refused
    connection); its message is one line, fit for a log and a retry counter."""


@dataclass(frozen=True)
class WarmResult:
    """What one warm-up did.

    Attributes:
        backend: the backend's name ("hf", "openai").
        tokens: prompt tokens, as the model tokenised them.
        pages_stored: KV pages newly written to the local cache (0 for a remote server).
        cached_tokens: prompt tokens whose KV was already cached before this call (read from
            the local cache, or reported by the server) — a warm of a warm prompt shows it.
        seconds: wall time of the call.
        response: the generated text when a response was asked for, else None.
        device: where the model ran ("cpu", "cuda"), or the server's URL.
    """

    backend: str
    tokens: int
    pages_stored: int
    cached_tokens: int
    seconds: float
    response: str | None
    device: str


@runtime_checkable
class WarmupBackend(Protocol):
    """What the warm-up executor calls; one instance per model, shared between its workers."""

    name: str

    def warm_prefix(
        self,
        tenant: str,
        prompt: str,
        cache: HybridCache | None,
        store_response: bool = False,
        template: str | None = None,
    ) -> WarmResult:
        """Prefill `prompt` into `cache`; with `store_response`, its greedy response too, as an
        answer of `template` (its generation scope: the template the gateway assigns it)."""
        ...

    def close(self) -> None: ...


class DecodeListener(Protocol):
    """What a streaming caller hears of one completion (`HFBackend.complete`)."""

    def started(self, cached_tokens: int) -> None:
        """Prefill is done (`cached_tokens` of the prompt came from the cache)."""
        ...

    def text(self, delta: str) -> bool:
        """The text the latest token added; False stops the generation."""
        ...


@dataclass
class Completion:
    """A served completion (the OpenAI server's unit of work)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    pages_stored: int
    finish_reason: str  # "stop" (end of sequence) or "length"


def answer_generations(
    cache: HybridCache | None, key: ExactKey, template: str | None
) -> bytes | None:
    """The answer's generations before it is computed (None: no cache, or Redis is down and
    the response cannot be stored): an invalidation meanwhile then supersedes it."""
    return cache.lookup(key, template=template).generations if cache is not None else None
