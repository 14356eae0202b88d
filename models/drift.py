"""Drift of the request stream against the forecaster's training data, measured with Evidently.

The forecaster learns per-key demand from a window of requests; when the traffic it sees now no
longer looks like that window (arrival rate, token lengths, template mix), its forecasts go stale
and it should be retrained. This module builds the per-request features table, chooses the two
windows, runs Evidently's `DataDriftPreset` on them and turns the result into a decision with a
reason a person can read. No Prefect here: the `check-drift` flow wires it to the lake, MLflow and
the retrain deployment.

Per-column methods and thresholds are fixed rather than left to Evidently's defaults. Its
defaults pick p-value tests below 1,000 reference rows and distances above, so the same drift
would be judged differently depending on how long the reference is; and a p-value on a rate
shared by every request of a bucket is meaningless (the rows are not independent). All columns
use distances instead (an effect size: "how far", comparable between runs), with thresholds set
above the noise floor measured between same-hour, 60-minute windows of different days of the
seeded generator (`models.ingest.synthetic`, 4 seeds x 3 days, windows of >= 200 requests): the
largest distance seen between undrifted windows was 0.38 for the rate, 0.16 / 0.22 for the
prompt / output token lengths and 0.14 for the template mix, against thresholds of 0.5, 0.3,
0.3 and 0.2. A 1.5x rate, a 1.25x prompt length or a reshuffled template popularity clear them.

The parts: `drift_features` builds the per-request table, `drift_windows` chooses the two
windows (and collapses rare templates); this module decides and writes the reports, and names
them all.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd

from data_contracts.drift import (
    CATEGORICAL_DRIFT_COLUMNS,
    DRIFT_COLUMNS,
    NUMERICAL_DRIFT_COLUMNS,
    DriftFeatures,
)
from models.drift_features import RATE_BUCKET_S, REQUEST_COLUMNS, request_features
from models.drift_windows import (
    OTHER_TEMPLATES,
    TOP_TEMPLATES,
    TrainingWindow,
    Windows,
    between,
    choose_windows,
    collapse_templates,
    latest_window,
    oldest_window,
    same_time_of_day,
)

__all__ = [
    "COLUMN_THRESHOLDS",
    "DEFAULT_THRESHOLD",
    "DRIFT",
    "INSUFFICIENT",
    "METHODS",
    "METHOD_NAMES",
    "MIN_REQUESTS",
    "NO_DRIFT",
    "OTHER_TEMPLATES",
    "RATE_BUCKET_S",
    "REQUEST_COLUMNS",
    "TOP_TEMPLATES",
    "ColumnDrift",
    "DriftResult",
    "TrainingWindow",
    "Windows",
    "between",
    "choose_windows",
    "collapse_templates",
    "detect_drift",
    "insufficient",
    "latest_window",
    "oldest_window",
    "request_features",
    "same_time_of_day",
    "write_reports",
]

MIN_REQUESTS = 200  # the noise floor above was measured from this window size up
DEFAULT_THRESHOLD = 0.25  # share of drifted columns: one of the four is enough (see DriftResult)
METHODS: dict[str, str] = {
    "rate_rps": "wasserstein",
    "prompt_tokens": "wasserstein",
    "output_tokens": "wasserstein",
    "template": "jensenshannon",
}
COLUMN_THRESHOLDS: dict[str, float] = {
    "rate_rps": 0.5,
    "prompt_tokens": 0.3,
    "output_tokens": 0.3,
    "template": 0.2,
}
METHOD_NAMES = {"wasserstein": "Wasserstein distance (normed)", "jensenshannon": "Jensen-Shannon"}

NO_DRIFT, DRIFT, INSUFFICIENT = "no-drift", "drift", "insufficient-data"


# -- the decision ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnDrift:
    """One column's drift score (Evidently's), its threshold and the change in plain words."""

    column: str
    method: str
    score: float
    threshold: float
    change: str  # e.g. "mean 136 -> 171, +26%", "largest change acme-bank/t000 18.0% -> 2.1%"

    @property
    def drifted(self) -> bool:
        return self.score >= self.threshold  # distances: drift at or above the threshold

    def describe(self) -> str:
        sign = ">=" if self.drifted else "<"
        name = METHOD_NAMES.get(self.method, self.method)
        return f"{self.column} {name} {self.score:.2f} {sign} {self.threshold:.2f} ({self.change})"


@dataclass(frozen=True)
class DriftResult:
    """The decision on one pair of windows.

    `decision` is `drift` when the share of drifted columns reaches `threshold` (Evidently's
    dataset-drift rule, `share >= drift_share`), `no-drift` when it does not, and
    `insufficient-data` when a window was too small to judge (then `columns` is empty). The
    default threshold, 0.25, makes one drifted column of the four enough: each one alone makes
    the forecaster stale (the template mix moves its per-key shares, the rate its levels, the
    token lengths the warm-up budget per item), and the column thresholds already sit above the
    noise. `snapshot` is Evidently's, for the HTML and JSON reports (None without a report).
    """

    decision: str
    reason: str
    threshold: float
    share_drifted: float
    columns: tuple[ColumnDrift, ...]
    reference_rows: int
    current_rows: int
    snapshot: Any = field(default=None, repr=False, compare=False)

    @property
    def drift(self) -> bool:
        return self.decision == DRIFT

    @property
    def drifted_columns(self) -> tuple[str, ...]:
        return tuple(c.column for c in self.columns if c.drifted)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (the snapshot left out: `asdict` would deep-copy it)."""
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "snapshot"}
        columns = [{**asdict(c), "drifted": c.drifted} for c in self.columns]
        return {**plain, "columns": columns, "drifted_columns": list(self.drifted_columns)}


