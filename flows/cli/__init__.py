"""The `preheat` command line: the user interface and the measurement interface.

Conventions (DESIGN.md, "The CLI contract"): machine-readable output (`--json`) goes to stdout as
one JSON object; progress and human summaries go to stderr; a bad flag, file or format exits 2
with one line saying what is wrong. Heavy imports (Prefect, pandas) happen inside commands so
`preheat --help` stays fast.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer

from flows.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_QUARANTINED,
    CliError,
    ConfigOption,
    DataDirOption,
    stderr,
)
from flows.cli.common import settings_from as _settings
from flows.cli.forecast import bench_forecast_command, bench_hotset_command, train
from flows.cli.gateway import gateway_command
from flows.cli.heat import simulate
from flows.cli.model_registry import register
from flows.cli.replay import replay_command
from flows.cli.semantic import bench_semantic_command
from flows.cli.serve import serve_command, trigger_command
from flows.cli.templates import bench_templates_command
from flows.cli.warmup import warmup_command

if TYPE_CHECKING:
    import pandas as pd

app = typer.Typer(
    name="preheat",
    help="Predictive cache warm-up for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.command()
def ingest(
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

    settings = _settings(config, data_dir)
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
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
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


@app.command()
def features(config: ConfigOption = None, data_dir: DataDirOption = None) -> None:
    """Rebuild per-key demand series (5 s, 3 min, 1 h) from the lake; prints rows per scale."""
    settings = _settings(config, data_dir)
    from flows.features.flow import build_demand_task

    with stderr.status("building demand features"):
        rows = build_demand_task.fn(str(settings.data_dir))
    sys.stdout.write(orjson.dumps(rows).decode() + "\n")


@app.command("ingest-stream")
def ingest_stream(
    max_batches: Annotated[int | None, typer.Option(help="Stop after this many batches.")] = None,
    consumer: Annotated[str, typer.Option(help="Consumer name within the group.")] = "ingest-1",
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Drain the live request stream (settings.redis_url) into the lake; prints the totals."""
    settings = _settings(config, data_dir)
    if not settings.redis_url:
        raise CliError("ingest-stream needs PREHEAT_REDIS_URL (or redis_url in the config file)")
    import redis

    from data_contracts.lake import Lake
    from models.ingest.stream import StreamConsumer

    client = redis.Redis.from_url(settings.redis_url, socket_timeout=10, socket_connect_timeout=5)
    try:
        reader = StreamConsumer(
            client, Lake(settings.data_dir / "lake"), settings.request_stream, consumer
        )
        reader.ensure_group()
        totals = reader.drain(max_batches=max_batches)
    except redis.RedisError as err:
        raise CliError(f"redis at {settings.redis_url}: {err}") from None
    finally:
        client.close()
    sys.stdout.write(orjson.dumps(vars(totals)).decode() + "\n")


