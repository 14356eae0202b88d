"""The check a downloaded version must pass before it may replace the running one.

The LLM: loaded onto the node's device, a short prefill with finite logits. The forecaster: a
forecast of its own stored input example, on the CPU. Each check returns what the manifest entry
needs (`Checked`) and raises on anything that would make the version useless on the node.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

CHECK_PROMPT = "Preheat deploy check: the cache is warm before the first request arrives."
# A Preheat model's kind is the name of its pyfunc artifact (`artifacts={...}` in the
# registries): the model says what it is, so a second LLM under another name deploys too.
KINDS = ("llm", "forecaster")


def model_kind(model_dir: Path) -> str:
    """`llm` or `forecaster`: the one Preheat artifact among the model's pyfunc artifacts."""
    from mlflow.models import Model

    artifacts = Model.load(model_dir).flavors.get("python_function", {}).get("artifacts") or {}
    kinds = [key for key in artifacts if key in KINDS]
    if len(kinds) != 1:
        raise ValueError(f"{model_dir}: not a Preheat model (pyfunc artifacts {sorted(artifacts)})")
    return kinds[0]


@dataclass(frozen=True)
class Checked:
    """What a passed check tells the manifest entry."""

    path: Path  # what the loader takes
    model_id: str | None
    load_seconds: float


def check_llm(model_dir: Path, device: str) -> Checked:
    """Load the LLM onto `device` and prefill a short prompt.

    Finite logits are the minimum function: weights that load but compute NaN (a bad
    fine-tune, a truncated conversion) would otherwise warm pages nobody can use.
    """
    import torch
    from mlflow.models import Model

    from models.llm.backends import HFBackend
    from models.llm.registry import ARTIFACT

    flavor = Model.load(model_dir).flavors["python_function"]
    path = model_dir / flavor["artifacts"][ARTIFACT]["path"]
    started = time.perf_counter()
    backend = HFBackend.from_path(path, device=device)
    loaded = time.perf_counter() - started
    try:
        tokens = backend.encode(CHECK_PROMPT)
        ids = torch.tensor([tokens], device=backend.device)  # (1, T)
        with torch.inference_mode():
            logits = backend.model(ids, logits_to_keep=1).logits  # (1, 1, vocab)
        if not bool(torch.isfinite(logits).all()):
            raise ValueError(f"a {len(tokens)}-token prefill on {device} gave non-finite logits")
        return Checked(path, backend.model_id, loaded)
    finally:
        backend.close()
        del backend
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def check_forecaster(model_dir: Path, name: str) -> Checked:
    """Load the forecaster and forecast its own stored input example (a real slice of the
    demand it was trained on): rows come out, and they pass the `KeyForecast` contract."""
    import mlflow.pyfunc
    from mlflow.models import Model

    from models.forecast.registry import Champion

    example = Model.load(model_dir).load_input_example(str(model_dir))
    if example is None:
        raise ValueError(f"{model_dir}: no input example to check the forecaster with")
    started = time.perf_counter()
    model = mlflow.pyfunc.load_model(str(model_dir))
    loaded = time.perf_counter() - started
    champion = Champion(name, "", "", model.unwrap_python_model().meta, model)
    if champion.predict_per_key(example).empty:
        raise ValueError("the forecaster predicted no rows for its own input example")
    return Checked(model_dir, None, loaded)
