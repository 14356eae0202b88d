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
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import pandas as pd
from pandera.typing import DataFrame

from data_contracts.drift import (
    CATEGORICAL_DRIFT_COLUMNS,
    DRIFT_COLUMNS,
    NUMERICAL_DRIFT_COLUMNS,
    DriftFeatures,
)

RATE_BUCKET_S = 10  # 10 s: 360 buckets an hour (1 min buckets gave 60: twice the noise)
TOP_TEMPLATES = 10  # the reference's top templates; the rest are one category (see below)
OTHER_TEMPLATES = "(other)"  # no slash: never equal to a `<tenant>/<template>` value
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
REQUEST_COLUMNS = ("timestamp", "tenant", "prompt_tokens", "output_tokens", "template_id")

NO_DRIFT, DRIFT, INSUFFICIENT = "no-drift", "drift", "insufficient-data"


def request_features(requests: pd.DataFrame) -> DataFrame[DriftFeatures]:
    """One `DriftFeatures` row per request of `requests` (RequestLog columns; extra ones ignored).

    The rate is attached to each request as the rate of the 10 s bucket it arrived in, so one
    table (and one Evidently report) carries all three quantities. Weighting buckets by their
    requests biases the rate's distribution towards busy buckets, identically in both windows,
    so a comparison stays fair. Rejected: one row per time bucket, which would reduce token
    lengths to per-bucket means and the template mix to nothing comparable; and a second
    report for the rate, which would leave two dataset-drift decisions to reconcile.
    """
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"request_features needs {list(REQUEST_COLUMNS)}; missing: {missing}")
    requests = requests.sort_values("timestamp", kind="stable")
    buckets = requests["timestamp"].dt.floor(f"{RATE_BUCKET_S}s")
    rate = requests.groupby(buckets)["timestamp"].transform("size") / RATE_BUCKET_S
    template = requests["tenant"].astype("string") + "/"
    template += requests["template_id"].astype("string").fillna("-")
    features = pd.DataFrame(
        {
            "timestamp": requests["timestamp"],
            "rate_rps": rate.astype(float),
            "prompt_tokens": requests["prompt_tokens"],
            "output_tokens": requests["output_tokens"],
            "template": template.astype(object),
        }
    ).reset_index(drop=True)
    return DriftFeatures.validate(features, lazy=True)


# -- windows --------------------------------------------------------------------------------


