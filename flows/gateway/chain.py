"""The lookup chain: exact, then semantic (verified), then the model with KV prefix reuse.

1. **Exact**: `ExactKey(tenant, response model id, prompt)` in the node cache (memory -> SSD ->
   Redis): the key warm-up stores responses under, so a warmed prompt is a hit.
2. **Semantic**: a stored answer to a similar prompt of the same tenant, template, model and
   variant, returned only after `SemanticCache` verified it (calibrated cosine and guards).
3. **Model**: the runner answers; in process, it reuses the KV pages of the longest cached
   prefix and prefills only the rest (outcome `prefix` when any page was reused). The answer is
   stored under the exact key and as a semantic entry.

Steps 1, 2 and the stores run only for cacheable (greedy) requests (`validity.py`); a request
that opted out skips the cache entirely, KV pages included (outcome `bypass`): nothing of it is
read or written. The cache itself never fails a request (`HybridCache` absorbs tier errors), and
neither does the semantic layer: an embedding failure is counted and the chain goes on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cache_runtime.keys import ExactKey
from flows.gateway.validity import response_model_id

if TYPE_CHECKING:
    from cache_runtime.hybrid import HybridCache
    from flows.gateway.metrics import GatewayMetrics
    from flows.gateway.runners import Generation, Job, Runner
    from flows.gateway.semantic import SemanticAnswer, SemanticLayer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """An answer and where it came from.

    Attributes:
        outcome: the `x-preheat-cache` header: `exact-<tier>`, `semantic-<tier>`, `prefix`,
            `miss` or `bypass`.
        key: the exact key string of a cacheable request (None otherwise).
        template: the prompt's template id (None: untemplated, or not looked up).
    """

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    outcome: str
    key: str | None
    template: str | None
    prompt_ids: list[int] | None


@dataclass
class Chain:
    """The lookup order over one model and the node cache (module docstring): `serve`."""

    runner: Runner
    cache: HybridCache
    metrics: GatewayMetrics
    semantic: SemanticLayer | None = None
    ttl_s: float | None = None  # of stored responses

    def exact_key(self, tenant: str, job: Job) -> ExactKey:
        model = response_model_id(self.runner.model_id, job.decoding, job.route, self.upstream)
        return ExactKey.of(tenant, model, job.key_text)

    @property
    def upstream(self) -> bool:
        return self.runner.upstream

    def serve(self, tenant: str, job: Job, use_cache: bool) -> Served:
        template = self._template(tenant, job)
        if not use_cache:
            return self._from_model(self.runner.generate(job, None, tenant), None, template, True)
        if not job.decoding.cacheable:
            return self._from_model(self.runner.generate(job, self.cache, tenant), None, template)
        key = self.exact_key(tenant, job)
        text_key = key.to_string()
        value, tier = self.cache.get_with_tier(text_key)
        answer = _text(value)
        if answer is not None and tier is not None:
            self.metrics.hits.labels(tier, "exact").inc()
            return self._from_cache(job, answer, None, f"exact-{tier}", text_key, template)
        found = self._semantic_lookup(tenant, key.model_id, job, template)
        if found is not None:
            self.metrics.hits.labels(found.tier, "semantic").inc()
            cached = (found.text, found.finish_reason, found.completion_tokens)
            return self._from_cache(job, found.text, cached, f"semantic-{found.tier}",
                                    text_key, template)  # fmt: skip
        done = self.runner.generate(job, self.cache, tenant)
        self.cache.put(text_key, done.text.encode(), ttl_s=self.ttl_s)
        self._semantic_store(tenant, key.model_id, job, template, done)
        return self._from_model(done, text_key, template)

    # -- pieces -------------------------------------------------------------------------------

    def _template(self, tenant: str, job: Job) -> str | None:
        if self.semantic is None:
            return None
        return self.semantic.template_of(tenant, job.text)

    def _semantic_lookup(
        self, tenant: str, variant: str, job: Job, template: str | None
    ) -> SemanticAnswer | None:
        if self.semantic is None or job.question is None:
            return None
        try:
            tag = f"{variant}#{job.context}"
            return self.semantic.lookup(tenant, self.runner.model_id, tag, job.question, template)
        except Exception:  # the embedder is a dependency too: degrade to a miss, count it
            log.exception("semantic lookup failed; answering from the model")
            self.metrics.degraded.labels("semantic_lookup").inc()
            return None

    def _semantic_store(
        self, tenant: str, variant: str, job: Job, template: str | None, done: Generation
    ) -> None:
        if self.semantic is None or job.question is None:
            return
        try:
            answer = (done.text, done.finish_reason, done.completion_tokens)
            tag, model_id = f"{variant}#{job.context}", self.runner.model_id
            self.semantic.store(tenant, model_id, tag, job.question, template, answer)
        except Exception:
            log.exception("semantic store failed")
            self.metrics.degraded.labels("semantic_store").inc()

    def _from_model(
        self, done: Generation, key: str | None, template: str | None, bypass: bool = False
    ) -> Served:
        """The model's answer: `prefix` when it reused cached KV pages, else `miss`."""
        outcome = "bypass" if bypass else "prefix" if done.cached_tokens else "miss"
        if outcome == "prefix":
            self.metrics.hits.labels("kv", "prefix").inc()
        return Served(
            done.text, done.finish_reason, done.prompt_tokens, done.completion_tokens,
            done.cached_tokens, outcome, key, template, None,
        )  # fmt: skip

    def _from_cache(
        self,
        job: Job,
        text: str,
        known: tuple[str, str, int] | None,
        outcome: str,
        key: str,
        template: str | None,
    ) -> Served:
        """A cached answer with its usage: the prompt counted by the model's tokenizer (all of
        it cached); the completion from the semantic entry, else counted from the text (warm-up
        stores text only), `length` when that reaches `max_tokens`."""
        prompt_ids = self.runner.tokens(job.key_text)
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else 0
        if known is not None:
            finish, completion = known[1], known[2]
        else:
            ids = self.runner.tokens(text)
            completion = len(ids) if ids is not None else 0
            finish = "length" if completion >= job.decoding.max_tokens else "stop"
        return Served(text, finish, prompt_tokens, completion, prompt_tokens, outcome, key,
                      template, prompt_ids)  # fmt: skip


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None  # not a response this platform wrote: a miss, never a garbled answer
