"""`preheat warmup --plan-only`: plan one warm-up from the lake, the features and the champion.

Kept apart from `flows/cli.py` (which registers the command). Executing a plan (prefill, store)
is not wired yet: without `--plan-only` the command refuses with one line rather than pretend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.cli_common import (
    CliError,
    ConfigOption,
    DataDirOption,
    settings_from,
    stderr,
    write_json,
)

if TYPE_CHECKING:
    import pandas as pd

    from flows.warmup.plan import PlanResult

MB = 1_000_000
SHOWN_ROWS = 30


def warmup_command(
    plan_only: Annotated[
        bool, typer.Option("--plan-only", help="Print the plan; warm nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan as one JSON object to stdout.")
    ] = False,
    memory_mb: Annotated[float, typer.Option("--memory-mb", min=0, help="Memory tier, MB.")] = 256,
    ssd_mb: Annotated[float, typer.Option("--ssd-mb", min=0, help="SSD tier, MB.")] = 2048,
    redis_mb: Annotated[float, typer.Option("--redis-mb", min=0, help="Redis tier, MB.")] = 0,
    compute_s: Annotated[
        float, typer.Option("--compute-s", min=0, help="GPU/CPU seconds to spend warming.")
    ] = 60,
    deadline_s: Annotated[
        float, typer.Option("--deadline-s", min=0, help="Everything finishes within this.")
    ] = 120,
    granularity: Annotated[
        str, typer.Option(help="Demand series for the forecaster and the heat fallback.")
    ] = "3min",
    prefill_ms_per_token: Annotated[
        float, typer.Option("--prefill-ms-per-token", min=1e-6, help="Measured prefill cost.")
    ] = 0.35,
    top_excluded: Annotated[
        int, typer.Option("--top-excluded", min=0, help="Left-out items explained.")
    ] = 20,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Plan a warm-up: what to warm, into which tier, in which order, and why."""
    if not plan_only:
        raise CliError("execution is not available yet: use --plan-only")
    settings = settings_from(config, data_dir)
    from data_contracts import GRANULARITIES
    from flows.warmup.plan import Budgets, CostModel, build_candidates, plan_warmup

    if granularity not in GRANULARITIES:
        raise CliError(f"--granularity {granularity!r}: choose one of {', '.join(GRANULARITIES)}")
    budgets = Budgets(
        memory_bytes=int(memory_mb * MB),
        ssd_bytes=int(ssd_mb * MB),
        redis_bytes=int(redis_mb * MB),
        compute_s=compute_s,
        deadline_s=deadline_s,
    )
    requests = _read_requests(settings.data_dir)
    with stderr.status("loading the champion forecaster"):
        forecast, demand, forecaster = _forecast(
            settings.data_dir, settings.mlflow_uri, granularity
        )
    with stderr.status("planning"):
        costs = CostModel(prefill_s_per_token=prefill_ms_per_token / 1000)
        candidates = build_candidates(requests, forecast, demand, costs)
        result = plan_warmup(candidates, budgets, top_excluded)
    output = result.to_json()
    summary = output["summary"]
    summary["forecaster"] = forecaster.get("model")
    if forecaster.get("fallback"):
        note = summary["fallback"]
        summary["fallback"] = forecaster["fallback"] + (f"; {note}" if note else "")
    if as_json:
        write_json(output)
    else:
        _print_plan(result)


def _read_requests(data_dir: Path) -> pd.DataFrame:
    from flows.ingest.flow import lake_of
    from flows.warmup.candidates import REQUEST_COLUMNS

    if not (Path(data_dir) / "lake").is_dir():
        raise CliError(f"no lake under {data_dir}: run `preheat ingest` first")
    requests = lake_of(data_dir).read("requests", columns=list(REQUEST_COLUMNS))
    if requests.empty:
        raise CliError(f"the lake under {data_dir} holds no requests: run `preheat ingest` first")
    return requests


def _forecast(
    data_dir: Path, mlflow_uri: str, granularity: str
) -> tuple[pd.DataFrame | None, pd.DataFrame, dict[str, Any]]:
    """(forecast or None, the demand series used, {"model"} or {"fallback": why not}).

    The champion reads the granularity it was trained on, whatever `granularity` says. A store
    that does not exist yet holds no champion: it is not created just to find that out.
    """
    from data_contracts.derived import read_demand

    features = Path(data_dir) / "features"
    demand = read_demand(features, granularity)
    if _missing_sqlite_store(mlflow_uri):
        return None, demand, {"fallback": f"no MLflow store at {mlflow_uri}, so no forecaster"}
    from models.forecast.registry import load_champion

    try:
        champion = load_champion(mlflow_uri)
    except LookupError as err:
        return None, demand, {"fallback": str(err)}
    trained_on = str(champion.meta.get("granularity", granularity))
    if trained_on != granularity:
        demand = read_demand(features, trained_on)
    if demand.empty:
        why = f"no {trained_on} demand features: run `preheat features`"
        return None, demand, {"fallback": why}
    try:
        forecast = champion.predict_per_key(demand)
    except ValueError as err:  # e.g. less history than the model reads
        return None, demand, {"fallback": f"{champion.name} v{champion.version} failed: {err}"}
    return forecast, demand, {"model": f"{champion.name} v{champion.version}"}


def _missing_sqlite_store(uri: str) -> bool:
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()


def _print_plan(result: PlanResult) -> None:
    """A table of the first rows (the reason column carries score, tier and timing)."""
    from rich.table import Table

    summary = result.summary
    title = f"warm-up plan: {summary['planned']} of {summary['candidates']} candidates"
    table = Table(title=title, title_justify="left")
    for column in ("order", "tier", "item", "finish_s", "reason"):
        table.add_column(column, overflow="fold", ratio=3 if column == "reason" else None)
    for row in result.plan.head(SHOWN_ROWS).itertuples(index=False):
        table.add_row(str(row.order), row.tier, row.item, f"{row.finish_s:.2f}", row.reason)
    stderr.print(table)
    tiers = ", ".join(
        f"{name} {t['items']} items / {t['bytes'] / MB:.1f} MB"
        for name, t in summary["tiers"].items()
    )
    stderr.print(
        f"{tiers}; compute {summary['compute_s']:.2f} s; "
        f"saves {summary['total_score_s']:.1f} s of latency"
    )
    if summary.get("fallback"):
        stderr.print(f"fallback: {summary['fallback']}")
    for row in result.excluded.head(5).itertuples(index=False):
        stderr.print(f"left out {row.item}: {row.reason}")
