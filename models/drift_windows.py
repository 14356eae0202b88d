"""The two windows the drift check compares, and how the reference is chosen.

The current window is the lake's last `minutes`; its reference is the champion forecaster's
training window at the same time of day, else the lake's oldest `minutes` (`choose_windows`).
Both windows' template columns are cut to the reference's top templates before they are
compared (`collapse_templates`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from models.drift_features import RATE_BUCKET_S

TOP_TEMPLATES = 10  # the reference's top templates; the rest are one category (see below)
OTHER_TEMPLATES = "(other)"  # no slash: never equal to a `<tenant>/<template>` value


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
