"""When a cached response may answer a request: the gateway's cache-validity rule.

A stored answer is served only for a request it is *the* answer to:

1. **Deterministic requests only.** A response is looked up and stored only at
   `temperature == 0` (greedy decoding) with `n == 1`. A sampled request (OpenAI's default
   temperature is 1) asks for a fresh draw; serving a stored one would silently turn sampling
   into a constant. Sampled requests still reuse KV pages: a prefix's keys and values do not
   depend on how the next token is chosen.
2. **Every output-shaping parameter is in the key.** `max_tokens`, `stop` and — for an upstream
   model — `top_p`, `seed`, the route (chat templates differ from raw prompts there) and any
   field the gateway does not know (`logit_bias`, `response_format`, ...) form the request's
   *variant*; the exact key's model field is `<model id>` for the default variant (greedy,
   16 tokens, nothing else: what warm-up generates and stores, so the gateway reads warm-up's
   responses) and `<model id>~<16 hex digest of the variant>` for any other. Rejected: keying
   by model and prompt only and truncating a longer cached answer to `max_tokens` — decoded
   text does not split back into tokens reliably, so the cut answer could differ from the
   model's.
3. **The in-process model refuses what it cannot honour** (`check_in_process`): unknown fields
   with a value, `top_p < 1` when sampling. It would otherwise answer — and cache — a request
   it did not execute as asked.

Prompts are keyed as `cache_runtime.keys.normalise_prompt` leaves them (NFC, whitespace runs
collapsed, case and punctuation kept): the platform's exact-key rule, shared with warm-up.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from cache_runtime.serving.schemas import ChatRequest, GenerationRequest, bad_request
from models.llm.backends import DEFAULT_RESPONSE_TOKENS

_NO_OPS = (None, False, 0, "", [], {})  # values of unknown fields that change nothing


@dataclass(frozen=True)
class Decoding:
    """How a request wants its answer generated."""

    max_tokens: int
    temperature: float
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # forwarded to an upstream model

    @property
    def cacheable(self) -> bool:
        """Rule 1: only a greedy answer is *the* answer."""
        return self.temperature == 0.0


def decoding_of(request: GenerationRequest, default_max_tokens: int) -> Decoding:
    if request.n != 1:
        raise bad_request("n > 1 is not supported: send one request per answer", "n")
    newer = request.max_completion_tokens if isinstance(request, ChatRequest) else None
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if any(not s for s in stop):
        raise bad_request("stop sequences must not be empty", "stop")
    return Decoding(
        max_tokens=newer or request.max_tokens or default_max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=stop,
        extra=request.extras(),
    )


def check_in_process(decoding: Decoding) -> None:
    """Rule 3: refuse what the in-process model would silently ignore."""
    unsupported = sorted(k for k, v in decoding.extra.items() if v not in _NO_OPS)
    if unsupported:
        raise bad_request(
            f"not supported by the in-process model: {', '.join(unsupported)}", unsupported[0]
        )
    if decoding.temperature > 0 and decoding.top_p not in (None, 1.0):
        raise bad_request("top_p is not supported by the in-process model", "top_p")


def variant(decoding: Decoding, route: str, upstream: bool) -> dict[str, Any]:
    """Rule 2: everything besides model and prompt that shapes a greedy answer."""
    shape: dict[str, Any] = {"max_tokens": decoding.max_tokens}
    if decoding.stop:
        shape["stop"] = list(decoding.stop)
    if upstream:  # the in-process model renders chat to the prompt itself: same input, same answer
        if route == "chat":
            shape["route"] = "chat"
        if decoding.top_p is not None:
            shape["top_p"] = decoding.top_p
        if decoding.seed is not None:
            shape["seed"] = decoding.seed
        shape.update({f"x.{k}": v for k, v in decoding.extra.items()})
    return shape


def response_model_id(model_id: str, decoding: Decoding, route: str, upstream: bool) -> str:
    """The model field of the request's exact key (and its semantic entries' variant tag)."""
    shape = variant(decoding, route, upstream)
    if shape == {"max_tokens": DEFAULT_RESPONSE_TOKENS}:
        return model_id
    try:
        text = orjson.dumps(shape, option=orjson.OPT_SORT_KEYS)
    except TypeError as error:
        raise bad_request(f"a request field cannot be serialised: {error}") from None
    return f"{model_id}~{hashlib.blake2b(text, digest_size=8).hexdigest()}"
