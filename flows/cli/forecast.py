"""`preheat bench forecast`, `preheat bench hotset` and `preheat train forecaster`.

Kept apart from the CLI's root (`flows/cli/__init__.py`) so each file stays readable;
`flows.cli.bench` and `flows.cli.train` register these commands on their groups.
"""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    DataDirOption,
    JsonFlag,
    SeedOption,
    TraceOption,
    settings_from,
    stderr,
    write_json,
)
from models.training import quiet_training


def bench_forecast_command(
    trace: TraceOption,
    format_name: Annotated[str, typer.Option("--format", help="azure|mooncake|servegen|jsonl")],
    bucket: Annotated[int, typer.Option(help="Bucket width in seconds.", min=1)],
    horizon: Annotated[int, typer.Option(help="Buckets forecast from each origin.", min=1)] = 6,
    season: Annotated[
        int | None, typer.Option(help="Buckets per season (seasonal naive).", min=2)
    ] = None,
    test_frac: Annotated[
        float,
        typer.Option("--test-frac", help="Last share of buckets held out.", min=0.01, max=0.9),
    ] = 0.25,
    seed: SeedOption = 0,
    as_json: JsonFlag = True,
) -> None:
    """The total request series: preheat's choice next to the baselines, rolling origin."""
    quiet_training()
    from cache_runtime.traces import TraceError
    from models.evaluation.bench.forecast_bench import bench_forecast

    try:
        with stderr.status("forecasting") as status:
            result = bench_forecast(
                trace, format_name, bucket, horizon, season, test_frac, seed,
                progress=lambda text: status.update(text),
            )  # fmt: skip
    except TraceError as err:
        raise CliError(str(err)) from None
    write_json(result)


def bench_hotset_command(
    trace: TraceOption,
    format_name: Annotated[str, typer.Option("--format", help="mooncake")] = "mooncake",
    window: Annotated[float, typer.Option(help="Window in seconds.", min=1)] = 60.0,
    k: Annotated[int, typer.Option("--k", help="Keys predicted per window.", min=1)] = 50,
    seed: SeedOption = 0,
    as_json: JsonFlag = True,
) -> None:
    """Per key: predict from the past the K keys with the most requests in the next window."""
    quiet_training()
    from cache_runtime.traces import TraceError
    from models.evaluation.bench.hotset_bench import bench_hotset

    try:
        with stderr.status("ranking keys"):
            result = bench_hotset(trace, format_name, window, k, seed)
    except TraceError as err:
        raise CliError(str(err)) from None
    write_json(result)


def train_forecaster_command(
    granularity: Annotated[
        str, typer.Option(help="Demand series to train on: 5s|3min|1h.")
    ] = "3min",
    top_k: Annotated[int, typer.Option("--top-k", help="Keys forecast one by one.", min=1)] = 100,
    horizon: Annotated[int, typer.Option(help="Buckets ahead.", min=1)] = 6,
    epochs: Annotated[int, typer.Option(help="Training epochs.", min=1)] = 20,
    seed: SeedOption = 0,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Train on the lake's demand series, log to MLflow, register, gate the champion alias."""
    settings = settings_from(config, data_dir)
    quiet_training()
    from flows.forecast.flow import train_forecaster
    from models.forecast.lake_training import TrainForecasterParams

    try:
        params = TrainForecasterParams(
            granularity=granularity, top_k=top_k, horizon=horizon, epochs=epochs, seed=seed
        )
        result = train_forecaster(settings, params)
    except (LookupError, ValueError) as err:
        raise CliError(str(err)) from None
    if as_json:
        write_json(result)
        return
    verdict = "promoted to champion" if result["promoted"] else "not promoted"
    stderr.print(
        f"preheat-forecaster v{result['version']} ({result['chosen']}): {verdict}: "
        f"{result['reason']}"
    )
