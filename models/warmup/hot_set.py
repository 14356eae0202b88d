"""Which keys the warm-up planner expects to be hot: the hot-set combination, run on the lake.

`preheat bench hotset` measures `models.forecast.hotset_combination.PreheatHotset` on a trace;
the planner runs the same combination on the lake's demand series at plan time, one window per
bucket of the planning granularity, and scores the next window from the ones before it. Its
experts: the last window, the EWMA and the decayed frequency (each fitted on the lake's windows),
and the registered champion per-key forecaster when there is one, the learned ranker (trained by
`train-forecaster`, promoted only by the registry's gate). Not the bench's attention and boosted
rankers: the bench trains them on each trace it reads (46 s and 13 s on the Mooncake trace at
60 s windows), where the planner runs every few minutes and the platform already trains and
gates a learned per-key model.

The weights (`PreheatHotset`: AdaHedge with fixed share, a window's loss the share of its
requests an expert's top K missed) come from the last `WEIGHT_WINDOWS` windows, and only from
windows after the champion's training ended (its `fit_end`): a window it was trained on would
flatter it. With none yet (a champion trained just now) the weights are even. Each plan computes
them again from the lake, so they follow the actuals as they arrive.

What the planner takes is each key's share of the next window's requests (the combined scores,
which sum to 1); how many requests come is `candidates`' question.

`recall_on_window` asks the registry's gate's question of the same combination: how many of an
evaluation window's requests it would have held with a candidate forecaster as its learned
expert, against the champion (the alias decides which one the planner ranks with).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from data_contracts import GRANULARITIES, TOTAL_KEY, DemandSeries
from models.forecast.hotset import (
    DecayedFrequency,
    EwmaFrequency,
    HotsetScorer,
    KeyWindows,
    LastWindow,
    top_k,
    window_metrics,
)
from models.forecast.hotset_combination import PreheatHotset

if TYPE_CHECKING:
    from models.forecast.panel import KeyPanel, PanelForecaster
    from models.forecast.registry import Champion

HOT_K = 50  # the K of each window's loss, as `preheat bench hotset` scores it
WEIGHT_WINDOWS = 24  # windows the weights learn from (at 3 min: the last 72 minutes)
FIT_WINDOWS = 96  # windows before those that the frequency experts fit on: a bounded cost
MIN_FIT_WINDOWS = 4  # fewer, and the planner ranks by decayed frequency alone (`candidates`)
_KEYS = ["tenant", "key"]


@dataclass(frozen=True)
class HotSet:
    """Each key's predicted share of the next window's requests, and how it was reached."""

    shares: pd.DataFrame  # tenant, key, share: shares sum to 1
    weights: dict[str, float]  # each expert's weight in the combination
    windows: int  # the windows the weights learned from
    granularity: str
    bucket_start: pd.Timestamp  # the bucket the shares are for: the one after the demand's last
    notes: tuple[str, ...] = ()  # why an expert is not in it

    def summary(self) -> dict[str, Any]:
        """What a plan's summary says about it (the Prefect UI shows the summary)."""
        return {
            "granularity": self.granularity,
            "bucket_start": self.bucket_start.isoformat(),
            "weights": {name: round(weight, 4) for name, weight in self.weights.items()},
            "windows": self.windows,
            "keys": len(self.shares),
            **({"notes": list(self.notes)} if self.notes else {}),
        }


def frequency_experts(k: int) -> dict[str, Callable[[], HotsetScorer]]:
    """The planner's experts besides the champion, fitted on the lake at every plan (and what
    `bench hotset` reports as `planner`, where there is no registry to take a champion from)."""
    return {
        "last_window": LastWindow,
        "ewma_frequency": lambda: EwmaFrequency(k),
        "decayed_frequency": lambda: DecayedFrequency(k),
    }


