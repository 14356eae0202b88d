"""Verified semantic lookups for the gateway, over the node's `HybridCache`.

`models.templates.semantic_cache.SemanticCache` decides a hit (calibrated cosine threshold and
the number/date/negation guards); this module only names where the gateway's entries live and
what they carry:

- **Namespace** `SemanticKey(tenant, "<template>@<model id>", bucket)`: the tenant from the API
  key, the prompt's mined template (`untemplated` without a templates table or for a one-off
  prompt) and the model, so no lookup can see another tenant's or model's entries.
- **What is compared** the prompt, or a chat's last user message (`runners.chat_parts`); the
  rest of a chat must be equal, not similar.
- **Entry** the response as JSON with a tag: the request's variant (`validity.response_model_id`)
  and its chat context digest. A verified neighbour stored for another `max_tokens`, stop list
  or conversation is a miss, never an answer.
- **Length** texts over `max_tokens` MiniLM word pieces (default 64) are never compared: the
  threshold is calibrated on questions and single sentences, MiniLM reads only the first 256
  pieces, and in a long text a short distinctive part barely moves the embedding (measured: a
  65-piece instruction and the same with " And for acme?" appended score above 0.89).
- **Tier** the store records which tier answered the verified probe, for the response header.
- **Validity** each entry names the exact answer it was stored beside (its key and the
  generations that answer was computed under) and is served only while those are current
  (`HybridCache.is_current`): invalidating the answer by key, by request, by template or by
  tenant removes every way to it, paraphrases included, with no bucket to find and delete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from cache_runtime.keys import SemanticKey
from models.templates.semantic_cache import SemanticCache

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from models.templates.embeddings import Embedder
    from models.templates.semantic_calibration import Calibration

UNTEMPLATED = "untemplated"
DEFAULT_MAX_TOKENS = 64


class TierTrackingStore:
    """A `BucketStore` over a `HybridCache` that remembers which tier held the verified bucket.
    One per lookup: it is the lookup's own record, never shared between threads. Buckets are
    answers of the prompt's template (`template`: their generation scope)."""

    def __init__(self, cache: HybridCache, template: str | None) -> None:
        self.cache = cache
        self.template = template
        self.tier: str | None = None
        self._read: dict[str, bytes | None] = {}  # bucket -> the generations its read saw

    def get(self, key: SemanticKey) -> bytes | None:
        found = self.cache.lookup(key, template=self.template)
        self._read[key.to_string()] = found.generations
        return found.value

    def put(self, key: SemanticKey, value: bytes, *, ttl_s: float | None = None) -> bool:
        """Written back only under the generations its read saw (a bucket invalidated since
        is not): the read-extend-write of `SemanticCache.put`."""
        stamp = self._read.get(key.to_string())
        if stamp is None:
            return False
        return self.cache.put(key, value, ttl_s=ttl_s, template=self.template, generations=stamp)

    def get_semantic(self, key: SemanticKey, verify: Callable[[bytes], bool]) -> bytes | None:
        found = self.cache.lookup(key, template=self.template)
        if found.value is None:
            return None
        if verify(found.value):
            self.tier = found.tier
            return found.value
        self.cache.metrics.lookups.labels("verify", "semantic", "rejected").inc()
        return None


@dataclass(frozen=True)
class SemanticAnswer:
    text: str
    finish_reason: str
    completion_tokens: int
    tier: str
    similarity: float


class SemanticLayer:
    """Semantic lookups and stores for one model's responses."""

    def __init__(
        self,
        cache: HybridCache,
        embedder: Embedder,
        threshold: float | Calibration,
        ttl_s: float | None = None,
        count: Callable[[list[str]], Sequence[int]] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
    ) -> None:
        """`count`: MiniLM word pieces per text (None: no length limit)."""
        self.cache, self.embedder, self.threshold = cache, embedder, threshold
        self.ttl_s, self.count, self.max_tokens = ttl_s, count, max_tokens

    def comparable(self, text: str) -> bool:
        return self.count is None or self.count([text])[0] <= self.max_tokens

    @staticmethod
    def namespace(template: str | None, model_id: str) -> str:
        return f"{template or UNTEMPLATED}@{model_id}"

    def _cache(self, store: TierTrackingStore) -> SemanticCache:
        return SemanticCache(self.embedder, self.threshold, store, ttl_s=self.ttl_s)

    def lookup(
        self, tenant: str, model_id: str, tag: str, prompt: str, template: str | None
    ) -> SemanticAnswer | None:
        """A verified answer stored under the same tag (variant and context), or None."""
        if not self.comparable(prompt):
            return None
        store = TierTrackingStore(self.cache, template)
        hit = self._cache(store).lookup(tenant, self.namespace(template, model_id), prompt)
        if hit is None or store.tier is None:
            return None
        try:
            entry = orjson.loads(hit.response)
            if entry["tag"] != tag:
                return None  # a neighbour answered with other parameters or context
            exact, stamp = str(entry["key"]), str(entry["generations"]).encode()
            if not self.cache.is_current(exact, stamp, template):
                return None  # the answer it was stored beside was invalidated since
            return SemanticAnswer(
                str(entry["text"]), str(entry["finish_reason"]), int(entry["completion_tokens"]),
                store.tier, hit.similarity,
            )  # fmt: skip
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return None  # not an entry the gateway wrote: never served

    def store(
        self,
        tenant: str,
        model_id: str,
        tag: str,
        prompt: str,
        template: str | None,
        answer: tuple[str, str, int],
        exact: tuple[str, bytes],
    ) -> None:
        """Store (text, finish_reason, completion_tokens) for `prompt` (if comparable), beside
        the exact answer `exact` (its key, and the generations it was computed under): the
        entry is served only while that answer would be."""
        if not self.comparable(prompt):
            return
        text, finish, tokens = answer
        entry = {"tag": tag, "text": text, "finish_reason": finish, "completion_tokens": tokens,
                 "key": exact[0], "generations": exact[1].decode()}  # fmt: skip
        store = TierTrackingStore(self.cache, template)
        namespace = self.namespace(template, model_id)
        self._cache(store).put(tenant, namespace, prompt, orjson.dumps(entry).decode())
