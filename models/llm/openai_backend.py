"""`OpenAICompatibleBackend`: warm a remote vLLM / SGLang server's own prefix cache.

The prefix is sent with `max_tokens=1`: the KV stays on the server's GPU, where the request that
follows will look for it. Nothing is stored locally unless a response is asked for. Every
failure is one `BackendError` line, fit for a log and a retry counter.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import httpx

from cache_runtime.keys import ExactKey
from models.llm.backend_contract import (
    DEFAULT_RESPONSE_TOKENS,
    BackendError,
    WarmResult,
    answer_generations,
)

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache


def _one_line(text: str, limit: int = 300) -> str:
    return re.sub(r"\s+", " ", text).strip()[:limit]


def _error_message(response: httpx.Response) -> str:
    """The OpenAI-shaped `error.message` when there is one, else the body's start."""
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
    except ValueError:
        pass
    return response.text or response.reason_phrase


class OpenAICompatibleBackend:
    """Warms a remote OpenAI-compatible server (vLLM, SGLang) by sending it the prefix.

    With automatic prefix caching on, the server keeps the prompt's KV blocks after the request,
    so the real request that follows skips their prefill. `max_tokens=1` and `temperature=0`
    make the warm-up as cheap as a prefill can be. One persistent HTTP client (keep-alive).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        response_tokens: int = DEFAULT_RESPONSE_TOKENS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`base_url`: the server root, e.g. `http://gpu-0:8000` (a trailing `/v1` is fine)."""
        root = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url, self.model, self.response_tokens = root, model, response_tokens
        self._client = httpx.Client(
            base_url=root, headers=headers, timeout=timeout_s, transport=transport
        )

    def warm_prefix(
        self,
        tenant: str,
        prompt: str,
        cache: HybridCache | None,
        store_response: bool = False,
        template: str | None = None,
    ) -> WarmResult:
        """One completion request; with `store_response` (and a cache), its text is stored
        under the prompt's `ExactKey` for the served model name, with the generations read
        before the request was sent.

        Raises:
            BackendError: HTTP error status, timeout, connection failure or a malformed reply.
        """
        started = time.perf_counter()
        key = ExactKey.of(tenant, self.model, prompt)
        stamp = answer_generations(cache, key, template) if store_response else None
        max_tokens = self.response_tokens if store_response else 1
        body = {
            "model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "user": tenant,
        }  # fmt: skip
        payload = self._post("/v1/completions", body)
        try:
            text = str(payload["choices"][0]["text"])
            usage = payload.get("usage") or {}
            tokens = int(usage.get("prompt_tokens", 0))
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            reason = f"malformed completion reply ({error!r})"
            raise BackendError(f"{self.base_url}: {reason}") from error
        response = text if store_response else None
        if response is not None and cache is not None and stamp is not None:
            cache.put(key, response.encode(), template=template, generations=stamp)
        seconds = time.perf_counter() - started
        return WarmResult(self.name, tokens, 0, cached, seconds, response, self.base_url)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}{path}"
        try:
            response = self._client.post(path, json=body)
        except httpx.TimeoutException as error:
            raise BackendError(f"POST {url}: timed out ({type(error).__name__})") from error
        except httpx.HTTPError as error:
            reason = _one_line(str(error)) or type(error).__name__
            raise BackendError(f"POST {url}: {reason}") from error
        if response.status_code >= 400:
            reason = _one_line(_error_message(response))
            raise BackendError(f"POST {url}: HTTP {response.status_code}: {reason}")
        try:
            payload = response.json()
        except ValueError as error:
            raise BackendError(f"POST {url}: reply is not JSON") from error
        if not isinstance(payload, dict):
            raise BackendError(f"POST {url}: reply is not a JSON object")
        return payload

    def close(self) -> None:
        self._client.close()
