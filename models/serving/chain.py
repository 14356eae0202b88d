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

Each lookup is a `cache.lookup` span (kind, answering tier, hit) and each model call a
`model.generate` span (its reused KV tokens); with tracing off they are OTel no-ops.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import trace

from cache_runtime.keys import ExactKey
from models.serving.validity import response_model_id

if TYPE_CHECKING:
    from collections.abc import Mapping

    from cache_runtime.hybrid import HybridCache
    from models.serving.runners import Generation, Job, Runner
    from models.serving.semantic import SemanticAnswer, SemanticLayer
    from models.serving.signals import Signals
    from models.serving.streaming import AnswerSink
    from models.templates.mined import MinedTemplates

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """An answer and where it came from.

    Attributes:
        outcome: the `x-preheat-cache` header: `exact-<tier>`, `semantic-<tier>`, `prefix`,
            `miss`, `bypass` or `canary` (the control group, see `Signals.canary_draw`).
        key: the exact key string of a cacheable request (None otherwise).
        template: the prompt's template id (None: untemplated, or not looked up).
        model_s: seconds the model spent on it (0 for an answer from the cache).
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
    model_s: float = 0.0


@dataclass
class Chain:
    """The lookup order over one model and the node cache (module docstring): `serve`."""

    runner: Runner
    cache: HybridCache
    signals: Signals
    semantic: SemanticLayer | None = None
    ttl_s: float | None = None  # of stored responses
    tracer: trace.Tracer = field(default_factory=trace.NoOpTracer)
    # tenant -> its mined templates' assigner: an answer's template (`_template`)
    templates: Mapping[str, MinedTemplates] = field(default_factory=dict)

    def exact_key(self, tenant: str, job: Job) -> ExactKey:
        model = response_model_id(self.runner.model_id, job.decoding, job.route, self.upstream)
        return ExactKey.of(tenant, model, job.key_text)

    @property
    def upstream(self) -> bool:
        return self.runner.upstream

    def serve(
        self, tenant: str, job: Job, use_cache: bool, sink: AnswerSink | None = None
    ) -> Served:
        """The answer and where it came from. `sink`: a streamed request's; if the model
        answers, `sink.begin(outcome, key)` once its prefill is done, then each decoded piece
        (a cached answer goes whole, and `begin` is never called)."""
        template = self._template(tenant, job)
        if not use_cache:
            done, seconds = self._generate(job, None, tenant, _Begin(sink, None, "bypass"))
            return self._from_model(done, seconds, None, template, True)
        if not job.decoding.cacheable:
            done, seconds = self._generate(job, self.cache, tenant, _Begin(sink, None))
            return self._from_model(done, seconds, None, template)
        key = self.exact_key(tenant, job)
        text_key = key.to_string()
        with self.tracer.start_as_current_span("cache.lookup") as span:
            self.signals.lookup("exact")
            # the generations read here are what the answer computed after a miss is stored with
            looked_up = self.cache.lookup(text_key, template=template)
            answer, tier = _text(looked_up.value), looked_up.tier
            hit = answer is not None and tier is not None
            _lookup_attributes(span, "exact", tier if hit else None)
        if answer is not None and tier is not None:
            self.signals.hit(tier, "exact")
            return self._from_cache(job, answer, None, f"exact-{tier}", text_key, template)
        found = self._semantic_lookup(tenant, key.model_id, job, template)
        if found is not None:
            self.signals.hit(found.tier, "semantic")
            cached = (found.text, found.finish_reason, found.completion_tokens)
            return self._from_cache(job, found.text, cached, f"semantic-{found.tier}",
                                    text_key, template)  # fmt: skip
        done, seconds = self._generate(job, self.cache, tenant, _Begin(sink, text_key))
        stamp = looked_up.generations
        if stamp is not None:  # else Redis is down: answers cannot be validated, nor stored
            self.cache.put(text_key, done.text.encode(), ttl_s=self.ttl_s, template=template,
                           generations=stamp)  # fmt: skip
            self._semantic_store(tenant, key.model_id, job, template, done,
                                 (text_key, stamp))  # fmt: skip
        return self._from_model(done, seconds, text_key, template)

    # -- pieces -------------------------------------------------------------------------------

    def _generate(
        self, job: Job, cache: HybridCache | None, tenant: str, begin: _Begin
    ) -> tuple[Generation, float]:
        """The model's answer and the seconds it took (KV pages are looked up inside: with a
        cache, the call counts as a prefix lookup)."""
        with self.tracer.start_as_current_span("model.generate") as span:
            if cache is not None:
                self.signals.lookup("prefix")
            started = time.perf_counter()
            listener = begin if begin.sink is not None else None
            done = self.runner.generate(job, cache, tenant, listener)
            seconds = time.perf_counter() - started
            if span.is_recording():
                span.set_attribute("preheat.route", job.route)
                span.set_attribute("preheat.kv.cached_tokens", done.cached_tokens)
                span.set_attribute("preheat.model.completion_tokens", done.completion_tokens)
        return done, seconds

    def _template(self, tenant: str, job: Job) -> str | None:
        """The prompt's mined template: its answers' generation scope (warm-up assigns the
        same, `models.warmup.run.shared_template_of`) and its semantic namespace."""
        assigner = self.templates.get(tenant)
        return assigner.assign(job.text) if assigner is not None else None

    def _semantic_lookup(
        self, tenant: str, variant: str, job: Job, template: str | None
    ) -> SemanticAnswer | None:
        if self.semantic is None or job.question is None:
            return None
        with self.tracer.start_as_current_span("cache.lookup") as span:
            self.signals.lookup("semantic")
            try:
                tag = f"{variant}#{job.context}"
                found = self.semantic.lookup(
                    tenant, self.runner.model_id, tag, job.question, template
                )
            except Exception:  # the embedder is a dependency too: degrade to a miss, count it
                log.exception("semantic lookup failed; answering from the model")
                self.signals.metrics.degraded.labels("semantic_lookup").inc()
                found = None
            _lookup_attributes(span, "semantic", found.tier if found is not None else None)
            return found

    def _semantic_store(
        self,
        tenant: str,
        variant: str,
        job: Job,
        template: str | None,
        done: Generation,
        exact: tuple[str, bytes],
    ) -> None:
        """A semantic entry pointing at the exact answer (`exact`: its key and generations),
        which it is served only as long as that answer would be."""
        if self.semantic is None or job.question is None:
            return
        try:
            answer = (done.text, done.finish_reason, done.completion_tokens)
            tag = f"{variant}#{job.context}"
            self.semantic.store(
                tenant, self.runner.model_id, tag, job.question, template, answer, exact
            )
        except Exception:
            log.exception("semantic store failed")
            self.signals.metrics.degraded.labels("semantic_store").inc()

    def _from_model(
        self,
        done: Generation,
        seconds: float,
        key: str | None,
        template: str | None,
        bypass: bool = False,
    ) -> Served:
        """The model's answer: `prefix` when it reused cached KV pages, else `miss`."""
        outcome = "bypass" if bypass else "prefix" if done.cached_tokens else "miss"
        if outcome == "prefix":
            self.signals.hit("kv", "prefix")
        return Served(
            done.text, done.finish_reason, done.prompt_tokens, done.completion_tokens,
            done.cached_tokens, outcome, key, template, None, seconds,
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


@dataclass(frozen=True)
class _Begin:
    """The runner's listener for a streamed request: tells the sink the outcome once the
    prefill is done (`prefix` when it reused KV pages, else `miss`; `bypass` when forced),
    then passes the text on."""

    sink: AnswerSink | None
    key: str | None
    forced: str | None = None

    def started(self, cached_tokens: int) -> None:
        assert self.sink is not None
        outcome = self.forced or ("prefix" if cached_tokens else "miss")
        self.sink.begin(outcome, self.key)

    def text(self, delta: str) -> bool:
        assert self.sink is not None
        return self.sink.text(delta)


def _lookup_attributes(span: trace.Span, kind: str, tier: str | None) -> None:
    if span.is_recording():
        span.set_attribute("preheat.cache.kind", kind)
        span.set_attribute("preheat.cache.hit", tier is not None)
        span.set_attribute("preheat.cache.tier", tier or "none")


def _text(value: bytes | None) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None  # not a response this platform wrote: a miss, never a garbled answer
