"""`preheat bench semantic`: registered on the `bench` group by `flows/cli/__init__.py`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import CliError, stderr, write_json


def bench_semantic_command(
    pairs: Annotated[
        Path, typer.Option(help='JSON list or JSONL of {"text_a", "text_b", "label": 0|1}.')
    ],
    target_fhr: Annotated[
        float,
        typer.Option("--target-fhr", help="False-hit rate to calibrate to.", min=1e-4, max=0.5),
    ] = 0.01,
    seed: Annotated[int, typer.Option(help="Seed of the calibration / evaluation split.")] = 0,
    guard_pairs: Annotated[
        Path | None,
        typer.Option("--guard-pairs", help="Guard pairs file (default: generated from --prompts)."),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help="Shipped prompts directory the guard set is built from."),
    ] = None,
    gptcache: Annotated[bool, typer.Option(help="Also measure GPTCache.")] = True,
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for symmetry; output is JSON.")
    ] = True,
) -> None:
    """Calibrated semantic hits on labelled pairs: preheat (SimHash buckets, cosine, guards) next
    to GPTCache (faiss, SearchDistanceEvaluation) at its calibrated and fixed thresholds."""
    from models.evaluation.bench.semantic_bench import bench_semantic
    from models.templates.pairs import build_guard_pairs, load_corpus, read_pairs
    from models.templates.substitutions import build_substitution_pairs
    from models.templates.workload import default_prompts_dir

    try:
        labelled = read_pairs(pairs)
        guards = read_pairs(guard_pairs) if guard_pairs is not None else None
    except FileNotFoundError as err:
        raise CliError(f"{err.filename}: no such file") from None
    except ValueError as err:
        raise CliError(str(err)) from None
    source = prompts if prompts is not None else default_prompts_dir()
    if prompts is not None and not prompts.is_dir():
        raise CliError(f"--prompts {prompts}: not a directory")
    corpus = load_corpus(source if source.is_dir() else None)
    if guards is None:
        guards = build_guard_pairs(corpus, seed=seed)
    substitutions = build_substitution_pairs(corpus, seed=seed)
    import torch

    torch.set_num_threads(1)
    try:
        with stderr.status("semantic bench") as status:
            result = bench_semantic(
                labelled, target_fhr, seed, guards,
                progress=lambda text: status.update(text), with_gptcache=gptcache,
                substitution_pairs=substitutions,
            )  # fmt: skip
    except ValueError as err:
        raise CliError(str(err)) from None
    write_json(result)
