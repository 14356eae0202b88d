"""What the benchmark scripts share: where they find `../shared/data` (the real traces and
prompts, read by path, never copied into the project), and a parser whose errors are one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

DEFAULT_SHARED_DATA = Path(__file__).parents[3] / ".." / "shared" / "data"  # beside the checkout


def add_shared_argument(parser: argparse.ArgumentParser) -> None:
    """`--shared DIR`, by default the `shared/data` beside the project checkout."""
    parser.add_argument(
        "--shared", type=Path, default=DEFAULT_SHARED_DATA, help="the shared data directory"
    )


class OneLineParser(argparse.ArgumentParser):
    """argparse prints its usage before the error; the benchmark scripts promise one line,
    `<prog>: <what is wrong>`, and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)