@app.command()
def demo(
    log: Annotated[
        Path | None, typer.Option(help="Your own request log instead of the generated one.")
    ] = None,
    days: Annotated[float, typer.Option(min=0.1, max=30, help="Days of generated traffic.")] = 2.0,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Run the whole pipeline on embedded defaults and print a summary."""
    settings = _settings(config, data_dir)
    from flows.demo import run_demo

    if log is not None and not log.is_file():
        raise CliError(f"{log}: no such file")
    run_demo(settings, log=log, days=days, console=stderr)


bench = typer.Typer(
    help="Measurements: each prints one JSON object to stdout.", no_args_is_help=True
)
app.add_typer(bench, name="bench")


def _parse_sizes(sizes: str) -> list[float]:
    try:
        values = [float(part) for part in sizes.split(",") if part.strip()]
    except ValueError:
        raise CliError(
            f"--sizes {sizes!r}: expected comma-separated fractions like 0.01,0.1"
        ) from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise CliError(f"--sizes {sizes!r}: every fraction must be in (0, 1]")
    return values


@bench.command("cache")
def bench_cache_command(
    trace: Annotated[Path, typer.Option(help="Trace file.")],
    format_name: Annotated[
        str, typer.Option("--format", help="mooncake|lirs|cache2k|oracle")
    ] = "mooncake",
    sizes: Annotated[
        str, typer.Option(help="Cache sizes as fractions of the unique objects.")
    ] = "0.01,0.05,0.1,0.2",
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")
    ] = True,
) -> None:
    """Replay a trace through the memory tier's policy and libCacheSim's, side by side."""
    from cache_runtime.traces import TraceError, load_trace
    from models.evaluation.bench.cache_bench import CacheSizeError, bench_cache

    fractions = _parse_sizes(sizes)
    try:
        loaded = load_trace(trace, format_name)
    except TraceError as err:
        raise CliError(str(err)) from None
    with stderr.status("replaying") as status:
        try:
            result = bench_cache(loaded, fractions, progress=lambda text: status.update(text))
        except CacheSizeError as err:  # checked before any replay
            raise CliError(f"--sizes: {err}") from None
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


@bench.command("runtime")
def bench_runtime_command(
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")
    ] = True,
    config: ConfigOption = None,
) -> None:
    """Tier costs: memory vs cachetools and dict, SSD latency, Redis vs redis-benchmark."""
    settings = _settings(config, None)
    from models.evaluation.bench.runtime_bench import bench_runtime

    with stderr.status("measuring tiers"):
        result = bench_runtime(settings.redis_url)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


@bench.command("kv")
def bench_kv_command(
    lengths: Annotated[
        str, typer.Option(help="Prompt lengths in tokens, comma-separated.")
    ] = "512,2048,8192",
    repeats: Annotated[int, typer.Option(help="Timed runs per way (the median is kept).")] = 3,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda when present).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")
    ] = True,
) -> None:
    """TTFT of a prompt: cold prefill vs its KV restored from memory, SSD and Redis."""
    try:
        values = [int(part) for part in lengths.split(",") if part.strip()]
    except ValueError:
        raise CliError(f"--lengths {lengths!r}: expected token counts like 512,2048") from None
    if device not in (None, "cpu", "cuda"):
        raise CliError(f"--device {device!r}: choose cpu or cuda")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda: no CUDA device is visible to torch")
    from models.evaluation.bench.kv_bench import bench_kv

    with stderr.status("prefilling and restoring"):
        try:
            result = bench_kv(values, repeats, device)
        except ValueError as err:  # bad lengths or repeats, checked before any model is built
            raise CliError(str(err)) from None
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


bench.command("forecast")(bench_forecast_command)
bench.command("hotset")(bench_hotset_command)
bench.command("templates")(bench_templates_command)
bench.command("semantic")(bench_semantic_command)
app.add_typer(train, name="train")
app.command("replay")(replay_command)
app.command("warmup")(warmup_command)
app.command("serve")(serve_command)
app.command("gateway")(gateway_command)
app.add_typer(register, name="register")
app.command("trigger")(trigger_command)

tune = typer.Typer(help="Online tuning of the platform's own parameters.", no_args_is_help=True)
app.add_typer(tune, name="tune")
app.add_typer(simulate, name="simulate")


@tune.command("decay")
def tune_decay_command(
    trace: Annotated[Path, typer.Option(help="Trace with timestamps (Mooncake).")],
    format_name: Annotated[str, typer.Option("--format", help="mooncake")] = "mooncake",
    rounds: Annotated[int, typer.Option(min=1, max=200, help="Bayesian-optimisation rounds.")] = 10,
    window: Annotated[
        int, typer.Option(min=10, help="The most recent N requests replayed.")
    ] = 2000,
    capacity: Annotated[
        float, typer.Option(min=0.001, max=1.0, help="Cache size, fraction of unique blocks.")
    ] = 0.1,
    grid: Annotated[int, typer.Option(min=2, max=500, help="Grid points for comparison.")] = 40,
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")
    ] = True,
) -> None:
    """Tune the heat decay's half-life by Bayesian optimisation over a replay of the trace, and
    the priority weight with it when the trace's requests have several priorities (the JSON's
    `priority_weight`; null, with a `priority_weight_note`, when they do not: Mooncake)."""
    from cache_runtime.traces import TraceError, load_trace
    from models.heat.tuning import tune_decay

    if format_name != "mooncake":
        raise CliError("tune decay needs per-request timestamps: --format mooncake")
    try:
        loaded = load_trace(trace, format_name).last_requests(window)
    except TraceError as err:
        raise CliError(str(err)) from None
    entries = max(1, round(capacity * loaded.unique))
    with stderr.status(f"tuning the decay over {rounds} rounds and a grid of {grid} half-lives"):
        result = tune_decay(
            loaded.accesses, loaded.request_starts, loaded.times, entries, rounds, grid,
            priorities=loaded.priorities,
        )  # fmt: skip
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


def main() -> None:
    """Entry point: every usage or input error becomes one line on stderr and exit code 2."""
    command = typer.main.get_command(app)
    try:
        result = command.main(standalone_mode=False, prog_name="preheat")
        code = result if isinstance(result, int) else 0
    except typer.Exit as done:
        code = done.exit_code
    except typer.TyperException as err:  # click's errors: bad flag, missing argument, bad value
        ctx = getattr(err, "ctx", None)
        if type(err).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())
            code = 0
        else:
            print(f"preheat: error: {err.format_message()}", file=sys.stderr)
            code = EXIT_BAD_INPUT
    except CliError as err:
        print(f"preheat: error: {err}", file=sys.stderr)
        code = err.code
    except (typer.Abort, KeyboardInterrupt):
        print("preheat: aborted", file=sys.stderr)
        code = 130
    sys.exit(code)
