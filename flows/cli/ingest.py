"""`preheat ingest`, `preheat ingest-stream` and `preheat features`: logs into the lake, demand out.

Kept apart from the CLI's root (`flows/cli/__init__.py`), which registers these commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from flows.cli.common import (
    EXIT_QUARANTINED,
    CliError,
    ConfigOption,
    DataDirOption,
    settings_from,
    stderr,
    write_json,
)

if TYPE_CHECKING:
    import pandas as pd


def ingest_command(
    paths: Annotated[list[Path], typer.Argument(help="Log files: JSONL, CSV or Parquet.")],
    format_name: Annotated[
        str, typer.Option("--format", help="auto|jsonl|mooncake|azure|servegen|prompts")
    ] = "auto",
    tenant: Annotated[str, typer.Option(help="Tenant for rows that do not name one.")] = "default",
    epoch: Annotated[
        str | None, typer.Option(help="Start time for traces with relative timestamps (ISO 8601).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object to stdout.")
    ] = False,
    strict: Annotated[bool, typer.Option(help="Exit 3 when any row was quarantined.")] = False,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Validate log files into the lake; bad rows go to quarantine with their reason."""
    from models.ingest.detect import FORMAT_NAMES, resolve_format
    from models.ingest.readers import InputError

    settings = settings_from(config, data_dir)
    if format_name not in FORMAT_NAMES:
        raise CliError(f"unknown --format {format_name!r}; choose one of {', '.join(FORMAT_NAMES)}")
    try:
        for path in paths:  # check every file before ingesting any: all or nothing on bad input
            resolve_format(path, format_name)
    except InputError as err:
        raise CliError(str(err)) from None
    stamp = _parse_epoch(epoch)
    summary = _run_ingest(paths, settings.data_dir, format_name, tenant, stamp)
    if as_json:
        write_json(summary)
    else:
        _print_ingest_summary(summary)
    if summary["quarantined"]:
        stderr.print(
            f"warning: {summary['quarantined']} rows quarantined "
            f"(see {settings.data_dir / 'lake' / 'quarantine'})"
        )
        if strict:
            raise typer.Exit(EXIT_QUARANTINED)


def _parse_epoch(epoch: str | None) -> pd.Timestamp | None:
    import pandas as pd

    if epoch is None:
        return None
    try:
        stamp = pd.Timestamp(epoch)
    except ValueError:
        raise CliError(f"--epoch {epoch!r} is not an ISO 8601 time") from None
    return stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")


def _run_ingest(
    paths: list[Path],
    data_dir: Path,
    format_name: str,
    tenant: str,
    epoch: pd.Timestamp | None,
) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from data_contracts.lake import Lake
    from models.ingest.pipeline import FileReport, ingest_file
    from models.ingest.readers import InputError

    started = time.perf_counter()
    lake = Lake(Path(data_dir) / "lake")
    reports = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[rows]} rows"),
    )
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True) as progress:
        for path in paths:
            # Rows per file are unknown until read: an indeterminate bar with a live row count.
            job = progress.add_task(path.name, total=None, rows=0)

            def on_chunk(report: FileReport, job: TaskID = job) -> None:
                progress.update(job, rows=report.read)

            try:
                report = ingest_file(path, lake, format_name, tenant, epoch, on_chunk=on_chunk)
            except InputError as err:
                raise CliError(str(err)) from None
            progress.update(job, total=1, completed=1)
            reports.append(report.to_dict())
    totals = {
        k: sum(int(r[k]) for r in reports)
        for k in ("read", "accepted", "quarantined", "duplicates", "written")
    }
    return {"files": reports, **totals, "seconds": round(time.perf_counter() - started, 3)}


def _print_ingest_summary(summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="ingested", title_justify="left")
    for column in ("file", "format", "read", "accepted", "quarantined", "new", "seconds"):
        table.add_column(column, justify="right" if column not in ("file", "format") else "left")
    for r in summary["files"]:
        table.add_row(
            Path(r["path"]).name, r["format"], str(r["read"]), str(r["accepted"]),
            str(r["quarantined"]), str(r["written"]), f"{r['seconds']:.2f}",
        )  # fmt: skip
    stderr.print(table)


def features_command(config: ConfigOption = None, data_dir: DataDirOption = None) -> None:
    """Rebuild per-key demand series (5 s, 3 min, 1 h) from the lake; prints rows per scale."""
    settings = settings_from(config, data_dir)
    from flows.features.flow import build_demand_task

    with stderr.status("building demand features"):
        rows = build_demand_task.fn(str(settings.data_dir))
    write_json(rows)


def ingest_stream_command(
    max_batches: Annotated[int | None, typer.Option(help="Stop after this many batches.")] = None,
    consumer: Annotated[str, typer.Option(help="Consumer name within the group.")] = "ingest-1",
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Drain the live request stream (settings.redis_url) into the lake; prints the totals."""
    settings = settings_from(config, data_dir)
    if not settings.redis_url:
        raise CliError("ingest-stream needs PREHEAT_REDIS_URL (or redis_url in the config file)")
    import redis

    from data_contracts.lake import Lake
    from models.ingest.stream import drain_into_lake

    lake = Lake(settings.data_dir / "lake")
    try:
        totals = drain_into_lake(
            settings.redis_url, lake, settings.request_stream, consumer, max_batches=max_batches
        )
    except redis.RedisError as err:
        raise CliError(f"redis at {settings.redis_url}: {err}") from None
    write_json(vars(totals))
