"""`preheat replay`: the A/B replay of a trace against the hybrid cache (issues 7 and 22).

One run is one comparison: warm-up off, the restore reference and (with `--warmup on`, or a
report) warm-up on, all priced by one latency model, chosen or measured once before the arms
run — arms from separate runs compare only through a pinned model (`--latency FILE`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.cli.common import CliError, ConfigOption, settings_from, stderr, write_json

if TYPE_CHECKING:
    from cache_runtime.traces import AccessTrace
    from models.evaluation.replay.engine import ReplayConfig
    from models.evaluation.replay.latency import ReplayLatency

LATENCY_HELP = (
    "reference (a 7-8B model on one data-centre GPU per server) | measured (this machine, the "
    "configured model) | a JSON file: a model pinned by an earlier run (its JSON output, or its "
    "latency_model object), so runs compare against the same engine"
)


REAL_TIERS_HELP = (
    "Run the real SSD and Redis tiers (slow), not the exact in-memory simulations of their "
    "policies (the default)."
)

LoadOption = Annotated[
    str,
    typer.Option(metavar="X", help="Multiply the trace's arrival rate by X (positive; 2: twice)."),
]
ServersOption = Annotated[
    int | None, typer.Option(help="Prefill servers (GPUs) of the engine; default: the model's.")
]
RealTiersOption = Annotated[bool, typer.Option("--real-tiers", help=REAL_TIERS_HELP)]
ReportOption = Annotated[
    Path | None,
    typer.Option(help="Write an HTML report with plots here (replays all arms), log to MLflow."),
]
PrecisionOption = Annotated[
    float, typer.Option(help="Expected warm-up precision each plan is cut to (0: no cut).")
]


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
    latency: Annotated[str, typer.Option(help=LATENCY_HELP)] = "measured",
    load: LoadOption = "1",
    servers: ServersOption = None,
    real_tiers: RealTiersOption = False,
    model: Annotated[
        Path | None, typer.Option(help="Local checkpoint whose prefill is measured.")
    ] = None,
    report: ReportOption = None,
    target_precision: PrecisionOption = 0.6,
    as_json: Annotated[bool, typer.Option("--json", help="Accepted; output is JSON.")] = True,
    config: ConfigOption = None,
) -> None:
    """Replay in trace time with restarts; warm-up on or off; the restore reference beside it."""
    settings = settings_from(config, None)
    from cache_runtime.traces import TraceError, load_trace
    from models.evaluation.replay.engine import ReplayConfig
    from models.evaluation.replay.latency import pinned_latency

    if warmup not in ("on", "off"):
        raise CliError(f"--warmup {warmup!r}: choose on or off")
    if model is not None and not model.is_dir():
        raise CliError(f"--model {model}: no such checkpoint directory")
    try:
        pinned = pinned_latency(latency, servers)
        replay_config = ReplayConfig(
            memory=memory, ssd=ssd, redis=redis, restart_every_s=restart_every,
            window_s=window, warmup=warmup == "on",
            target_precision=target_precision if target_precision != 0 else None,
            real_tiers=real_tiers, load=_positive_factor(load),
            policy=settings.policy.model_dump(),  # the pool a node under these settings runs
        )  # fmt: skip
        loaded = load_trace(trace, format_name)
    except (ValueError, TraceError) as err:
        raise CliError(str(err)) from None
    if loaded.times is None:
        raise CliError(f"{trace}: {format_name} traces carry no timestamps; replay needs them")
    measure = partial(_measured, model, servers=servers)  # called only when nothing is pinned
    result = _with_redis(loaded, replay_config, pinned, measure, report)
    if report is not None:
        from models.evaluation.replay.report import log_report

        result["mlflow_run_id"] = log_report(
            report, result.pop("_summaries"), settings.mlflow_uri, settings.mlflow_artifacts
        )
    write_json(result)


def _with_redis(
    loaded: AccessTrace, config: ReplayConfig, pinned: ReplayLatency | None,
    measure: Callable[[str | None], ReplayLatency], report: Path | None,
) -> dict[str, Any]:  # fmt: skip
    """`_replay` with a Redis only where one is used: the real shared tier, or measuring its
    load (`measure`, when no model is `pinned`). Always a private server: the replay empties
    and caps the Redis it uses."""
    from cache_runtime.services import RedisHandle

    if config.redis > 0 and (config.real_tiers or pinned is None):
        with RedisHandle(None) as redis_url:
            chosen = pinned or measure(redis_url)
            return _replay(loaded, config, chosen, redis_url, report)
    return _replay(loaded, config, pinned or measure(None), None, report)


def _positive_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"--load {text!r}: a positive factor of the arrival rate (2: twice)")
    return value


def _measured(model: Path | None, redis_url: str | None, servers: int | None) -> ReplayLatency:
    """The model measured once on this machine, for every arm of the comparison."""
    import redis

    from models.evaluation.replay.latency import REFERENCE_SERVERS, measure_latency

    client = None if redis_url is None else redis.Redis.from_url(redis_url)
    try:
        with stderr.status("measuring prefill and tier loads"):
            return measure_latency(client, model, servers=servers or REFERENCE_SERVERS)
    finally:
        if client is not None:
            client.close()


def _replay(
    loaded: AccessTrace, config: ReplayConfig, latency: ReplayLatency, redis_url: str | None,
    report: Path | None,
) -> dict[str, Any]:  # fmt: skip
    """The comparison's JSON for the asked arm; with a report, every arm's summary too."""
    from models.evaluation.replay.engine import replay_comparison, summarize

    both = report is not None  # the report draws warm-up off and on
    arms = 3 if config.warmup or both else 2
    tiers = "real" if config.real_tiers else "simulated"
    what = (
        f"{len(loaded.request_starts)} requests x {arms} arms, {tiers} tiers, load {config.load:g}x"
    )
    with stderr.status(f"replaying {what}"):
        results, times = replay_comparison(loaded, config, latency, redis_url, both)
    asked = "on" if config.warmup else "off"
    result = summarize(results, asked, times, config, latency)
    if report is None:
        return result
    from models.evaluation.replay.report import report_comparison

    path, summaries = report_comparison(report, results, times, config, latency, result)
    stderr.print(f"report: {path}")
    return {**result, "report": str(path), "_summaries": summaries}