@dataclass(frozen=True)
class LearnedRanker:
    """The registered per-key forecaster as the hot set uses it: the model, the panel it reads
    (its top K keys by the last `recent` buckets, and "other") and its forecast after the
    demand, which the planner has already made (`prepare.load_forecast`)."""

    forecaster: PanelForecaster
    top_k: int
    recent: int
    label: str  # e.g. "preheat-forecaster v3"
    forecast: pd.DataFrame  # KeyForecast: the next buckets, with its current weights

    @classmethod
    def of(cls, champion: Champion, forecast: pd.DataFrame) -> LearnedRanker:
        meta = champion.meta
        label = f"{champion.name} v{champion.version}"
        top_k, recent = int(meta["top_k"]), int(meta["recent"])
        return cls(champion.forecaster, top_k, recent, label, forecast)

    def panel(self, demand: pd.DataFrame, named_before: pd.Timestamp | None = None) -> KeyPanel:
        """`demand` as the champion reads it. With `named_before`, the keys it would have named
        from the buckets before that time, over every bucket of `demand`.

        Raises:
            ValueError: those keys' panel does not span `demand`'s buckets (demand without
                tenant totals, whose keys stop before its end).
        """
        from models.forecast.panel import OTHER_KEY, KeyPanel

        if named_before is None:
            return KeyPanel.from_demand(demand, self.top_k, self.recent)
        earlier = demand[demand["bucket_start"] < named_before]
        named = KeyPanel.from_demand(earlier, self.top_k, self.recent)
        keep = {(t, k) for t, k in zip(named.tenants, named.keys, strict=True) if k != OTHER_KEY}
        pairs = pd.MultiIndex.from_frame(demand[["tenant", "key"]].astype(object))
        rows = demand[(demand["key"] == TOTAL_KEY).to_numpy() | pairs.isin(keep)]
        before = KeyPanel.from_demand(rows, self.top_k, self.recent)
        spans = (demand["bucket_start"].min(), demand["bucket_start"].max())
        if (before.starts[0], before.starts[-1]) != spans:
            raise ValueError("the keys named earlier do not span the demand's buckets")
        return before


class ForecastScores:
    """A learned expert as a hot-set scorer: window w's scores are its forecast of w's bucket,
    made at w's start from the buckets before it only (the champion's in the planner,
    `_champion_expert`; the gate's rolling forecasts in `recall_on_window`). A key it does not
    forecast one by one (in "other"), or a window without a forecast, scores 0. Made already:
    `fit` changes nothing."""

    def __init__(self, by_window: dict[int, np.ndarray]) -> None:
        self.by_window = by_window  # window -> (n_keys,) the forecast of its bucket per key code

    def fit(self, kw: KeyWindows, until: int) -> ForecastScores:
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        found = self.by_window.get(w)
        return np.zeros(kw.n_keys) if found is None else found


def hot_set(
    demand: pd.DataFrame, champion: LearnedRanker | None = None, k: int = HOT_K
) -> HotSet | None:
    """The hot-set combination's shares for the bucket after `demand`'s last one; None when
    there are fewer than `MIN_FIT_WINDOWS` buckets to fit on besides those the weights use. A
    champion that cannot forecast this demand (`ValueError`, e.g. less history than it reads)
    is left out, and the notes say why.

    Raises:
        ValueError: `demand` breaks the `DemandSeries` contract or mixes granularities.
    """
    demand = DemandSeries.validate(demand, lazy=True)
    if champion is not None:
        try:
            return _combine(demand, champion, k)
        except ValueError as err:
            note = f"champion {champion.label} left out: {err}"
            found = _combine(demand, None, k)
            return None if found is None else dataclasses.replace(found, notes=(note,))
    return _combine(demand, None, k)


