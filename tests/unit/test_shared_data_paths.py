"""The default `../shared/data` paths name the folder beside the checkout, wherever the module
that computes them sits (a module moved one folder deeper once pointed inside the repository,
and the benchmarks then fell back to built-in data without saying so)."""

from __future__ import annotations

from pathlib import Path

from models.evaluation.bench.shared_data import DEFAULT_SHARED_DATA
from models.templates.workload import default_prompts_dir

BESIDE_THE_CHECKOUT = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_the_benchmarks_shared_data_is_beside_the_checkout() -> None:
    assert DEFAULT_SHARED_DATA.resolve() == BESIDE_THE_CHECKOUT


def test_the_shipped_prompts_are_beside_the_checkout() -> None:
    assert default_prompts_dir().resolve() == BESIDE_THE_CHECKOUT / "prompts"