def insufficient(
    reason: str, threshold: float, reference_rows: int = 0, current_rows: int = 0
) -> DriftResult:
    """A `DriftResult` saying why there was nothing to compare."""
    return DriftResult(INSUFFICIENT, reason, threshold, 0.0, (), reference_rows, current_rows)


def _numeric_change(reference: pd.Series, current: pd.Series) -> str:
    before, after = float(reference.mean()), float(current.mean())
    relative = f", {(after - before) / before:+.0%}" if before else ""
    return f"mean {before:.3g} -> {after:.3g}{relative}"


def _template_change(reference: pd.Series, current: pd.Series) -> str:
    before = reference.value_counts(normalize=True)
    after = current.value_counts(normalize=True)
    shares = pd.concat([before, after], axis=1, keys=["before", "after"]).fillna(0.0)
    delta = (shares["after"] - shares["before"]).abs()
    name = sorted(delta.index, key=lambda key: (-delta[key], str(key)))[0]
    row = shares.loc[name]
    return f"largest change {name} {row['before']:.1%} -> {row['after']:.1%}"


def _run_evidently(
    reference: pd.DataFrame, current: pd.DataFrame, threshold: float, thresholds: dict[str, float]
) -> Any:
    # Imported here: evidently takes ~7 s to import, which the flow pays only when it compares.
    from evidently import DataDefinition, Dataset, Report
    from evidently.presets import DataDriftPreset

    definition = DataDefinition(
        numerical_columns=list(NUMERICAL_DRIFT_COLUMNS),
        categorical_columns=list(CATEGORICAL_DRIFT_COLUMNS),
    )
    preset = DataDriftPreset(
        columns=list(DRIFT_COLUMNS), drift_share=threshold, per_column_method=dict(METHODS),
        per_column_threshold=thresholds,
    )  # fmt: skip
    # Only the compared columns: a timestamp column makes Evidently plot over time, warning that
    # the period conversion drops the time zone.
    cols = list(DRIFT_COLUMNS)
    return Report([preset]).run(
        current_data=Dataset.from_pandas(current[cols], data_definition=definition),
        reference_data=Dataset.from_pandas(reference[cols], data_definition=definition),
    )


def _scores(snapshot: Any) -> tuple[dict[str, float], float]:
    """(score per column, share of drifted columns) from the snapshot's documented `dict()`."""
    scores: dict[str, float] = {}
    share = None
    for metric in snapshot.dict()["metrics"]:
        kind = metric["config"]["type"]
        if kind.endswith(":ValueDrift"):
            scores[metric["config"]["column"]] = float(metric["value"])
        elif kind.endswith(":DriftedColumnsCount"):
            share = float(metric["value"]["share"])
    if share is None or set(scores) != set(DRIFT_COLUMNS):
        raise RuntimeError(f"unexpected Evidently report: scores for {sorted(scores)}")
    return scores, share


def _reason(decision: str, columns: tuple[ColumnDrift, ...], share: float, threshold: float) -> str:
    drifted = [c for c in columns if c.drifted]
    head = (
        f"{len(drifted)} of {len(columns)} columns drifted "
        f"(share {share:.2f} {'>=' if decision == DRIFT else '<'} threshold {threshold:.2f})"
    )
    if drifted:
        return f"{head}: " + "; ".join(c.describe() for c in drifted)
    closest = max(columns, key=lambda c: c.score / c.threshold)
    return f"{head}; closest: {closest.describe()}"


def detect_drift(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    threshold: float = DEFAULT_THRESHOLD,
    min_requests: int = MIN_REQUESTS,
    column_thresholds: dict[str, float] | None = None,
) -> DriftResult:
    """Compare two `DriftFeatures` windows with Evidently and decide.

    Args:
        reference: the window the forecaster was trained on (or stands in for it).
        current: the window to judge.
        threshold: the share of drifted columns that means drift, in (0, 1].
        min_requests: below this many requests in either window, nothing is compared (the
            column thresholds are only above the noise from this size up).
        column_thresholds: per-column overrides of `COLUMN_THRESHOLDS`.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold {threshold}: a share of drifted columns, in (0, 1]")
    reference = DriftFeatures.validate(reference, lazy=True)
    current = DriftFeatures.validate(current, lazy=True)
    for name, frame in (("current", current), ("reference", reference)):
        if len(frame) < min_requests:
            reason = f"not enough requests in the {name} window: {len(frame)} < {min_requests}"
            return insufficient(reason, threshold, len(reference), len(current))
    thresholds = {**COLUMN_THRESHOLDS, **(column_thresholds or {})}
    reference, current = collapse_templates(reference, current)
    snapshot = _run_evidently(reference, current, threshold, thresholds)
    scores, share = _scores(snapshot)
    columns = tuple(
        ColumnDrift(
            column, METHODS[column], scores[column], thresholds[column],
            (_template_change if column in CATEGORICAL_DRIFT_COLUMNS else _numeric_change)(
                reference[column], current[column]
            ),
        )
        for column in DRIFT_COLUMNS
    )  # fmt: skip
    decision = DRIFT if share >= threshold else NO_DRIFT
    reason = _reason(decision, columns, share, threshold)
    return DriftResult(
        decision, reason, threshold, share, columns, len(reference), len(current), snapshot
    )


def write_reports(result: DriftResult, directory: Path) -> list[Path]:
    """Write `result.json` (the decision) and, when Evidently ran, its `report.html` and
    `report.json`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    decision = directory / "result.json"
    decision.write_text(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    written = [decision]
    if result.snapshot is not None:
        result.snapshot.save_html(str(directory / "report.html"))
        result.snapshot.save_json(str(directory / "report.json"))
        written += [directory / "report.html", directory / "report.json"]
    return written
