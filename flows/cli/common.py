"""What every `preheat` command shares: the one-line error, stderr console, settings options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from cache_runtime.settings import Settings, load_settings

stderr = Console(stderr=True)

EXIT_BAD_INPUT = 2
EXIT_QUARANTINED = 3

ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="TOML settings file (else preheat.toml if present).")
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Override the data directory setting.")
]
# The measurement commands print JSON whatever `--json` says; the flag keeps their calls uniform.
JsonFlag = Annotated[bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")]
SeedOption = Annotated[int, typer.Option(help="Seed of the model's training.")]
TraceOption = Annotated[Path, typer.Option(help="Trace file.")]


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code attached."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def settings_from(config: Path | None, data_dir: Path | None) -> Settings:
    from flows.runtime_env import configure_runtime_env

    try:
        settings = load_settings(config, **({"data_dir": data_dir} if data_dir else {}))
    except FileNotFoundError as err:
        raise CliError(str(err)) from None
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        first = str(err).splitlines()
        raise CliError(f"invalid settings: {' '.join(first[:3])}") from None
    configure_runtime_env(settings)
    return settings


def write_json(result: dict[str, Any]) -> None:
    """The machine-readable result: one JSON object on stdout (progress went to stderr)."""
    import sys

    sys.stdout.write(orjson.dumps(result).decode() + "\n")
