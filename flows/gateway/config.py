"""The gateway's settings, under the name the gateway's callers import them by.

Wiring without a FastAPI import of its own: `GatewayConfig` is `models.serving.config`'s (the
service is built from it without HTTP, `models.serving.assembly`); this module keeps
`flows.gateway.config` importable for the app's callers.
"""

from __future__ import annotations

from models.serving.config import DEFAULT_MAX_TOKENS, DEFAULT_SEMANTIC_THRESHOLD, GatewayConfig

__all__ = ["DEFAULT_MAX_TOKENS", "DEFAULT_SEMANTIC_THRESHOLD", "GatewayConfig"]
