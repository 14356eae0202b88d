"""`preheat tune decay`: the heat decay's half-life (and priority weight) tuned on a trace.

The `tune` group lives here; the CLI's root adds it. The scheduled tuning on the lake is the
`tune-decay` flow (`flows.tuning.flow`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import CliError, JsonFlag, stderr, write_json

tune = typer.Typer(help="Online tuning of the platform's own parameters.", no_args_is_help=True)


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
    as_json: JsonFlag = True,
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
    write_json(result)
