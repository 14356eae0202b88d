"""`GatewayConfig`: everything `preheat gateway` needs, from arguments over `PREHEAT_GATEWAY_*`.

One settings object for the component (STYLE habit 5), validated at construction, nothing read
at import. The platform's own settings (data dir, Redis URL, request stream) are passed in by
the caller (`flows.cli.gateway` copies them from `cache_runtime.settings.Settings`), so there is
one place to set the Redis URL, not two. No FastAPI here: `models.serving.assembly.build_gateway`
builds the service from it, and `flows.gateway.create_app` puts the HTTP routes in front.

API keys are secrets: they come from a key file (`keys_file`) or the environment
(`PREHEAT_GATEWAY_KEYS='{"sk-...": "acme-bank"}'`, `PREHEAT_GATEWAY_ADMIN_KEYS='["sk-..."]'`),
never from a command-line option (which would put them in `ps` and shell history).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MB = 1_000_000
# The threshold `preheat bench semantic` calibrates on the shipped development pairs at a 1%
# false-hit target (Clopper-Pearson; see models/templates/semantic.py). A deployment should pass
# its own `Calibration` file (`calibration_file`), computed on its tenants' labelled pairs.
DEFAULT_SEMANTIC_THRESHOLD = 0.89
# OpenAI's default for /v1/completions, and the response length warm-up generates
# (`models.llm.backends.DEFAULT_RESPONSE_TOKENS`): a request that leaves max_tokens out reads
# the responses warm-up stored.
DEFAULT_MAX_TOKENS = 16


class GatewayConfig(BaseSettings):
    """The gateway's settings.

    Attributes:
        keys_file: JSON or TOML file with `keys` (API key -> tenant) and `admin_keys`.
        keys: API key -> tenant, merged with the file's (env: `PREHEAT_GATEWAY_KEYS`, JSON).
        admin_keys: keys of the admin endpoints; never a tenant's key.
        backend: `hf` (a Hugging Face causal LM in this process, KV pages reused) or `openai`
            (an upstream OpenAI-compatible server: vLLM, SGLang).
        model_path: the in-process model's `save_pretrained` directory (else the registry's
            `preheat-llm@champion` at `mlflow_uri`).
        base_url / upstream_model / upstream_api_key: the upstream server, its model name and key.
        served_model: the name clients put in `model` (default: the backend's model id).
        memory_bytes / ssd_bytes: the node cache's tiers (0 switches one off); with
            `redis_url` the shared Redis tier too: the same cache warm-up fills.
        response_ttl_s: expiry of stored responses (None: until evicted or invalidated).
        semantic: verified semantic lookups after an exact miss (MiniLM embeddings).
        semantic_threshold / calibration_file: the cosine a semantic hit needs; a calibration
            file (`models.templates.semantic_calibration.Calibration`) wins over the number.
        semantic_max_tokens: longer prompts (chat: last user messages) are never compared.
        templates: read the mined templates (`<data_dir>/features/templates.parquet`) to name
            each prompt's semantic namespace; without them one namespace per tenant and model.
        log_requests: log every request to the live stream (needs `redis_url`).
        metrics_window_s: the window of the gauges computed at scrape time (hit ratio, shares,
            QPS gain, SLA).
        slo_s: the latency SLO the SLA metrics compare each request with.
        canary_share: share of the requests that would use the cache answered with it off
            instead (outcome `canary`): the control group of the A/B comparison.
        tenant_label: how tenants appear in metrics and spans: `hashed` (a keyed BLAKE2b with
            `tenant_label_salt`: `/metrics` is scraped without a key) or `name`.
        roi_value_per_saved_s / roi_cost_per_compute_s: the value of a second of latency saved
            by a warmed hit, and the cost of a second of warm-up compute (same currency).
        roi_half_life_s: the half-life of every contribution to the ROI.
        forecast: compare the champion forecaster's per-key forecast with the traffic seen
            (needs `<data_dir>/features` and the MLflow store).
        forecast_window_s / forecast_refresh_s: the MAPE's window; how often it is reloaded.
        refresh_s: how often warm-up ledgers (attribution, cost) are read (0: only on demand,
            `app.state.gateway.signals.refresh()`).
        max_body_bytes: larger request bodies get 413 before they are read (`limits.py`).
        tenant_concurrency / tenant_queue / retry_after_s: generation requests of one tenant
            running at once, waiting beyond those, and the `Retry-After` of the 429 past both.
        decode_rows: sequences the in-process model decodes in one forward pass (None: by
            device, 1 on a CPU and 32 on a GPU: `models.llm.batch_decoder`).
        max_embedding_inputs / max_embedding_input_chars: per embeddings request, and per input
            (besides the encoder's own limit of 256 word pieces): 400 beyond, never a cut.
        session_idle_end_s: a conversation (`x-preheat-session`) with no request for this long
            is ended as `/v1/sessions/end` would end it, and goes on as a follow-up if it
            resumes (`cache_runtime.sessions`); 0: only the application's call ends one.
    """

    model_config = SettingsConfigDict(env_prefix="PREHEAT_GATEWAY_", extra="forbid")

    keys_file: Path | None = None
    keys: dict[str, str] = Field(default_factory=dict, repr=False)
    admin_keys: list[str] = Field(default_factory=list, repr=False)
    backend: Literal["hf", "openai"] = "hf"
    model_path: Path | None = None
    mlflow_uri: str = "sqlite:///mlruns/mlflow.db"
    device: str | None = None
    base_url: str | None = None
    upstream_model: str | None = None
    upstream_api_key: str | None = Field(default=None, repr=False)
    upstream_timeout_s: float = Field(default=120.0, gt=0)
    served_model: str | None = None
    data_dir: Path = Path("data")
    redis_url: str | None = None
    redis_namespace: str = "preheat"
    memory_bytes: int = Field(default=256 * MB, ge=0)
    ssd_bytes: int = Field(default=2048 * MB, ge=0)
    response_ttl_s: float | None = Field(default=None, gt=0)
    semantic: bool = True
    semantic_threshold: float = Field(default=DEFAULT_SEMANTIC_THRESHOLD, gt=0, le=1)
    calibration_file: Path | None = None
    # The calibration pairs are questions and single sentences (models/templates/pairs.py):
    # longer texts are outside what the threshold was calibrated on. MiniLM reads 256 at most.
    semantic_max_tokens: int = Field(default=64, ge=1, le=256)
    templates: bool = True
    default_max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    log_requests: bool = True
    request_stream: str = Field(default="preheat:requests", min_length=1)
    request_stream_maxlen: int = Field(default=1_000_000, gt=0)
    metrics_window_s: float = Field(default=300.0, gt=0)
    slo_s: float = Field(default=1.0, gt=0)
    canary_share: float = Field(default=0.0, ge=0, le=1)
    tenant_label: Literal["hashed", "name"] = "hashed"
    tenant_label_salt: str = Field(default="", repr=False)
    roi_value_per_saved_s: float = Field(default=1.0, ge=0)
    roi_cost_per_compute_s: float = Field(default=1.0, gt=0)
    roi_half_life_s: float = Field(default=86_400.0, gt=0)
    forecast: bool = True
    forecast_window_s: float = Field(default=3_600.0, gt=0)
    forecast_refresh_s: float = Field(default=600.0, gt=0)
    refresh_s: float = Field(default=30.0, ge=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    tenant_concurrency: int = Field(default=2, ge=1)
    tenant_queue: int = Field(default=8, ge=0)
    retry_after_s: int = Field(default=1, ge=1)
    decode_rows: int | None = Field(default=None, ge=1)
    max_embedding_inputs: int = Field(default=256, ge=1, le=2048)
    max_embedding_input_chars: int = Field(default=8192, ge=1)
    session_idle_end_s: float = Field(default=300.0, ge=0)

    @model_validator(mode="after")
    def _backend_complete(self) -> GatewayConfig:
        if self.backend == "openai" and not (self.base_url and self.upstream_model):
            raise ValueError("the openai backend needs base_url and upstream_model")
        if not (self.memory_bytes or self.ssd_bytes or self.redis_url):
            raise ValueError("no cache tier: give memory or SSD bytes, or a Redis URL")
        return self
