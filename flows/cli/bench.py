"""`preheat bench`: the measurement group, and its cache, runtime and KV commands.

Each prints one JSON object to stdout. The forecast, hotset, templates and semantic benches live
beside the code they share (`flows.cli.forecast`, `flows.cli.templates`, `flows.cli.semantic`)
and are registered on this group here; the CLI's root adds the group.
"""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    JsonFlag,
    TraceOption,
    settings_from,
    stderr,
    write_json,
)
from flows.cli.forecast import bench_forecast_command, bench_hotset_command
from flows.cli.semantic import bench_semantic_command
from flows.cli.templates import bench_templates_command

bench = typer.Typer(
    help="Measurements: each prints one JSON object to stdout.", no_args_is_help=True
)


@bench.command("cache")
def bench_cache_command(
    trace: TraceOption,
    format_name: Annotated[
        str, typer.Option("--format", help="mooncake|lirs|cache2k|oracle (plain, gzip, xz or zstd)")
    ] = "mooncake",
    sizes: Annotated[
        str, typer.Option(help="Cache sizes as fractions of the unique objects.")
    ] = "0.01,0.05,0.1,0.2",
    as_json: JsonFlag = True,
) -> None:
    """Replay a trace through the memory tier's policy and libCacheSim's, side by side."""
    from cache_runtime.traces import TraceError, load_trace
    from models.evaluation.bench.cache_bench import CacheSizeError, bench_cache, parse_sizes

    try:
        fractions = parse_sizes(sizes)
    except ValueError as err:
        raise CliError(str(err)) from None
    try:
        loaded = load_trace(trace, format_name)
    except TraceError as err:
        raise CliError(str(err)) from None
    with stderr.status("replaying") as status:
        try:
            result = bench_cache(loaded, fractions, progress=lambda text: status.update(text))
        except CacheSizeError as err:  # checked before any replay
            raise CliError(f"--sizes: {err}") from None
    write_json(result)


@bench.command("runtime")
def bench_runtime_command(
    as_json: JsonFlag = True,
    config: ConfigOption = None,
) -> None:
    """Tier costs: memory vs cachetools and dict, SSD latency, Redis vs redis-benchmark."""
    settings = settings_from(config, None)
    from models.evaluation.bench.runtime_bench import bench_runtime

    with stderr.status("measuring tiers"):
        result = bench_runtime(settings.redis_url)
    write_json(result)


@bench.command("kv")
def bench_kv_command(
    lengths: Annotated[
        str, typer.Option(help="Prompt lengths in tokens, comma-separated.")
    ] = "512,2048,8192",
    repeats: Annotated[int, typer.Option(help="Timed runs per way (the median is kept).")] = 3,
    device: Annotated[
        str | None, typer.Option(help="cpu or cuda (default: cuda when present).")
    ] = None,
    as_json: JsonFlag = True,
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
    write_json(result)


bench.command("forecast")(bench_forecast_command)
bench.command("hotset")(bench_hotset_command)
bench.command("templates")(bench_templates_command)
bench.command("semantic")(bench_semantic_command)
