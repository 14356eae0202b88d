"""`preheat bench templates` and `preheat train templates`.

Kept apart from the CLI's root (`flows/cli/__init__.py`) so each file stays readable;
`flows.cli.bench` and `flows.cli.train` register these commands on their groups.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import (
    CliError,
    ConfigOption,
    DataDirOption,
    JsonFlag,
    SeedOption,
    settings_from,
    stderr,
    write_json,
)

MethodOption = Annotated[
    str, typer.Option(help="Clustering of the constants: dbscan|hdbscan|flat|structure.")
]
EpsOption = Annotated[
    float, typer.Option(help="Cosine-distance radius for merging constants.", min=0.01, max=0.99)
]
SupportOption = Annotated[
    int, typer.Option("--min-support", help="Distinct prompts a template needs.", min=2)
]


def _quiet_embeddings() -> None:
    """One thread: MiniLM is small, and more threads only contend on a shared machine."""
    import torch

    torch.set_num_threads(1)


def bench_templates_command(
    prompts: Annotated[Path, typer.Option(help="Prompt file (CSV or JSONL).")],
    text_field: Annotated[str, typer.Option("--text-field", help="Field holding the prompt.")],
    format_name: Annotated[
        str | None, typer.Option("--format", help="csv|jsonl (default: from the suffix).")
    ] = None,
    label_field: Annotated[
        str | None,
        typer.Option("--label-field", help="Ground-truth template; empty or -1 = one-off."),
    ] = None,
    method: MethodOption = "dbscan",
    eps: EpsOption = 0.35,
    min_support: SupportOption = 5,
    seed: SeedOption = 0,
    as_json: JsonFlag = True,
) -> None:
    """Mine the file's templates; coverage and silhouette, ARI and NMI against labels."""
    _quiet_embeddings()
    from models.evaluation.bench.templates_bench import PromptFileError, bench_templates
    from models.templates.mining import MiningConfig

    try:
        config = MiningConfig(min_support=min_support, eps=eps, method=method)
        with stderr.status("mining templates"):
            result = bench_templates(
                prompts, format_name, text_field, label_field, config, seed=seed
            )
    except (PromptFileError, ValueError) as err:
        raise CliError(str(err)) from None
    write_json(result)


def train_templates_command(
    method: MethodOption = "dbscan",
    eps: EpsOption = 0.35,
    min_support: SupportOption = 5,
    top_k: Annotated[int, typer.Option("--top-k", help="Templates per tenant logged.", min=1)] = 20,
    seed: SeedOption = 0,
    as_json: JsonFlag = False,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Mine each tenant's templates from the lake, write the table, log the run to MLflow."""
    settings = settings_from(config, data_dir)
    _quiet_embeddings()
    from flows.templates.flow import MineTemplatesParams, mine_templates_now

    try:
        params = MineTemplatesParams(
            min_support=min_support, eps=eps, method=method, top_k=top_k, seed=seed
        )
        result = mine_templates_now(settings, params)
    except (LookupError, ValueError) as err:
        raise CliError(str(err)) from None
    if as_json:
        write_json(result)
        return
    for tenant, metrics in result["tenants"].items():
        stderr.print(
            f"{tenant}: {metrics['templates']} templates, coverage {metrics['coverage']:.3f} "
            f"of {metrics['prompts']} prompts"
        )
    stderr.print(f"wrote {result['path']} (MLflow run {result['run_id']})")
