"""Environment defaults for Prefect and MLflow, set before either is imported.

Both read their configuration from the environment at import time, so this runs first in every
entry point (CLI, tests). Values already set by the user win (`setdefault`): a user pointing
`PREFECT_API_URL` at their own server keeps it.

Wiring without a Prefect import of its own: it has to run before Prefect is imported (above).
"""

from __future__ import annotations

import os

from cache_runtime.settings import Settings


def configure_runtime_env(settings: Settings) -> None:
    """Keep Prefect's state under the data dir and switch off all telemetry."""
    prefect_home = (settings.data_dir / "prefect").resolve()
    prefect_home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr stays readable
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
