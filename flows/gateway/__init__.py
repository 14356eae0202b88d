"""The serving gateway: an OpenAI-compatible API in front of the model, reading and filling the
node cache warm-up fills (issue 9). `create_app(GatewayConfig(...))` gives the FastAPI app;
`preheat gateway` (`flows.cli.gateway`) serves it with uvicorn. Here is its HTTP layer; the
request schemas, keys, limits, metrics and settings are `cache_runtime/serving/`, what a request
does with the models (the chain, runners, semantic entries, embeddings) `models/serving/`."""

from __future__ import annotations

from cache_runtime.serving.auth import KeyRing
from cache_runtime.serving.config import GatewayConfig
from flows.gateway.app import CACHE_HEADER, KEY_HEADER, create_app

__all__ = ["CACHE_HEADER", "KEY_HEADER", "GatewayConfig", "KeyRing", "create_app"]
