"""`preheat replay`: the A/B replay of a trace against the hybrid cache (issue 7, item 4)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.cli_common import CliError, ConfigOption, settings_from, stderr, write_json

if TYPE_CHECKING:
    from flows.bench.traces import AccessTrace
    from flows.replay.engine import ReplayConfig
    from flows.replay.latency import ReplayLatency


def replay_command(
    trace: Annotated[Path, typer.Option(help="Trace file.")],
    warmup: Annotated[str, typer.Option(help="on|off: warm-up engine in the replay.")],
    memory: Annotated[float, typer.Option(help="Memory tier, fraction of unique blocks.")],
    ssd: Annotated[float, typer.Option(help="SSD tier, fraction of unique blocks.")],
    format_name: Annotated[str, typer.Option("--format", help="mooncake")] = "mooncake",
    redis: Annotated[
        float, typer.Option(help="Shared Redis tier, fraction of unique blocks (0: none).")
    ] = 0.0,
    restart_every: Annotated[
        float | None, typer.Option("--restart-every", help="Restart the node every N seconds.")
    ] = None,
    window: Annotated[float, typer.Option(help="Seconds after a restart that are scored.")] = 120.0,
    latency: Annotated[
        str, typer.Option(help="measured (this machine, the configured model) | reference")
    ] = "measured",
    model: Annotated[
        Path | None, typer.Option(help="Local checkpoint whose prefill is measured.")
    ] = None,
    report: Annotated[
        Path | None,
        typer.Option(
            help="Write an HTML report with plots here (replays both arms), log to MLflow."
        ),
    ] = None,
    target_precision: Annotated[
        float,
        typer.Option(help="Expected warm-up precision each plan is cut to (0: no cut)."),
    ] = 0.6,
    as_json: Annotated[bool, typer.Option("--json", help="Accepted; output is JSON.")] = True,
    config: ConfigOption = None,
) -> None:
    """Replay in trace time with restarts; warm-up on or off; the restore reference beside it."""
    settings = settings_from(config, None)
    from cache_runtime.services import RedisHandle
    from flows.bench.traces import TraceError, load_trace
    from flows.replay.engine import ReplayConfig

    if warmup not in ("on", "off"):
        raise CliError(f"--warmup {warmup!r}: choose on or off")
    if latency not in ("measured", "reference"):
        raise CliError(f"--latency {latency!r}: choose measured or reference")
    if model is not None and not model.is_dir():
        raise CliError(f"--model {model}: no such checkpoint directory")
    try:
        replay_config = ReplayConfig(
            memory=memory, ssd=ssd, redis=redis, restart_every_s=restart_every,
            window_s=window, warmup=warmup == "on",
            target_precision=target_precision if target_precision != 0 else None,
        )  # fmt: skip
        loaded = load_trace(trace, format_name)
    except (ValueError, TraceError) as err:
        raise CliError(str(err)) from None
    if loaded.times is None:
        raise CliError(f"{trace}: {format_name} traces carry no timestamps; replay needs them")
    if redis > 0:  # always a private server: the replay empties and caps the Redis it uses
        with RedisHandle(None) as redis_url:
            result = _replay(loaded, replay_config, latency, model, redis_url, report)
    else:
        result = _replay(loaded, replay_config, latency, model, None, report)
    if report is not None:
        from flows.replay.report import log_report

        result["mlflow_run_id"] = log_report(
            report, {"off": result.pop("_off"), "on": result.pop("_on")},
            settings.mlflow_uri, settings.mlflow_artifacts,
        )  # fmt: skip
    write_json(result)


def _replay(
    loaded: AccessTrace, config: ReplayConfig, latency: str, model: Path | None,
    redis_url: str | None, report: Path | None,
) -> dict[str, Any]:  # fmt: skip
    from dataclasses import replace

    from flows.replay.engine import (
        PreparedTrace,
        reference_config,
        replay_arms,
        request_times,
        summarize,
    )  # fmt: skip

    latency_model = _latency(latency, model, redis_url)
    configs = {"arm": config, "reference": reference_config(config)}
    if report is not None:  # the report draws both arms
        configs["other"] = replace(config, warmup=not config.warmup)
    with stderr.status(f"replaying {len(loaded.request_starts)} requests x {len(configs)}"):
        arms = replay_arms(PreparedTrace.build(loaded), configs, latency_model, redis_url)
    times = request_times(loaded)
    result = summarize(arms["arm"], arms["reference"], times, config, latency_model)
    if report is not None:
        from flows.replay.report import write_report

        other = summarize(arms["other"], arms["reference"], times, configs["other"], latency_model)
        on, off = (result, other) if config.warmup else (other, result)
        by_label = {
            "warm-up off": arms["other" if config.warmup else "arm"],
            "warm-up on": arms["arm" if config.warmup else "other"],
            "restore reference": arms["reference"],
        }
        path = write_report(report, by_label, times, {"off": off, "on": on}, config.window_s)
        stderr.print(f"report: {path}")
        result = {**result, "report": str(path), "_off": off, "_on": on}
    return result


def _latency(kind: str, model: Path | None, redis_url: str | None) -> ReplayLatency:
    import redis

    from flows.replay.latency import REFERENCE, measure_latency

    if kind == "reference":
        return REFERENCE
    client = None if redis_url is None else redis.Redis.from_url(redis_url)
    try:
        with stderr.status("measuring prefill and tier loads"):
            return measure_latency(client, model)
    finally:
        if client is not None:
            client.close()
