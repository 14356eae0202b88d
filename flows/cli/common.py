"""What every `preheat` command shares: the one-line error, stderr console, settings options."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from pydantic_settings import EnvSettingsSource, SettingsError
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
    except SettingsError as err:  # an environment value that is not JSON where JSON is due
        raise CliError(f"invalid settings: {err}{_unparsed_environment(str(err))}") from None
    except ValueError as err:  # pydantic's ValidationError is a ValueError
        first = str(err).splitlines()
        raise CliError(f"invalid settings: {' '.join(first[:3])}") from None
    configure_runtime_env(settings)
    return settings


def _unparsed_environment(message: str) -> str:
    """Which `PREHEAT_` variables pydantic-settings could not parse, for its message that names
    only the field (`error parsing value for field "policy" ...`): a variable that sets a list
    or a table (`PREHEAT_POLICY__POOL`, `PREHEAT_SERVE`) is JSON, and these are not."""
    field = re.search(r'field "(\w+)"', message)
    if field is None:
        return ""
    prefix = f"PREHEAT_{field.group(1).upper()}"
    names = sorted(
        name
        for name, value in os.environ.items()
        if name.upper() == prefix or name.upper().startswith(prefix + "__")
        if _sets_a_collection(name.upper().removeprefix("PREHEAT_").split("__"))
        and not _is_json(value)
    )
    if not names:
        return ""
    example = 'PREHEAT_POLICY__POOL=\'["lru", "mq"]\''
    return f" ({', '.join(names)}: lists and tables set in the environment are JSON, as {example})"


def _sets_a_collection(path: list[str]) -> bool:
    """Whether the settings field at `path` (upper-case names, nested tables first) is one
    pydantic-settings reads from the environment as JSON (its own `field_is_complex`)."""
    source = EnvSettingsSource(Settings)
    model: Any = Settings
    field = None
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not isinstance(fields, dict):
            return False
        name = next((n for n in fields if n.upper() == part), None)
        if name is None:
            return False
        field = fields[name]
        model = field.annotation
    return field is not None and source.field_is_complex(field)


def _is_json(text: str) -> bool:
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def write_json(result: dict[str, Any]) -> None:
    """The machine-readable result: one JSON object on stdout (progress went to stderr)."""
    import sys

    sys.stdout.write(orjson.dumps(result).decode() + "\n")
