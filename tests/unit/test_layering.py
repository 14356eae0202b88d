"""The dependency direction of DESIGN.md, checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("prefect", "mlflow", "pytorch_lightning", "lightning", "torch", "transformers")


@pytest.mark.parametrize(
    "module",
    [
        "cache_runtime.settings",
        "cache_runtime.services",
        "cache_runtime.request_stream",
        "cache_runtime.prefix_hash",
        "cache_runtime.keys",
        "cache_runtime.tiers",
        "cache_runtime.hybrid",
        "cache_runtime.kv_pages",
        "data_contracts",
        "data_contracts.lake",
        "data_contracts.derived",
    ],
)
def test_serving_side_imports_stay_light(module: str) -> None:
    probe = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == "", f"{module} pulled in {loaded}"


def test_data_contracts_import_nothing_else_from_the_project() -> None:
    probe = (
        "import sys, data_contracts.lake, data_contracts.derived; "
        "print(','.join(m for m in sys.modules if m.split('.')[0] in "
        "('cache_runtime', 'models', 'flows')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    ).stdout.strip()
    assert loaded == ""
