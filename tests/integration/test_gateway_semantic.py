"""The gateway end to end, MiniLM's two uses: the embeddings route (MiniLM's vectors, cached per
input) and the semantic layer (a verified paraphrase hits, a changed number or another context
does not). (The setting: test_gateway.py.)"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from gateway_support import EMBEDDING_MODEL, Running, chat, complete, unique

from cache_runtime.serving.config import DEFAULT_SEMANTIC_THRESHOLD
from flows.gateway import CACHE_HEADER
from models.serving.embeddings import MiniLM
from models.templates.guards import guards_pass
from models.templates.semantic import normalise

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


# -- embeddings -----------------------------------------------------------------------------------


def test_embeddings_are_minilm_and_cached_per_input(gw: Running, minilm: MiniLM) -> None:
    texts = [unique("savings account interest"), unique("credit card annual fee")]
    client = gw.client()
    first = client.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=texts[0])
    both = client.embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL, input=texts, encoding_format="float"
    )

    assert first.headers[CACHE_HEADER] == "miss"
    assert both.headers[CACHE_HEADER] == "exact-memory,miss"
    vectors = np.array([d.embedding for d in both.parse().data], dtype=np.float32)
    np.testing.assert_allclose(vectors, minilm.encode(texts), atol=1e-5)
    np.testing.assert_allclose(first.parse().data[0].embedding, vectors[0], atol=1e-6)
    assert both.parse().usage.prompt_tokens == sum(minilm.count(texts))


# -- semantic -------------------------------------------------------------------------------------


def test_a_verified_paraphrase_hits_and_a_changed_number_does_not(
    gw: Running, minilm: MiniLM
) -> None:
    case = uuid.uuid4().hex[:6]
    stored = f"How do I reset my online banking password? Ref {case}"
    paraphrase = f"How can I reset my online banking password? Ref {case}"
    revenue = f"What was the net revenue of ACME Corp in 2023? Ref {case}"
    other_year = f"What was the net revenue of ACME Corp in 2022? Ref {case}"

    def cosine(a: str, b: str) -> float:
        """What the gateway compares: a chat's normalised last user message."""
        va, vb = minilm.encode([normalise(a), normalise(b)])
        return float(va @ vb) / float(np.linalg.norm(va) * np.linalg.norm(vb))

    # what makes the test mean something: both pairs clear the threshold, so only the guard
    # tells the second pair apart
    assert cosine(stored, paraphrase) >= DEFAULT_SEMANTIC_THRESHOLD
    assert cosine(revenue, other_year) >= DEFAULT_SEMANTIC_THRESHOLD
    assert not guards_pass(revenue, other_year)
    first_source, first = chat(gw, stored)
    assert first_source == "miss" and chat(gw, revenue)[0] == "miss"

    source, answer = chat(gw, paraphrase)
    year_source, _ = chat(gw, other_year)

    assert source == "semantic-memory"
    assert answer.choices[0].message.content == first.choices[0].message.content
    assert year_source == "miss"


def test_semantic_needs_the_same_context_and_a_question_length_prompt(gw: Running) -> None:
    question = unique("How do I reset my online banking password?")
    system = [{"role": "system", "content": "Answer as the retail bank's assistant."}]
    other_system = [{"role": "system", "content": "Answer as the private bank's assistant."}]
    ask = [{"role": "user", "content": question}]
    near = [{"role": "user", "content": question.replace("How do I", "How can I")}]
    client = gw.client()

    def source(messages: list[dict[str, str]]) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=gw.model, messages=messages, temperature=0
        )
        return raw.headers[CACHE_HEADER]

    assert source(system + ask) == "miss"
    assert source(system + near) == "semantic-memory"  # same context, similar question
    assert source(other_system + near) == "miss"  # another system prompt: not the same answer
    # a long instruction with a short distinct tail embeds close to the instruction alone
    head = unique("Our bank's policy on wire transfers, in full detail. " * 6)
    assert complete(gw, head)[0] == "miss"
    assert complete(gw, head + " And for acme?")[0] == "prefix"
