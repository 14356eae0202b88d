"""`preheat bench forecast`: the platform's forecaster next to the practitioners' baselines.

The trace is read through the ingestion formats (so a bad row is quarantined, not a crash, and
the benchmark sees exactly what the lake would hold), turned into one total-request series at
`--bucket` seconds, cut chronologically, and every method is scored by rolling origin on the test
part. `preheat` is the online combination of the attention model and every baseline
(`models.forecast.selection`): its weights at each test origin come from the errors of origins
whose actuals were known by then, so it is scored as it would run. Beside the block-bootstrap
interval of the MAE gap, a paired test over origins (Diebold-Mariano with the Harvey-Leybourne-
Newbold correction, and a one-sided Wilcoxon signed-rank test) says whether `preheat` is
significantly below the best baseline in hindsight.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cache_runtime.traces import TraceError
from models.forecast.attention import AttentionConfig, AttentionForecaster
from models.forecast.baselines import baseline_suite
from models.forecast.evaluation import (
    Evaluation,
    chronological_split,
    compare_to_best_baseline,
    evaluate,
)
from models.forecast.metrics import diebold_mariano
from models.forecast.selection import PreheatForecaster
from models.ingest.detect import resolve_format
from models.ingest.formats import DEFAULT_EPOCH, SourceContext
from models.ingest.pipeline import process_chunk, record_chunks
from models.ingest.readers import InputError

FORECAST_FORMATS = ("azure", "mooncake", "servegen", "jsonl")
CHUNK = 50_000


def _frames(path: Path, fmt_name: str) -> tuple[list[pd.DataFrame], int, str]:
    """The trace's accepted rows, chunk by chunk, cut to the columns a series needs (a week of
    a service's requests runs to millions of rows: neither its records nor its full rows are held
    whole; 2M Azure rows took 2.1 GB held whole, 0.8 GB so), the rows quarantined, and the lake
    table the format writes."""
    try:
        fmt = resolve_format(path, fmt_name)
    except InputError as err:
        raise TraceError(str(err)) from None
    ctx = SourceContext(source=str(path.resolve()), tenant="default", epoch=DEFAULT_EPOCH)
    needed = ["bucket_start", "count"] if fmt.table == "demand" else ["timestamp"]
    frames, quarantined = [], 0
    for chunk in record_chunks(fmt.records(path), CHUNK):
        result = process_chunk(fmt, chunk, ctx)
        frames.append(result.good[needed])
        quarantined += len(result.quarantine)
    return frames, quarantined, fmt.table


def total_series(path: Path, fmt_name: str, bucket_s: int) -> tuple[np.ndarray, int, int]:
    """(T,) requests per whole `bucket_s` bucket from the first request on, the rows
    quarantined, and the requests of the final partial bucket, dropped.

    Empty buckets inside the span are zeros (no request is a real observation). The bucket the
    trace ends inside is dropped, as the hot set drops its partial window (`KeyWindows`): it
    holds only part of a bucket's requests, so as a target it would score every method against
    a drop that never happened (Azure code at 10 s ends 6 s into its last bucket: 68 requests
    after 132). An event trace is known only up to its last request, so the bucket holding that
    request is partial; a rate trace's windows each cover their width. Rate traces (ServeGen)
    already come as 10-minute windows, so their bucket must be a multiple of that.
    """
    if fmt_name not in FORECAST_FORMATS:
        raise TraceError(
            f"unknown format {fmt_name!r}; choose one of {', '.join(FORECAST_FORMATS)}"
        )
    if bucket_s < 1:
        raise TraceError(f"--bucket must be a positive number of seconds, got {bucket_s}")
    frames, quarantined, table = _frames(path, fmt_name)
    frame = pd.concat(frames) if frames else pd.DataFrame()
    if frame.empty:
        raise TraceError(f"{path}: no valid rows in {fmt_name} format ({quarantined} quarantined)")
    if table == "demand":
        width = int(frame["bucket_start"].diff().dropna().min().total_seconds() or bucket_s)
        if bucket_s % width:
            raise TraceError(f"--bucket {bucket_s} is not a multiple of the trace's {width} s")
        seconds = (frame["bucket_start"].astype("int64") // 1_000_000_000).to_numpy()
        weights = frame["count"].to_numpy(dtype=np.float64)
    else:
        seconds = (frame["timestamp"].astype("int64") // 1_000_000_000).to_numpy()
        weights, width = np.ones(len(seconds)), 0
    covered = int(seconds.max() - seconds.min()) + width  # seconds the trace is known to span
    whole = covered // bucket_s
    if whole < 1:
        raise TraceError(f"{path}: the trace spans less than one {bucket_s} s bucket")
    index = (seconds - seconds.min()) // bucket_s
    kept = index < whole
    series = np.bincount(index[kept], weights=weights[kept], minlength=whole)
    return series.astype(np.float64), quarantined, round(float(weights[~kept].sum()))


def paired_test(evaluation: Evaluation, method: str, baseline: str) -> dict[str, Any]:
    """`method` against `baseline` over the same origins: DM statistic and p-values, Wilcoxon."""
    from scipy import stats

    a = evaluation.scores[method].origin_errors
    b = evaluation.scores[baseline].origin_errors
    stat, p_two, p_lower = diebold_mariano(a, b, evaluation.horizon)
    wilcoxon = stats.wilcoxon(a, b, alternative="less") if np.any(a != b) else None
    return {
        "against": baseline,
        "origins": int(a.size),
        "dm_statistic": round(stat, 4),
        "dm_p_two_sided": round(p_two, 4),
        "dm_p_lower": round(p_lower, 4),
        "wilcoxon_p_lower": 1.0 if wilcoxon is None else round(float(wilcoxon.pvalue), 4),
        "significantly_lower": bool(p_lower < 0.05),
    }


class AttentionAlone:
    """The attention model alone: `preheat`'s own attention expert, which `evaluate` has fitted
    on the same train part, config and seed by the time it fits this (it fits `preheat` first);
    fitting a second copy trained the same model again, about half of the bench's time on a
    week of buckets. Before `preheat` is fitted, or where it left attention out (too little
    data before its held-back slice), a model of its config is fitted here."""

    name = "attention"

    def __init__(self, preheat: PreheatForecaster) -> None:
        self.preheat = preheat
        self.model: AttentionForecaster | None = None

    def fit(self, train: np.ndarray) -> AttentionAlone:
        # an expert in `experts` was refitted on the whole train part: one that fitted on the
        # part before the slice fits on more data too
        experts = [e for e in self.preheat.experts if isinstance(e, AttentionForecaster)]
        self.model = experts[0] if experts else None
        if self.model is None:
            self.model = AttentionForecaster(self.preheat.attention_config).fit(train)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError("fit the attention forecaster before forecasting")
        return self.model.forecast(series, origins, horizon)


def bench_forecast(
    path: Path,
    fmt_name: str,
    bucket_s: int,
    horizon: int,
    season: int | None = None,
    test_frac: float = 0.25,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The JSON object of `preheat bench forecast` (fields named in issue 4)."""
    say = progress or (lambda _msg: None)
    series, quarantined, dropped = total_series(path, fmt_name, bucket_s)
    try:
        split = chronological_split(len(series), test_frac)
    except ValueError as err:
        raise TraceError(f"{path}: {err}") from None
    config = AttentionConfig(horizon=horizon, seed=seed)
    preheat = PreheatForecaster(horizon, season, attention=config)
    methods = {
        "preheat": preheat,  # fitted first: "attention" below reuses its expert
        "attention": AttentionAlone(preheat),
        **{b.name: b for b in baseline_suite(season)},
    }
    say(f"{len(series)} buckets, {len(series) - split} test; fitting {len(methods)} methods")
    evaluation = evaluate(methods, series, split, horizon)
    baselines = [name for name in methods if name not in ("preheat", "attention")]
    comparison = compare_to_best_baseline(evaluation, "preheat", baselines, seed=seed)
    assert preheat.selection is not None  # set by fit inside evaluate
    summary = {
        name: {"MAE": round(s.mae, 4), "sMAPE": round(s.smape, 4), "MASE": round(s.mase, 4)}
        for name, s in evaluation.scores.items()
    }
    summary["preheat"]["chosen"] = preheat.selection.chosen
    names = [e.name for e in preheat.experts]
    last = preheat.weights(series, np.array([len(series) - horizon]))[0]
    return {
        "trace": path.name,
        "buckets": len(series),
        "test_buckets": len(series) - split,
        "bucket_s": bucket_s,
        "horizon": horizon,
        "season": season,
        "quarantined_rows": quarantined,
        "dropped_partial_bucket_requests": dropped,
        "methods": summary,
        "best_baseline": comparison.best_baseline,
        "mae_diff_ci95": [round(v, 4) for v in comparison.mae_diff_ci95],
        "preheat_mase_ratio_to_best_baseline": round(
            comparison.method_mase / comparison.baseline_mase, 4
        ),
        "paired_test": paired_test(evaluation, "preheat", comparison.best_baseline),
        # the learned expert alone against the same baseline: where it is not significantly
        # lower either, no weighting of the experts can be (the combination's shortfall is theirs)
        "attention_paired_test": paired_test(evaluation, "attention", comparison.best_baseline),
        "validation": {k: round(v, 4) for k, v in preheat.selection.validation_mae.items()},
        "weights_at_train_end": {k: round(v, 4) for k, v in preheat.selection.weights.items()},
        "weights_at_last_origin": {n: round(float(w), 4) for n, w in zip(names, last, strict=True)},
        "notes": preheat.selection.notes,
    }
