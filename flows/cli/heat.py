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
from flows.cli.forecast import quiet_training

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


def _load_model(model: Path | None, tracking_uri: str) -> tuple[Any, dict[str, Any], str]:
    """A saved GAN file, else the registry's champion: (module, metadata, where from)."""
    from models.heat.gan import load_gan
    from models.heat.registry import MODEL_NAME, load_champion_gan

    if model is not None:
        if not model.is_file():
            raise CliError(f"--model {model}: no such file")
        try:
            module, meta = load_gan(model)
        except (OSError, RuntimeError, KeyError, TypeError) as err:
            raise CliError(f"--model {model}: not a saved heat GAN ({err})") from None
        return module, meta, str(model)
    try:
        module, meta, version = load_champion_gan(tracking_uri)
    except LookupError as err:
        raise CliError(str(err)) from None
    return module, meta, f"models:/{MODEL_NAME}@champion (version {version})"


def _one_tenant(demand: Any, tenant: str | None, where: str) -> str:
    """The tenant to simulate: the one asked for, or the only one there is. Never several at
    once: one tenant's plan must not be shaped by another's keys."""
    tenants = sorted(str(t) for t in demand["tenant"].unique())
    if not tenants:
        raise CliError(f"no {where}: run `preheat ingest` and `preheat features` first")
    if tenant is None:
        if len(tenants) > 1:
            raise CliError(f"{where} has several tenants ({', '.join(tenants)}): pick --tenant")
        return tenants[0]
    if tenant not in tenants:
        raise CliError(f"no tenant {tenant!r} in {where}; there are: {', '.join(tenants)}")
    return tenant


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
    from data_contracts.derived import read_demand
    from models.heat.registry import heat_panel
    from models.heat.simulate import Event, simulate, simulation_figure

    try:
        events = [Event.parse(text) for text in event or []]
    except ValueError as err:
        raise CliError(str(err)) from None
    module, meta, source = _load_model(model, settings.mlflow_uri)
    granularity = str(meta.get("granularity", "3min"))
    demand = read_demand(Path(settings.data_dir) / "features", granularity)
    tenant = _one_tenant(demand, tenant, f"{granularity} demand under {settings.data_dir}")
    demand = demand[demand["tenant"] == tenant]
    panel = heat_panel(demand, module.config.half_life_buckets, int(meta.get("top_k", 100)))
    try:
        result = simulate(module, panel.heat, panel.keys, paths, horizon, events, top_k, seed)
    except ValueError as err:
        raise CliError(str(err)) from None
    if plot is not None:
        plot.parent.mkdir(parents=True, exist_ok=True)
        simulation_figure(result).savefig(plot, dpi=100)
    width = panel.starts[1] - panel.starts[0] if len(panel.starts) > 1 else None
    output = {
        "model": source, "tenant": tenant, "granularity": granularity,
        "from_bucket": str(panel.starts[-1] + width) if width is not None else None,
        "keys": len(panel.keys), "paths": paths, "horizon": result.baseline.shape[2],
        "events": [{"at": e.at, "key": e.key, "delta": e.delta} for e in events],
        "sensitivity": result.summary, "plot": str(plot) if plot else None,
    }  # fmt: skip
    if as_json:
        write_json(output)
    else:
        _print_simulation(result.summary, len(panel.keys), paths, source)


def _print_simulation(summary: dict[str, Any], keys: int, paths: int, source: str) -> None:
    """The plan's top keys without and with the events, and what entered and left it."""
    stderr.print(f"simulated {keys} keys x {paths} paths with {source}")
    stderr.print(f"top {summary['top_k']} without events: {', '.join(summary['baseline_top'])}")
    stderr.print(
        f"top {summary['top_k']} with events:    {', '.join(summary['counterfactual_top'])}"
    )
    stderr.print(f"entered: {summary['entered'] or '-'}; left: {summary['left'] or '-'}; "
                 f"jaccard {summary['jaccard']}")  # fmt: skip