def between(features: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    """The rows with `start <= timestamp < end`."""
    stamps = features["timestamp"]
    return features[(stamps >= start) & (stamps < end)].reset_index(drop=True)


def latest_window(features: pd.DataFrame, minutes: int) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[start, end) of the last `minutes` of `features`, ending with the last request's bucket.

    Relative to the lake's last request, not to the clock: a lake replayed from an old trace
    (the demo, the tests) has a latest window too, and a lake whose ingestion stopped shows up
    as a stale `current_end` in the run rather than as an empty window.
    """
    bucket = pd.Timedelta(seconds=RATE_BUCKET_S)
    end = features["timestamp"].max().floor(bucket) + bucket
    return end - pd.Timedelta(minutes=minutes), end


def oldest_window(features: pd.DataFrame, minutes: int) -> tuple[pd.Timestamp, pd.Timestamp]:
    """[start, end) of the first `minutes` of `features`."""
    start = features["timestamp"].min().floor(f"{RATE_BUCKET_S}s")
    return start, start + pd.Timedelta(minutes=minutes)


def same_time_of_day(
    reference: pd.DataFrame, start: pd.Timestamp, end: pd.Timestamp
) -> pd.DataFrame:
    """The reference rows at the time of day (UTC) of the window [start, end), on every day.

    Why: traffic has daily tides (the generator's peak is ~8x its trough). A 60-minute window
    compared with a whole multi-day reference would show rate drift at every peak and trough,
    and the check would retrain the forecaster on every tide it already models.
    """
    length = end - start
    if length >= pd.Timedelta(days=1):
        return reference
    stamps = reference["timestamp"]
    time_of_day = stamps - stamps.dt.floor("D")
    low = start - start.floor("D")
    high = low + length
    inside = (time_of_day >= low) & (time_of_day < high)
    if high > pd.Timedelta(days=1):  # the window crosses midnight
        inside |= time_of_day < high - pd.Timedelta(days=1)
    return reference[inside].reset_index(drop=True)


def collapse_templates(
    reference: pd.DataFrame, current: pd.DataFrame, top: int = TOP_TEMPLATES
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both windows with every template outside the reference's `top` as `OTHER_TEMPLATES`.

    A distance over all templates is mostly sampling noise: with ~120 templates and a few
    hundred requests an hour, most templates are seen a handful of times, and the Jensen-Shannon
    distance between two undrifted hours was 0.22 to 0.43 (0.14 at most over the top 10). A
    template that is new or newly popular still shows, as the growth of `OTHER_TEMPLATES`.
    """
    counts = reference["template"].value_counts()
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))  # ties: by name
    kept = {name for name, _ in ranked[:top]}

    def collapse(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        frame["template"] = frame["template"].where(frame["template"].isin(kept), OTHER_TEMPLATES)
        return frame

    return collapse(reference), collapse(current)


@dataclass(frozen=True)
class TrainingWindow:
    """[start, end) of the requests a registered forecaster was trained on."""

    start: pd.Timestamp
    end: pd.Timestamp
    label: str  # e.g. "preheat-forecaster v3 (run 1a2b...)"


@dataclass(frozen=True)
class Windows:
    """The two windows to compare, how the reference was chosen, or why nothing can be."""

    reference: pd.DataFrame
    current: pd.DataFrame
    bounds: dict[str, str]  # reference_start/end, current_start/end as ISO strings
    source: str  # a sentence: where the reference comes from
    problem: str = ""  # non-empty: nothing to compare, and why


def _iso(stamp: pd.Timestamp) -> str:
    return stamp.isoformat()


def choose_windows(
    features: pd.DataFrame, minutes: int, training: TrainingWindow | None, why_none: str = ""
) -> Windows:
    """The current window (the last `minutes` of `features`) and its reference: the champion's
    training window at the current window's time of day (see `same_time_of_day`), else the
    oldest `minutes` of the lake; `why_none` says why there is no training window."""
    empty = features.iloc[0:0]
    if features.empty:
        return Windows(empty, empty, {}, "", "the lake has no requests")
    cur_start, cur_end = latest_window(features, minutes)
    current = between(features, cur_start, cur_end)
    reference = between(features, training.start, training.end) if training else empty
    if training is not None and reference.empty:
        why_none = f"{training.label}: no requests of its training window are in this lake"
    if reference.empty:
        ref_start, ref_end = oldest_window(features, minutes)
        source = f"oldest {minutes} min of the lake ({why_none or 'no champion'})"
        if ref_end > cur_start:  # a short lake: the reference stops where the current starts
            ref_end = cur_start
            source += f", cut to the {(ref_end - ref_start).total_seconds() / 60:.0f} min before"
            source += " the current window"
        if ref_end <= ref_start:
            problem = (
                f"the lake holds no more than one {minutes}-min window of requests: "
                "nothing before the current window to compare it with"
            )
            bounds = {"current_start": _iso(cur_start), "current_end": _iso(cur_end)}
            return Windows(empty, current, bounds, source, problem)
        reference = between(features, ref_start, ref_end)
    else:
        ref_start, ref_end = training.start, training.end
        source = f"{training.label} training window"
        if ref_end - ref_start < pd.Timedelta(days=1):  # some times of day are missing from it
            source += " (less than a day: all of it, not aligned to the time of day)"
        else:
            reference = same_time_of_day(reference, cur_start, cur_end)
            source += (
                f" at the current window's time of day ({cur_start:%H:%M}-{cur_end:%H:%M} UTC)"
            )
    bounds = {
        "reference_start": _iso(ref_start), "reference_end": _iso(ref_end),
        "current_start": _iso(cur_start), "current_end": _iso(cur_end),
    }  # fmt: skip
    return Windows(reference, current, bounds, source)


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
