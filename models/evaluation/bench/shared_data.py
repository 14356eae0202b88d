"""Where the benchmark scripts find `../shared/data`: the real traces and prompts, read by path
(never copied into the project)."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_SHARED_DATA = Path(__file__).parents[3] / ".." / "shared" / "data"  # beside the checkout


def add_shared_argument(parser: argparse.ArgumentParser) -> None:
    """`--shared DIR`, by default the `shared/data` beside the project checkout."""
    parser.add_argument(
        "--shared", type=Path, default=DEFAULT_SHARED_DATA, help="the shared data directory"
    )
