"""`preheat train heat-gan` and `preheat simulate heat`: the heat-evolution simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    DataDirOption,
    JsonFlag,
    SeedOption,
    settings_from,
    stderr,
    write_json,
)
from models.training import quiet_training

simulate = typer.Typer(help="What-if simulations of the platform's models.", no_args_is_help=True)


def train_heat_gan_command(
    granularity: Annotated[str, typer.Option(help="Demand series to train on: 5s|3min|1h.")] = (
        "3min"
    ),
    top_k: Annotated[int, typer.Option("--top-k", help="Keys to learn from.", min=1)] = 100,
    horizon: Annotated[int, typer.Option(help="Buckets generated per step (T).", min=1)] = 6,
    epochs: Annotated[int, typer.Option(help="Training epochs.", min=1)] = 30,
    seed: SeedOption = 0,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Train the LSTM-GAN on the lake's demand, measure its realism, register, gate champion."""
    settings = settings_from(config, data_dir)
    quiet_training()
    from flows.heat.flow import train_heat_gan
    from models.heat.lake_training import TrainHeatGanParams

    try:
        params = TrainHeatGanParams(
            granularity=granularity, top_k=top_k, horizon=horizon, epochs=epochs, seed=seed
        )
        with stderr.status("training the heat GAN"):
            result = train_heat_gan(settings, params)
    except (LookupError, ValueError) as err:
        raise CliError(str(err)) from None
    if as_json:
        write_json(result)
        return
    verdict = "promoted to champion" if result["promoted"] else "not promoted"
    stderr.print(f"preheat-heat-gan v{result['version']}: {verdict}: {result['reason']}")


TenantOption = Annotated[
    str | None,
    typer.Option(help="Whose keys to simulate, one tenant at a time (needed when several)."),
]
EventOption = Annotated[
    list[str] | None,
    typer.Option(
        "--event",
        help="AT:KEY:DELTA — add DELTA x the key's recent peak heat at bucket AT (0 = next).",
    ),
]


@simulate.command("heat")
def simulate_heat_command(
    tenant: TenantOption = None,
    event: EventOption = None,
    paths: Annotated[int, typer.Option(help="Sample paths per key.", min=1, max=10_000)] = 64,
    horizon: Annotated[
        int | None, typer.Option(help="Buckets ahead (default: the model's T).", min=1)
    ] = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Warm-up plan size.", min=1)] = 10,
    model: Annotated[
        Path | None, typer.Option(help="A saved heat GAN file (default: the MLflow champion).")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the paths' figure here (PNG).")] = None,
    seed: Annotated[int, typer.Option(help="Noise seed (shared by baseline and events).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")] = False,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Simulate the tenant's key heat, with and without injected events; how the plan moves."""
    settings = settings_from(config, data_dir)
    quiet_training()
    from models.heat.simulate import Event, simulation_figure
    from models.heat.what_if import load_simulator, simulate_tenant

    try:
        events = [Event.parse(text) for text in event or []]
        module, meta, source = load_simulator(model, settings.mlflow_uri)
        result, facts = simulate_tenant(
            module, meta, settings.data_dir, tenant, events, paths, horizon, top_k, seed
        )
    except (LookupError, ValueError) as err:
        raise CliError(str(err)) from None
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        simulation_figure(result).savefig(plot, dpi=100)
    output = {"model": source, **facts, "plot": str(plot) if plot else None}
    if as_json:
        write_json(output)
    else:
        _print_simulation(result.summary, facts["keys"], paths, source)


def _print_simulation(summary: dict[str, Any], keys: int, paths: int, source: str) -> None:
    """The plan's top keys without and with the events, and what entered and left it."""
    stderr.print(f"simulated {keys} keys x {paths} paths with {source}")
    stderr.print(f"top {summary['top_k']} without events: {', '.join(summary['baseline_top'])}")
    stderr.print(
        f"top {summary['top_k']} with events:    {', '.join(summary['counterfactual_top'])}"
    )
    stderr.print(f"entered: {summary['entered'] or '-'}; left: {summary['left'] or '-'}; "
                 f"jaccard {summary['jaccard']}")  # fmt: skip
