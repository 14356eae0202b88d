"""A fitted `PanelForecaster` as a self-describing directory: `forecaster.json` (its choice,
weights, config, the rows it predicts and the commit that trained it) plus `attention.pt` when
the attention model takes part. The registry (`registry.py`) logs such a directory as the
pyfunc's artifact; `load_panel_forecaster` rebuilds the forecaster from the directory alone.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from data_contracts import CONTRACT_VERSION
from models.forecast.attention import AttentionConfig, load_checkpoint, save_checkpoint
from models.forecast.panel import COMBINED, PanelForecaster

META_FILE = "forecaster.json"
WEIGHTS_FILE = "attention.pt"


def git_commit() -> str:
    """HEAD of the checkout this module lives in, or "unknown" outside one."""
    command = ["git", "rev-parse", "HEAD"]
    try:
        done = subprocess.run(command, cwd=Path(__file__).parent, capture_output=True, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.decode().strip() or "unknown"


def save_panel_forecaster(
    forecaster: PanelForecaster, directory: Path, top_k: int, recent: int, granularity: str
) -> dict[str, Any]:
    """Write `forecaster.json` (plus `attention.pt` when attention is used); returns the metadata.

    top_k and recent travel with the model because they decide which rows it predicts: a
    loader that guessed them would forecast a different partition of the traffic.
    """
    if not forecaster.chosen:
        raise ValueError("fit the panel forecaster before saving it")
    directory.mkdir(parents=True, exist_ok=True)
    meta = {
        "chosen": forecaster.chosen,
        "alpha": forecaster.alpha,
        "val_frac": forecaster.val_frac,
        "validation_mae": forecaster.validation_mae,
        "weights": forecaster.weights,
        "hedge": forecaster.hedge,
        "fit_end": forecaster.fit_end,
        "config": asdict(forecaster.config),
        "top_k": top_k,
        "recent": recent,
        "granularity": granularity,
        "contract_version": CONTRACT_VERSION,
        "git_commit": git_commit(),
    }
    meta = json.loads(json.dumps(meta))  # tuples -> lists: what a reader (and MLmodel YAML) sees
    (directory / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    if _uses_attention(meta):
        if forecaster.module is None:
            raise ValueError("an attention forecaster without a module cannot be saved")
        save_checkpoint(forecaster.module, directory / WEIGHTS_FILE, meta)
    return meta


def _uses_attention(meta: dict[str, Any]) -> bool:
    if meta["chosen"] == COMBINED:
        return "attention" in meta["weights"]
    return meta["chosen"] == "attention"


def load_panel_forecaster(directory: Path) -> tuple[PanelForecaster, int, int, dict[str, Any]]:
    """Rebuild a saved forecaster: (forecaster, top_k, recent, metadata)."""
    meta = json.loads((Path(directory) / META_FILE).read_text())
    config = AttentionConfig(**{**meta["config"], "scales": tuple(meta["config"]["scales"])})
    module = None
    if _uses_attention(meta):
        module, _ = load_checkpoint(Path(directory) / WEIGHTS_FILE)
        if module.config != config:
            raise ValueError(f"{directory}: the weights' config differs from {META_FILE}")
    fitted = {k: meta[k] for k in ("val_frac", "chosen", "alpha", "validation_mae")}
    # Saved before the combination (2026-12-02): one method, no weights.
    fitted.update({k: meta.get(k, default) for k, default in (("weights", {}), ("hedge", {}),
                                                               ("fit_end", ""))})  # fmt: skip
    forecaster = PanelForecaster(config=config, module=module, **fitted)
    return forecaster, int(meta["top_k"]), int(meta["recent"]), meta
