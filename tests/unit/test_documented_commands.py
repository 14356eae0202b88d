"""Every `preheat ...` command the README and docs/ show still parses.

The commands are taken from fenced code blocks (```` ```bash ````, ```` ```sh ````,
```` ```console ```` and plain ```` ``` ````) of README.md and docs/**/*.md: each line that
starts with `preheat ` or `.venv/bin/preheat ` (a `$ ` prompt and `\\` continuations allowed).
For each, `preheat <subcommand path> --help` must exit 0, and every `--flag` the command uses
must appear in that help text, so a renamed subcommand or flag fails here, naming the command.
`--help` needs no services, so commands that need Redis, Prefect or a trace file pass too.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
from helpers import invoke_cli

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SHELL_BLOCKS = {"", "bash", "sh", "shell", "console"}
PREFIXES = ("preheat ", ".venv/bin/preheat ")


def documented_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_lines(text: str) -> list[str]:
    """The lines of the shell-like fenced blocks, continuations joined."""
    lines: list[str] = []
    fence: str | None = None
    shell = False
    pending = ""
    for raw in text.splitlines():
        opened = FENCE.match(raw)
        if fence is None:
            if opened:
                fence, shell = opened.group(1), opened.group(2).lower() in SHELL_BLOCKS
            continue
        if raw.strip().startswith(fence[0] * len(fence)) and not raw.strip().strip(fence[0]):
            fence, pending = None, ""
            continue
        if not shell:
            continue
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        lines.append(line)
    return lines


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for every documented `preheat` command line, in file order."""
    found: list[tuple[str, str]] = []
    for path in documented_files():
        for line in shell_lines(path.read_text(encoding="utf-8")):
            line = line.removeprefix("$ ").strip()
            if line.startswith(PREFIXES):
                found.append((str(path.relative_to(ROOT)), line))
    return found


COMMANDS = documented_commands()
COMMENT = re.compile(r"\s+#.*$")
IDS = [f"{where}: {COMMENT.sub('', command)}" for where, command in COMMANDS]


@functools.cache
def cli_tree() -> Any:
    """The `preheat` command tree (typer's click may be its own copy: no isinstance on it)."""
    from flows.cli import app

    return typer.main.get_command(app)


def split_command(line: str) -> tuple[list[str], list[str], list[str]]:
    """(subcommand path, flags used, leftover words after a group) of a documented line."""
    words = shlex.split(line, comments=True)[1:]  # after the `preheat` executable itself
    node = cli_tree()
    path: list[str] = []
    rest = list(words)
    while hasattr(node, "commands") and rest and not rest[0].startswith("-"):
        sub = node.commands.get(rest[0])
        if sub is None:
            break
        path.append(rest.pop(0))
        node = sub
    leftover = [w for w in rest if not w.startswith("-")] if hasattr(node, "commands") else []
    flags = sorted({w.split("=", 1)[0] for w in rest if w.startswith("--")})
    return path, flags, leftover


def test_docs_show_commands() -> None:
    where = {w for w, _ in COMMANDS}
    assert "README.md" in where, "README.md shows no `preheat` command in a shell block"
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=IDS)
def test_documented_command_parses(where: str, command: str, tmp_path: Path) -> None:
    path, flags, leftover = split_command(command)
    assert not leftover, f"{where}: `{command}`: no subcommand {leftover[0]!r}"
    done = invoke_cli(*path, "--help", cwd=tmp_path)
    shown = " ".join(["preheat", *path, "--help"])
    assert done.returncode == 0, f"{where}: `{shown}` exited {done.returncode}: {done.stderr}"
    missing = [
        flag
        for flag in flags
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout)
    ]
    assert not missing, f"{where}: `{command}`: {missing} not in `{shown}`"