def _keyed(demand: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """(the requests of named keys, their granularity). Counts are requests; an expected count
    (a resampled trace's) is rounded to whole ones.

    Raises:
        ValueError: the demand mixes granularities.
    """
    keyed = demand[demand["key"] != TOTAL_KEY]
    keyed = keyed.assign(count=np.rint(keyed["count"]))
    keyed = keyed[keyed["count"] >= 1]
    granularities = keyed["granularity"].unique()
    if len(granularities) > 1:
        raise ValueError(f"the hot set reads one granularity, got {sorted(granularities)}")
    return keyed, str(granularities[0]) if len(granularities) else ""


def _windows(
    keyed: pd.DataFrame, start: pd.Timestamp, width: pd.Timedelta, n_windows: int
) -> tuple[KeyWindows, pd.MultiIndex]:
    """The keyed requests from `start` on, in `n_windows` windows of one bucket, and the
    (tenant, key) of each factorised id.

    Raises:
        ValueError: no keyed request in those windows.
    """
    recent = keyed[keyed["bucket_start"] >= start]
    if recent.empty:
        raise ValueError(f"no request of a named key from {start} on")
    pairs = pd.MultiIndex.from_frame(recent[_KEYS].astype(object))
    ids, names = pd.factorize(pairs)
    kw = KeyWindows.from_counts(
        ((recent["bucket_start"] - start) // width).to_numpy(), ids,
        recent["count"].to_numpy(), width.total_seconds(), start.timestamp(), n_windows,
    )  # fmt: skip
    return kw, names


def _combine(demand: pd.DataFrame, champion: LearnedRanker | None, k: int) -> HotSet | None:
    full = demand
    demand, granularity = _keyed(demand)
    if demand.empty:
        return None
    width = pd.Timedelta(seconds=GRANULARITIES[granularity])
    # the windows end where the demand does (a last bucket of requests without a key included),
    # so the next window is the bucket the champion's forecast starts with
    first, last = demand["bucket_start"].min(), full["bucket_start"].max()
    start = max(first, last - width * (FIT_WINDOWS + WEIGHT_WINDOWS - 1))
    past = int((last - start) // width) + 1  # windows 0..past-1 have actuals; `past` is next
    kw, names = _windows(demand, start, width, past + 1)
    experts: dict[str, Callable[[], HotsetScorer]] = frequency_experts(k)
    weigh = WEIGHT_WINDOWS
    if champion is not None:
        weigh = min(weigh, max(0, past - _trained_until(champion, start, width)))
    if past - weigh < MIN_FIT_WINDOWS:
        return None
    if champion is not None:
        expert = _champion_expert(champion, full, names, kw, start, width, past - weigh)
        experts["champion"] = lambda: expert
    combination = PreheatHotset(k, experts, val_windows=weigh).fit(kw, past)
    mixed = combination.scores(kw, past)  # (n_keys,) shares of the next window
    total = mixed.sum()
    if total <= 0:
        return None
    codes = kw.keys  # each code's factorised (tenant, key) id
    shares = pd.DataFrame(
        {
            "tenant": [names[i][0] for i in codes],
            "key": [names[i][1] for i in codes],
            "share": mixed / total,
        }
    )
    weights = dict(zip(combination.names, combination.weights(kw, past).tolist(), strict=True))
    shares = shares[shares["share"] > 0].reset_index(drop=True)
    return HotSet(shares, weights, weigh, granularity, last + width)


def _trained_until(champion: LearnedRanker, start: pd.Timestamp, width: pd.Timedelta) -> int:
    """The first window the champion's training did not see.

    Raises:
        ValueError: a champion saved without `fit_end` (before 2026-12-02): when its training
            ended is unknown, no window can be said to be unseen.
    """
    if not champion.forecaster.fit_end:
        raise ValueError("it was saved without the end of its training (fit_end)")
    fit_end = pd.Timestamp(champion.forecaster.fit_end)
    return int(np.ceil((fit_end - start) / width))


def _champion_expert(
    champion: LearnedRanker,
    demand: pd.DataFrame,
    names: pd.MultiIndex,
    kw: KeyWindows,
    start: pd.Timestamp,
    width: pd.Timedelta,
    first_weighed: int,
) -> ForecastScores:
    """The champion on the windows of `kw` from `first_weighed` on. Nothing of a past window may
    have reached its forecast: it reads only the buckets before the window
    (`PanelForecaster.forecast_counts_at`), with the weights of the champion's own fit (its current
    ones have learned from the past windows' actuals), for the keys it would have named before
    the first window the weights learn from (`LearnedRanker.panel`: it names its top K by their
    recent demand, and a key hot only in those windows must not count as foreseen). The next
    window gets what the planner's forecast gives: today's keys and current weights.

    Raises:
        ValueError: its forecast does not start at the next window.
    """
    code_of = _codes(names, kw)
    following = champion.forecast[champion.forecast["step"] == 1]
    next_window = kw.n_windows - 1
    next_bucket = start + width * next_window
    if not (following["bucket_start"] == next_bucket).all():
        raise ValueError(f"its forecast does not start at the next bucket, {next_bucket}")
    panel = champion.panel(demand, named_before=start + width * first_weighed)
    codes = np.array(
        [code_of.get((t, key), -1) for t, key in zip(panel.tenants, panel.keys, strict=True)],
        dtype=np.int64,
    )  # (panel rows,) each row's key code in the windows; -1: none
    named = codes >= 0
    offset = int((start - panel.starts[0]) // width)
    forecaster = champion.forecaster
    by_window = {next_window: _bucket_scores(champion.forecast, next_bucket, code_of, kw.n_keys)}
    past = np.arange(first_weighed, next_window)  # (W,) the windows the weights learn from
    if past.size:
        predicted = forecaster.forecast_counts_at(panel.counts, past + offset, forecaster.weights)
        for w, window in zip(past, predicted[:, :, 0], strict=True):  # (W, K, H) -> step 1
            scores = np.zeros(kw.n_keys)
            scores[codes[named]] = np.clip(window[named], 0.0, None)
            by_window[int(w)] = scores
    return ForecastScores(by_window)


def _codes(names: pd.MultiIndex, kw: KeyWindows) -> dict[tuple[str, str], int]:
    """(tenant, key) -> its code in `kw`'s windows."""
    return {names[i]: code for code, i in enumerate(kw.keys)}


def _bucket_scores(
    forecast: pd.DataFrame, bucket: pd.Timestamp, code_of: dict[tuple[str, str], int], n_keys: int
) -> np.ndarray:
    """(n_keys,) a `KeyForecast`'s rows for `bucket` per key code; 0 for a key it does not name
    one by one (in "other"), that the windows do not hold, or a bucket it does not reach. By the
    bucket, not the step: a forecast says which bucket each step is (`bucket_start`), and the
    gate's forecasts start at their origin where the planner's start at the bucket after the
    demand's last row."""
    from models.forecast.panel import OTHER_KEY

    rows = forecast[(forecast["bucket_start"] == bucket) & (forecast["key"] != OTHER_KEY)]
    scores = np.zeros(n_keys)
    for tenant, key, predicted in zip(rows["tenant"], rows["key"], rows["predicted"], strict=True):
        code = code_of.get((tenant, key), -1)
        if code >= 0:
            scores[code] = max(float(predicted), 0.0)
    return scores


class _FittedOnce:
    """A frequency expert shared by the gate's combinations: fitted once (each combination would
    fit it again on the same windows), and the last window's scores kept, since the combinations
    ask for each window in turn."""

    def __init__(self, expert: HotsetScorer, kw: KeyWindows, until: int) -> None:
        self.expert, self.until = expert.fit(kw, until), until
        self._window, self._scores = -1, np.zeros(0)

    def fit(self, kw: KeyWindows, until: int) -> _FittedOnce:
        if until != self.until:
            raise ValueError(f"fitted on the windows before {self.until}, asked for {until}")
        return self

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        if w != self._window:
            self._window, self._scores = w, np.asarray(self.expert.scores(kw, w))
        return self._scores


def recall_on_window(
    demand: pd.DataFrame,
    forecasts: Mapping[str, Sequence[pd.DataFrame]],
    origins: Sequence[pd.Timestamp],
    k: int = HOT_K,
) -> dict[str, np.ndarray]:
    """The registry gate's hot-set question: with each model as the planner's learned expert,
    what share of each origin's bucket's requests the planner's hot set holds.

    `forecasts` maps a model's name to its `KeyForecast` at each origin, made from the buckets
    before it; its rows for the origin's bucket are that window's scores. Each origin is one
    window of the combination: the frequency experts fit on the `FIT_WINDOWS` buckets before the
    first origin, and the weights at an origin learn from the origins before it (the last
    `WEIGHT_WINDOWS`). The planner's weights learn only from buckets after the champion's
    training ended; a new candidate's ended where the gate's window starts, a champion's may
    not have, which can only flatter it. Unlike the planner, the frequency experts are not
    refitted at every origin: a fit per origin would cost a grid search each, and every model
    judged gets the same ones.

    Returns:
        (origins with requests,) the recall at each, of `frequency` (the planner without a
        learned expert) and, per model, of its name (the top K of its own forecast) and of
        `planner_with_<name>`: paired by origin, for the gate's test.

    Raises:
        ValueError: origins that are not consecutive buckets, forecasts that are not one per
            origin, fewer than `MIN_FIT_WINDOWS` buckets of named keys before the first origin,
            or no request of a named key at any origin.
    """
    demand = DemandSeries.validate(demand, lazy=True)
    keyed, granularity = _keyed(demand)
    starts = pd.DatetimeIndex(origins)
    if keyed.empty or starts.empty:
        raise ValueError("no requests of named keys, or no origin, to judge a hot set on")
    width = pd.Timedelta(seconds=GRANULARITIES[granularity])
    if (starts[1:] - starts[:-1] != width).any():
        raise ValueError(f"the hot set is judged at consecutive buckets of {width}")
    start = max(keyed["bucket_start"].min(), starts[0] - width * FIT_WINDOWS)
    first = int((starts[0] - start) // width)
    if first < MIN_FIT_WINDOWS:
        raise ValueError(f"{first} buckets before the first origin, fewer than {MIN_FIT_WINDOWS}")
    kw, names = _windows(
        keyed[keyed["bucket_start"] <= starts[-1]], start, width, first + len(starts)
    )
    windows = {w for w in range(first, first + len(starts)) if kw.row(w).sum() > 0}
    if not windows:
        raise ValueError("no request of a named key at any origin")
    code_of = _codes(names, kw)
    learned: dict[str, ForecastScores] = {}
    for name, per_origin in forecasts.items():
        if len(per_origin) != len(starts):
            raise ValueError(f"{name}: {len(per_origin)} forecasts for {len(starts)} origins")
        learned[name] = ForecastScores(
            {
                first + i: _bucket_scores(forecast, bucket, code_of, kw.n_keys)
                for i, (forecast, bucket) in enumerate(zip(per_origin, starts, strict=True))
            }
        )
    shared: dict[str, HotsetScorer] = {
        name: _FittedOnce(make(), kw, first) for name, make in frequency_experts(k).items()
    }
    mixes: dict[str, dict[str, HotsetScorer]] = {
        "frequency": shared,
        **{f"planner_with_{name}": {**shared, name: e} for name, e in learned.items()},
    }
    combinations: dict[str, HotsetScorer] = {}
    for name, experts in mixes.items():
        combination = PreheatHotset(k, _as_makers(experts), val_windows=0, memory=WEIGHT_WINDOWS)
        combinations[name] = combination.fit(kw, first)
    recall: dict[str, list[float]] = {name: [] for name in [*combinations, *learned]}
    scorers: dict[str, HotsetScorer] = {**combinations, **learned}
    for w in range(first, first + len(starts)):  # in turn: the shared experts keep one window
        for name, scorer in scorers.items():
            scores = scorer.scores(kw, w)  # every window, so the weights see its loss
            if w in windows:
                predicted = top_k(scores, k, kw.last_seen(w))
                recall[name].append(window_metrics(kw.row(w), predicted, k)[1])
    return {name: np.array(values) for name, values in recall.items()}


def _as_makers(experts: Mapping[str, HotsetScorer]) -> dict[str, Callable[[], HotsetScorer]]:
    """`PreheatHotset` takes makers of experts; these are made and fitted already."""
    return {name: _maker(expert) for name, expert in experts.items()}


def _maker(expert: HotsetScorer) -> Callable[[], HotsetScorer]:
    return lambda: expert
