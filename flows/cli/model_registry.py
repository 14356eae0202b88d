"""`preheat register llm`: put an LLM in the registry that warm-up, the gateway and
`deploy-models` load (`models:/preheat-llm@champion`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.common import CliError, ConfigOption, DataDirOption, settings_from, write_json

register = typer.Typer(help="Put models in the MLflow registry.", no_args_is_help=True)


@register.command("llm")
def register_llm_command(
    path: Annotated[
        Path | None,
        typer.Option(help="A local save_pretrained checkpoint (default: the tiny demo GPT-2)."),
    ] = None,
    config: ConfigOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Register an LLM as `preheat-llm`; it becomes `champion` when no version holds the alias
    (move the alias in the MLflow UI to promote a later one; nodes follow on `deploy-models`)."""
    from models.evaluation.demo_stages import register_tiny_llm
    from models.llm.registry import MODEL_NAME, register_llm

    settings = settings_from(config, data_dir)
    if path is not None and not (path / "config.json").is_file():
        raise CliError(f"--path {path}: not a saved model directory (no config.json)")
    if path is None:
        version = register_tiny_llm(
            settings.data_dir, settings.mlflow_uri, settings.mlflow_artifacts
        )
    else:
        version = register_llm(path, settings.mlflow_uri, settings.mlflow_artifacts)
    write_json({"model": MODEL_NAME, "version": version, "source": str(path or "tiny-gpt2")})
