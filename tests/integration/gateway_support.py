"""What the gateway's end-to-end tests (test_gateway*.py) share: the keys and marker they use, a
running gateway (`Running`, `start`), and the requests they make through the official `openai`
client. Their fixtures (a model, MiniLM, a gateway per module) are gateway_fixtures.py's.

The model's text is meaningless (random weights) and the same for every tenant, so tests that
must tell a cached answer from a fresh one seed `MARKER` straight into the cache under the key
the gateway reads: serving the marker proves the cache answered, not serving it proves it did
not.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

from cache_runtime.hybrid import HybridCache
from cache_runtime.keys import ExactKey
from flows.gateway import CACHE_HEADER, GatewayConfig, create_app
from models.serving.embeddings import MiniLM
from models.serving.runners import InProcessRunner

KEYS = {"sk-acme-1": "acme", "sk-beta-1": "beta"}
ADMIN = "sk-admin-1"
MARKER = "CACHED ANSWER FOR ACME ONLY"
EMBEDDING_MODEL = "all-minilm-l6-v2"
MODEL_ANSWERED = ("miss", "prefix")  # no stored answer was served


@dataclass
class Running:
    url: str
    app: Any
    model: str
    redis_url: str | None
    namespace: str
    stream: str

    def client(self, key: str = "sk-acme-1") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60)

    @property
    def cache(self) -> HybridCache:
        return self.app.state.gateway.cache

    def admin(self, body: dict[str, Any], key: str | None = ADMIN) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{self.url}/admin/invalidate", json=body, headers=headers, timeout=30)


def start(
    backend: Any,
    minilm: MiniLM,
    data_dir: Path,
    redis_url: str | None,
    inject: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Running, Any]:
    """A gateway over the shared model and MiniLM, in its own Redis namespace and stream
    (`options`: more `GatewayConfig` fields; `inject`: more parts for `create_app`)."""
    from models.llm.openai_server import serve_in_thread

    namespace, stream = f"gw-{uuid.uuid4().hex[:8]}", f"gw-requests-{uuid.uuid4().hex[:8]}"
    settings: dict[str, Any] = {
        "keys": KEYS, "admin_keys": [ADMIN], "data_dir": data_dir, "redis_url": redis_url,
        "redis_namespace": namespace, "request_stream": stream, "memory_bytes": 32 << 20,
        "ssd_bytes": 64 << 20, "templates": False, **options,
    }  # fmt: skip
    config = GatewayConfig(**settings)
    app = create_app(config, runner=InProcessRunner(backend), minilm=minilm, **(inject or {}))
    url, stop = serve_in_thread(app)
    return Running(url, app, backend.model_id, redis_url, namespace, stream), stop


def unique(text: str) -> str:
    """`text` made particular to one test, so no test sees another's entries."""
    return f"Case {uuid.uuid4().hex[:6]}: {text}"


def complete(gw: Running, prompt: str, key: str = "sk-acme-1", **options: Any) -> tuple[str, Any]:
    """(x-preheat-cache, the parsed completion); greedy unless `temperature` is given."""
    options.setdefault("temperature", 0)
    raw = gw.client(key).completions.with_raw_response.create(
        model=gw.model, prompt=prompt, **options
    )
    return raw.headers[CACHE_HEADER], raw.parse()


def chat(gw: Running, content: str, key: str = "sk-acme-1", **options: Any) -> tuple[str, Any]:
    options.setdefault("temperature", 0)
    raw = gw.client(key).chat.completions.with_raw_response.create(
        model=gw.model, messages=[{"role": "user", "content": content}], **options
    )
    return raw.headers[CACHE_HEADER], raw.parse()


def streamed_chat(gw: Running, content: str, **options: Any) -> tuple[str, str, list[Any]]:
    """(x-preheat-cache, the text the chunks join to, the chunks)"""
    with gw.client().chat.completions.with_streaming_response.create(
        model=gw.model, messages=[{"role": "user", "content": content}], temperature=0,
        stream=True, **options,
    ) as response:  # fmt: skip
        chunks = list(response.parse())
        source = response.headers[CACHE_HEADER]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return source, text, chunks


def chat_key(gw: Running, tenant: str, content: str) -> ExactKey:
    """Where a default (greedy, 16-token) chat answer of the tiny model is stored: its prompt
    is the chat rendered as the model reads it."""
    return ExactKey.of(tenant, gw.model, f"user: {content}\nassistant:")


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of a Prometheus exposition (labels in any order)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    raise KeyError((name, labels))
