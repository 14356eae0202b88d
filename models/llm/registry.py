"""The serving LLM in MLflow: log a saved Hugging Face directory, register it, fetch it by alias.

The model is an MLflow pyfunc whose artifact is the `save_pretrained` directory itself (weights,
config, tokenizer), so the registry holds exactly the files `HFBackend.from_path` loads, and
`predict` serves completions for anyone who loads it as a plain pyfunc. Rejected: MLflow's
transformers flavor — it is built around pipelines, documents support up to transformers 4.x,
and would re-save the weights in its own layout that the KV-page code never sees.

The alias `champion` is set on the first version only; moving it later is a promotion decision
(a gate, as for the forecaster) that this module does not make.
"""

from __future__ import annotations

import json
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import pandas as pd

from cache_runtime.keys import KEY_FORMAT_VERSION
from cache_runtime.kv_pages import PAGE_TOKENS
from models.llm.backends import DEFAULT_RESPONSE_TOKENS, HFBackend, model_fingerprint
from models.tracking import alias_version

MODEL_NAME = "preheat-llm"
EXPERIMENT = "preheat-llm"
CHAMPION = "champion"
ARTIFACT = "llm"
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors", "mlflow", "pandas")


def save_tiny_llm(directory: Path, seed: int = 0) -> Path:
    """Build the tiny GPT-2 (random weights, MiniLM tokenizer) and save model and tokenizer to
    `directory`, in the layout `HFBackend.from_path` and `register_llm` take."""
    from models.tiny_llm import build_tiny_gpt2

    model, tokenizer = build_tiny_gpt2(seed=seed)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


class LLMPyfunc(mlflow.pyfunc.PythonModel):
    """Prompts in (a `prompt` column), completions out (a `text` column); greedy decoding.

    Pickled by reference, so loading needs this package installed (as the forecaster's).
    """

    def load_context(self, context: Any) -> None:
        self.backend = HFBackend.from_path(context.artifacts[ARTIFACT])

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        max_tokens = int((params or {}).get("max_tokens", DEFAULT_RESPONSE_TOKENS))
        texts = [self.backend.complete(str(p), max_tokens).text for p in model_input["prompt"]]
        return pd.DataFrame({"text": texts})


def pip_requirements() -> list[str]:
    """Pinned to this environment; explicit, so `log_model` skips its ~10 s inference."""
    return [f"{name}=={metadata.version(name)}" for name in REQUIREMENTS]


def _signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string", "prompt")]),
        outputs=Schema([ColSpec("string", "text")]),
        params=ParamSchema([ParamSpec("max_tokens", "long", DEFAULT_RESPONSE_TOKENS)]),
    )


def _metadata(model_dir: Path) -> dict[str, Any]:
    """What makes the registered model self-describing: its page-key identity and provenance."""
    from models.forecast.registry import git_commit  # ~3 s (pytorch-lightning) on first import

    config = json.loads((model_dir / "config.json").read_text())
    return {
        "model_id": model_fingerprint(model_dir),
        "model_type": config.get("model_type", "unknown"),
        "key_format_version": KEY_FORMAT_VERSION,
        "page_tokens": PAGE_TOKENS,
        "git_commit": git_commit(),
    }


def _experiment_id(client: Any, artifacts_dir: Path) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        return str(experiment.experiment_id)
    artifacts_dir.mkdir(parents=True, exist_ok=True)  # beside the store, not in the cwd
    uri = artifacts_dir.resolve().as_uri()
    return str(client.create_experiment(EXPERIMENT, artifact_location=uri))


def _params(model_dir: Path) -> dict[str, Any]:
    """The config's scalar hyper-parameters (the run's searchable copy of config.json)."""
    config = json.loads((model_dir / "config.json").read_text())
    scalars = (str, int, float, bool)
    return {f"config.{k}": v for k, v in sorted(config.items()) if isinstance(v, scalars)}


def register_llm(
    model_dir: str | Path, tracking_uri: str, artifacts_dir: str | Path, name: str = MODEL_NAME
) -> str:
    """Log `model_dir` (a `save_pretrained` directory with its tokenizer) as a pyfunc, register
    it as `name`, and point `champion` at it if no version holds that alias yet.

    Returns:
        The new registered version, as a string.
    """
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (not a saved model directory)")
    mlflow.set_tracking_uri(tracking_uri)
    client = mlflow.MlflowClient(tracking_uri)
    meta = _metadata(model_dir)
    with (
        mlflow.start_run(experiment_id=_experiment_id(client, Path(artifacts_dir))),
        warnings.catch_warnings(),
    ):
        # No input example on purpose: MLflow would load and run the whole LLM to check it.
        warnings.filterwarnings("ignore", ".*An input example was not provided", UserWarning)
        mlflow.log_params({**_params(model_dir), **meta})
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=LLMPyfunc(),
            artifacts={ARTIFACT: str(model_dir)},
            signature=_signature(),
            pip_requirements=pip_requirements(),
            metadata=meta,
            registered_model_name=name,
        )
    version = str(info.registered_model_version)
    if alias_version(client, name, CHAMPION) is None:
        client.set_registered_model_alias(name, CHAMPION, version)
    return version


def fetch_llm(
    tracking_uri: str, destination: Path, name: str = MODEL_NAME, alias: str = CHAMPION
) -> tuple[Path, str]:
    """Download `models:/<name>@<alias>` under `destination`: (the HF model directory, version).

    Only the files are fetched: the caller loads them (`HFBackend.from_path`) on the device it
    chooses, instead of the pyfunc's `load_context` loading them a first time.

    Raises:
        LookupError: no such model or alias in the store.
    """
    from mlflow.artifacts import download_artifacts
    from mlflow.models import Model

    client = mlflow.MlflowClient(tracking_uri)
    found = alias_version(client, name, alias)
    if found is None:
        raise LookupError(f"no {name}@{alias} registered in {tracking_uri}")
    version = str(found.version)
    # By version, not alias: the alias could move between the lookup and the download.
    # From the version's storage location, not `models:/...`: MLflow 3.17 resolves a `models:/`
    # URI through the process's default registry whatever `tracking_uri`/`registry_uri` say
    # (`./mlflow.db` of the working directory, created there), so a fresh process failed
    source = client.get_model_version_download_uri(name, version)
    local = download_artifacts(source, dst_path=str(destination), tracking_uri=tracking_uri)
    flavor = Model.load(local).flavors["python_function"]
    return Path(local) / flavor["artifacts"][ARTIFACT]["path"], version
