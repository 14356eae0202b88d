"""The `preheat` command line: the user interface and the measurement interface.

Conventions (DESIGN.md, "The CLI contract"): machine-readable output (`--json`) goes to stdout as
one JSON object; progress and human summaries go to stderr; a bad flag, file or format exits 2
with one line saying what is wrong. Heavy imports (Prefect, pandas) happen inside commands so
`preheat --help` stays fast. Each command lives in a module of this package named after what it
does; this root makes the app, registers them in the order `preheat --help` lists them, and
turns every error into one line (`main`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from flows.cli.bench import bench
from flows.cli.common import EXIT_BAD_INPUT, CliError, ConfigOption, DataDirOption, stderr
from flows.cli.common import settings_from as _settings
from flows.cli.gateway import gateway_command
from flows.cli.heat import simulate
from flows.cli.ingest import features_command, ingest_command, ingest_stream_command
from flows.cli.model_registry import register
from flows.cli.replay import replay_command
from flows.cli.serve import serve_command, trigger_command
from flows.cli.train import train
from flows.cli.tune import tune
from flows.cli.warmup import warmup_command

app = typer.Typer(
    name="preheat",
    help="Predictive cache warm-up for LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command("ingest")(ingest_command)
app.command("features")(features_command)
app.command("ingest-stream")(ingest_stream_command)


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


app.add_typer(bench, name="bench")
app.add_typer(train, name="train")
app.command("replay")(replay_command)
app.command("warmup")(warmup_command)
app.command("serve")(serve_command)
app.command("gateway")(gateway_command)
app.add_typer(register, name="register")
app.command("trigger")(trigger_command)
app.add_typer(tune, name="tune")
app.add_typer(simulate, name="simulate")


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
