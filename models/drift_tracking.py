"""One drift check against the lake and the registry, recorded as one MLflow run.

`check_lake_drift` reads the lake's requests and the champion forecaster's training window,
compares the windows (`models.drift`) and leaves one run in the `preheat-drift` experiment,
whatever it decides: the windows compared, a score per column, the decision and its reason as
tags, and the reports (Evidently's HTML and JSON, and `result.json` with the decision) under
`drift/`. No Prefect here: the `check-drift` flow (`flows.drift.flow`) calls it as a task and
starts the retrain deployment on drift.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from data_contracts.lake import Lake
from models.drift import (
    COLUMN_THRESHOLDS,
    METHODS,
    RATE_BUCKET_S,
    REQUEST_COLUMNS,
    TOP_TEMPLATES,
    DriftResult,
    TrainingWindow,
    Windows,
    choose_windows,
    detect_drift,
    insufficient,
    request_features,
    write_reports,
)

EXPERIMENT = "preheat-drift"
# The forecaster's registry names (`models.forecast.registry`), repeated rather than imported:
# that module pulls in torch and Lightning (~13 s here), which an hourly check should not pay.
# tests/integration/test_drift_flow.py registers through the registry's names, so a rename fails.
FORECASTER_MODEL, CHAMPION_ALIAS = "preheat-forecaster", "champion"


def champion_training_window(tracking_uri: str) -> tuple[TrainingWindow | None, str]:
    """The training window the champion forecaster's run recorded (`train_start`, `train_end`
    params), or (None, why not): no champion, or one trained before those params existed."""
    from mlflow import MlflowClient

    from models.tracking import alias_version

    client = MlflowClient(tracking_uri)
    version = alias_version(client, FORECASTER_MODEL, CHAMPION_ALIAS)
    if version is None:
        return None, f"no {FORECASTER_MODEL}@{CHAMPION_ALIAS} registered"
    label = f"{FORECASTER_MODEL} v{version.version} (run {version.run_id})"
    params = client.get_run(version.run_id).data.params
    if not params.get("train_start") or not params.get("train_end"):
        return None, f"{label} does not record its training window (train_start, train_end)"
    start, end = (_utc(params[key]) for key in ("train_start", "train_end"))
    return TrainingWindow(start, end, label), ""


def _utc(text: str) -> pd.Timestamp:
    stamp = pd.Timestamp(text)
    return stamp.tz_localize("UTC") if stamp.tz is None else stamp.tz_convert("UTC")


def log_drift_run(
    result: DriftResult, windows: Windows, settings: dict[str, Any], uri: str, artifacts: Path
) -> str:
    """One MLflow run for one check: settings and windows as params, scores as metrics, the
    decision, its reason and the reference's origin as tags, the reports as artifacts."""
    import mlflow

    from models.tracking import experiment_id

    experiment = experiment_id(EXPERIMENT, uri, artifacts)
    with tempfile.TemporaryDirectory() as tmp, mlflow.start_run(experiment_id=experiment) as run:
        mlflow.log_params({**settings, **windows.bounds})
        mlflow.log_metrics(
            {
                "share_drifted": result.share_drifted,
                "reference_rows": result.reference_rows,
                "current_rows": result.current_rows,
                **{f"drift.{c.column}": c.score for c in result.columns},
            }
        )
        mlflow.set_tags(
            {"decision": result.decision, "reason": result.reason, "reference": windows.source}
        )
        write_reports(result, Path(tmp))
        mlflow.log_artifacts(tmp, artifact_path="drift")
    return run.info.run_id


def check_lake_drift(
    data_dir: str, mlflow_uri: str, mlflow_artifacts: str, window_minutes: int,
    threshold: float, min_requests: int,
) -> dict[str, Any]:  # fmt: skip
    """Read the lake and the champion, compare the windows, log the MLflow run; returns the
    decision, its reason, whether it is drift, the drifted columns and the MLflow run id."""
    requests = Lake(Path(data_dir) / "lake").read("requests", columns=list(REQUEST_COLUMNS))
    training, why_none = champion_training_window(mlflow_uri)
    windows = choose_windows(request_features(requests), window_minutes, training, why_none)
    if windows.problem:
        result = insufficient(windows.problem, threshold, 0, len(windows.current))
    else:
        result = detect_drift(windows.reference, windows.current, threshold, min_requests)
    settings = {
        "window_minutes": window_minutes, "threshold": threshold, "min_requests": min_requests,
        "rate_bucket_s": RATE_BUCKET_S, "top_templates": TOP_TEMPLATES,
        "methods": json.dumps(METHODS), "column_thresholds": json.dumps(COLUMN_THRESHOLDS),
    }  # fmt: skip
    run_id = log_drift_run(result, windows, settings, mlflow_uri, Path(mlflow_artifacts))
    return {
        "decision": result.decision, "reason": result.reason, "drift": result.drift,
        "share_drifted": result.share_drifted, "drifted_columns": list(result.drifted_columns),
        "reference": windows.source, "mlflow_run_id": run_id,
    }  # fmt: skip
