"""`preheat warmup`: plan one warm-up from the lake, the features and the champion, and warm it.

Kept apart from the CLI's root `flows/cli/__init__.py` (which registers the command). Planning is
shared with the flow `warmup` (`models.warmup.prepare`); execution runs the flow's batches in this
process, one after another (`models.warmup.run.warm_locally`, no Prefect API to start), resumable
from the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    DataDirOption,
    settings_from,
    stderr,
    write_json,
)

if TYPE_CHECKING:
    from cache_runtime.settings import Settings
    from models.warmup.plan import Budgets
    from models.warmup.prepare import PreparedPlan

ComputeOption = Annotated[
    float, typer.Option("--compute-s", min=0, help="GPU/CPU seconds to spend warming.")
]
DeadlineOption = Annotated[
    float, typer.Option("--deadline-s", min=0, help="Everything finishes within this.")
]
GranularityOption = Annotated[
    str, typer.Option(help="Demand series for the forecaster and the heat fallback.")
]
PrefillOption = Annotated[
    float, typer.Option("--prefill-ms-per-token", min=1e-6, help="Measured prefill cost.")
]


def warmup_command(
    plan_only: Annotated[
        bool, typer.Option("--plan-only", help="Print the plan; warm nothing.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the plan (or the run) as one JSON object.")
    ] = False,
    memory_mb: Annotated[float, typer.Option("--memory-mb", min=0, help="Memory tier, MB.")] = 256,
    ssd_mb: Annotated[float, typer.Option("--ssd-mb", min=0, help="SSD tier, MB.")] = 2048,
    redis_mb: Annotated[float, typer.Option("--redis-mb", min=0, help="Redis tier, MB.")] = 0,
    compute_s: ComputeOption = 60,
    deadline_s: DeadlineOption = 120,
    granularity: GranularityOption = "3min",
    prefill_ms_per_token: PrefillOption = 0.35,
    top_excluded: Annotated[
        int, typer.Option("--top-excluded", min=0, help="Left-out items explained.")
    ] = 20,
    backend: Annotated[
        str, typer.Option(help="hf (local or registered model), openai, null.")
    ] = "hf",
    model_path: Annotated[
        Path | None, typer.Option("--model-path", help="HF model directory (else the registry).")
    ] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", help="OpenAI server.")] = None,
    model_name: Annotated[str | None, typer.Option("--model-name", help="Served model.")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Items a batch.")] = 32,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Plan a warm-up (what to warm, into which tier, in which order, and why) and warm it."""
    settings = settings_from(config, data_dir)
    from models.warmup.explain import print_plan
    from models.warmup.plan import Budgets
    from models.warmup.prepare import PlanOptions, plan_from_lake

    budgets = Budgets.from_mb(memory_mb, ssd_mb, redis_mb, compute_s, deadline_s)
    try:
        options = PlanOptions(budgets, granularity, prefill_ms_per_token / 1000, top_excluded)
        with stderr.status("planning (champion forecaster, candidates, plan)"):
            prepared = plan_from_lake(settings.data_dir, settings.mlflow_uri, options)
    except (LookupError, ValueError) as err:
        raise CliError(str(err)) from None
    if plan_only and as_json:
        write_json(prepared.result.to_json())
    elif plan_only:
        print_plan(prepared.result, stderr)
    else:
        _warm(prepared, settings, budgets, (backend, model_path, base_url, model_name), batch_size,
              as_json)  # fmt: skip


def _warm(
    prepared: PreparedPlan,
    settings: Settings,
    budgets: Budgets,
    choice: tuple[str, Path | None, str | None, str | None],
    batch_size: int,
    as_json: bool,
) -> None:
    """Warm the plan in this process; the run's summary (the plan's under "plan") to stdout."""
    from models.warmup.execute import resolve_items
    from models.warmup.run import BackendSpec, NodeResources, open_job, warm_locally

    kind, model_path, base_url, model_name = choice
    try:
        path = str(model_path) if model_path else None
        backend = BackendSpec(kind, path, settings.mlflow_uri, base_url, model_name)
        resources = NodeResources.for_budgets(
            backend, str(settings.data_dir), settings.redis_url, budgets
        )
        items = resolve_items(prepared.result.plan, prepared.recent)
        with stderr.status(f"warming {len(items)} items"):
            summary = warm_locally(open_job(items, resources), batch_size)
    except (LookupError, ValueError, FileNotFoundError) as err:
        raise CliError(str(err)) from None
    stderr.print(
        f"warm-up {summary['plan_id']}: {summary['done']} done, {summary['skipped_already_done']}"
        f" already done, {summary['failed']} failed, {summary['unresolved']} unresolved"
    )
    if as_json:
        write_json({**summary, "plan": prepared.summary})
    if summary["failed"]:
        raise CliError(f"{summary['failed']} items failed: run again to resume them", code=1)
