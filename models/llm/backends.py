"""Warm-up backends: one call that makes a prefix cheap to serve later, for an LLM here or remote.

- `HFBackend` runs a Hugging Face causal LM in this process. Warming a prompt prefills it once
  and stores the KV of its full 16-token pages in a `HybridCache` (`cache_runtime.kv_pages`), so
  a later request only prefills what follows the cached pages. Pages already cached are neither
  recomputed nor rewritten: a second warm of the same prompt costs a few cache lookups.
- `OpenAICompatibleBackend` warms a remote vLLM / SGLang server's own prefix cache by sending it
  the prefix with `max_tokens=1`: the KV stays on the server's GPU, where the request that
  follows will look for it. Nothing is stored locally unless a response is asked for.

Pages are keyed by a `model_id` that fingerprints the weights and config (`model_fingerprint`),
not by a path or a registry version: the same weights loaded from a directory or from the
registry share pages, and different weights never do, whatever they are called.

The modules: `backend_contract` (the protocol, `WarmResult`, `Completion`, `BackendError`),
`hf_backend` (`HFBackend`, `model_fingerprint`) and `openai_backend`
(`OpenAICompatibleBackend`). Callers import from here, which names them all.
"""

from __future__ import annotations

from models.llm.backend_contract import (
    DEFAULT_RESPONSE_TOKENS,
    BackendError,
    Completion,
    DecodeListener,
    WarmResult,
    WarmupBackend,
)
from models.llm.hf_backend import HFBackend, model_fingerprint
from models.llm.openai_backend import OpenAICompatibleBackend

__all__ = [
    "DEFAULT_RESPONSE_TOKENS",
    "BackendError",
    "Completion",
    "DecodeListener",
    "HFBackend",
    "OpenAICompatibleBackend",
    "WarmResult",
    "WarmupBackend",
    "model_fingerprint",
]
