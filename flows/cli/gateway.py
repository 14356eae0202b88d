"""`preheat gateway`: serve the OpenAI-compatible gateway (`flows.gateway`) with uvicorn.

Kept apart from `flows/cli/__init__.py` (which registers the command). Options left out fall back to
`PREHEAT_GATEWAY_*` environment variables, then to the defaults of `GatewayConfig`; API keys come
only from `--keys FILE` or the environment, never from an option (it would show in `ps`).
Tracing options fall back to `PREHEAT_TRACING_*` (`cache_runtime.telemetry.TracingSettings`).
Bad input (a missing key file, an unknown backend, no model) exits 2 with one line.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import CliError, ConfigOption, DataDirOption, settings_from, stderr

MB = 1_000_000


# The options, one alias each: the command's signature stays a list of what it takes.
KeysOption = Annotated[
    Path | None,
    typer.Option("--keys", help="JSON/TOML key file: keys (key -> tenant), admin_keys."),
]
BackendOption = Annotated[
    str | None, typer.Option(help="hf (in-process model) or openai (upstream server).")
]
ModelPathOption = Annotated[
    Path | None, typer.Option("--model-path", help="HF model directory (else the registry).")
]
BaseUrlOption = Annotated[str | None, typer.Option("--base-url", help="Upstream server.")]
ModelNameOption = Annotated[
    str | None, typer.Option("--model-name", help="The upstream server's model name.")
]
ServedNameOption = Annotated[
    str | None, typer.Option("--served-name", help="Model name clients send (default: id).")
]
RedisOption = Annotated[
    bool,
    typer.Option(
        "--redis/--no-redis",
        help="Use the Redis tier and the live request log (the configured URL, else an "
        "embedded redis-server for this run).",
    ),
]
MemoryMbOption = Annotated[
    float | None, typer.Option("--memory-mb", min=0, help="Memory tier, MB.")
]
SsdMbOption = Annotated[float | None, typer.Option("--ssd-mb", min=0, help="SSD tier, MB.")]
SemanticOption = Annotated[
    bool | None,
    typer.Option("--semantic/--no-semantic", help="Verified semantic lookups (MiniLM)."),
]
CalibrationOption = Annotated[
    Path | None,
    typer.Option("--calibration", help="Semantic threshold calibration (JSON) to use."),
]
TtlOption = Annotated[
    float | None, typer.Option("--ttl-s", min=0.001, help="Expiry of stored responses.")
]
SloOption = Annotated[
    float | None, typer.Option("--slo-s", min=0.001, help="Latency SLO of the SLA metrics.")
]
CanaryOption = Annotated[
    float | None,
    typer.Option("--canary-share", min=0, max=1, help="Share served cache-off (control)."),
]
TracingOption = Annotated[
    str | None, typer.Option("--tracing", help="Spans to: off, console (stderr) or otlp.")
]
OtlpEndpointOption = Annotated[
    str | None,
    typer.Option("--otlp-endpoint", help="OTLP/HTTP traces URL (with --tracing otlp)."),
]


def gateway_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    keys: KeysOption = None,
    backend: BackendOption = None,
    model_path: ModelPathOption = None,
    base_url: BaseUrlOption = None,
    model_name: ModelNameOption = None,
    served_name: ServedNameOption = None,
    redis: RedisOption = True,
    memory_mb: MemoryMbOption = None,
    ssd_mb: SsdMbOption = None,
    semantic: SemanticOption = None,
    calibration: CalibrationOption = None,
    ttl_s: TtlOption = None,
    slo_s: SloOption = None,
    canary_share: CanaryOption = None,
    tracing: TracingOption = None,
    otlp_endpoint: OtlpEndpointOption = None,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Serve the OpenAI-compatible gateway: cached answers first, the model on a miss."""
    settings = settings_from(config, data_dir)
    given: dict[str, Any] = {
        "keys_file": keys, "backend": backend, "model_path": model_path, "base_url": base_url,
        "upstream_model": model_name, "served_model": served_name, "semantic": semantic,
        "calibration_file": calibration, "response_ttl_s": ttl_s, "slo_s": slo_s,
        "canary_share": canary_share,
        "memory_bytes": None if memory_mb is None else int(memory_mb * MB),
        "ssd_bytes": None if ssd_mb is None else int(ssd_mb * MB),
    }  # fmt: skip
    for path in (keys, model_path, calibration):
        if path is not None and not path.exists():
            raise CliError(f"{path}: no such file or directory")
    from cache_runtime import telemetry
    from cache_runtime.services import RedisHandle

    telemetry.install(_tracing(tracing, otlp_endpoint))
    try:
        with (
            RedisHandle(settings.redis_url, supervise=True)
            if redis
            else nullcontext(None) as redis_url
        ):
            app = _app(settings, redis_url, {k: v for k, v in given.items() if v is not None})
            import uvicorn

            model = app.state.gateway.served_model
            stderr.print(f"gateway on http://{host}:{port} (model {model}; Ctrl-C stops it)")
            uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        telemetry.shutdown()  # flushes the spans still batched


def _tracing(exporter: str | None, endpoint: str | None) -> Any:
    """The tracer provider the options (over `PREHEAT_TRACING_*`) ask for; None when off."""
    from pydantic import ValidationError

    from cache_runtime.telemetry import TracingSettings, build_provider

    given = {k: v for k, v in (("exporter", exporter), ("endpoint", endpoint)) if v is not None}
    try:
        return build_provider(TracingSettings(**given))
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "tracing"
        raise CliError(f"invalid tracing settings: {where}: {first.get('msg')}") from None


def _app(settings: Any, redis_url: str | None, given: dict[str, Any]) -> Any:
    """The app, or a one-line `CliError` for what a user can fix."""
    from pydantic import ValidationError

    from cache_runtime.serving.auth import KeyFileError
    from flows.gateway import GatewayConfig, create_app

    try:
        gateway_config = GatewayConfig(
            data_dir=settings.data_dir, redis_url=redis_url, mlflow_uri=settings.mlflow_uri,
            request_stream=settings.request_stream,
            request_stream_maxlen=settings.request_stream_maxlen, **given,
        )  # fmt: skip
        with stderr.status("loading the model and MiniLM"):
            return create_app(gateway_config)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "config"
        raise CliError(f"invalid gateway settings: {where}: {first.get('msg')}") from None
    except (KeyFileError, LookupError, FileNotFoundError, OSError) as err:
        raise CliError(" ".join(str(err).split())) from None
