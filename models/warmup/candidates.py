"""Warm-up candidates: what could be warmed for each demand key, and what it would earn and cost.

Per demand key (`models.features.demand.demand_keys`) of the recent requests:

- a KV prefix (`kv_prefix`): the prompt-prefix blocks that more than half of the key's requests
  start with (chained block hashes make that run well defined: a block's hash names every block
  before it). When several keys of a tenant start with the same first block (templates built on
  one system prompt), their common blocks become one shared parent item `kv:prefix:<hash of its
  last block>` with fanout = the number of keys, and each key's own item holds only its blocks
  after it. A key whose blocks are all shared has no item of its own: the parent is its prefix.
- a response and an embedding per exact prompt repeated at least `min_repeats` times.

Predicted hits answer two questions: which keys (each key's share of the next bucket's requests,
from the hot-set combination on the lake: `hot_set.py`) and how many requests (the forecaster's
predictions of every row, "other" included, summed per step over its horizon; without a
forecast, the decayed frequency of the demand series): a key's hits are its share of them
(source `hotset`). Without a hot set (too short a history), the forecaster's per-key predictions
(`forecast`); a key neither names falls back to its decayed frequency over the demand series
(`heat`) or, without demand features, to its request rate over the window
(`recency_frequency`). Rejected: dropping keys the forecaster does not name, which would make a
missing or narrow champion silently empty the plan.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pandera.typing import DataFrame

from cache_runtime.heat import DEFAULT_HALF_LIFE_S
from data_contracts import GRANULARITIES, TOTAL_KEY, DemandSeries, KeyForecast, WarmupCandidate
from data_contracts.dtypes import STRING
from models.features.demand import demand_keys
from models.tiny_llm import build_tiny_gpt2
from models.warmup.kv_chains import kv_candidates

REQUEST_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "tenant",
    "prompt",
    "prompt_tokens",
    "output_tokens",
    "prefix_hashes",
    "template_id",
    "route",
)
_KEYS = ["tenant", "key"]


def kv_bytes_per_token(n_layer: int, n_embd: int, dtype_bytes: int = 4) -> int:
    """KV-cache bytes per token: keys and values of every layer, n_embd = heads x head_dim."""
    return 2 * n_layer * n_embd * dtype_bytes


def tiny_gpt2_kv_bytes_per_token() -> int:
    """The demo model's (`models.tiny_llm`, fp32): 2 x 2 layers x 64 x 4 bytes = 1,024."""
    defaults = inspect.signature(build_tiny_gpt2).parameters
    return kv_bytes_per_token(defaults["n_layer"].default, defaults["n_embd"].default)


@dataclass(frozen=True)
class CostModel:
    """Bytes and seconds of warming, per token or per item.

    Attributes:
        kv_bytes_per_token: KV-cache bytes one prompt token takes (default: the tiny GPT-2's).
        prefill_s_per_token: prefill seconds per prompt token. 0.35 ms is the slope of the
            generated log's latency model (`models.ingest.synthetic`), of the order of a 7B
            model's prefill on one GPU; measure your node's and pass it.
        decode_s_per_token: seconds per generated token (a response hit skips the decode).
        response_bytes_per_token: stored bytes of a response per output token (UTF-8 text).
        embedding_bytes: one MiniLM embedding (384 float32).
        embedding_s: computing one embedding (~5 ms per prompt on one CPU thread).
    """

    kv_bytes_per_token: int = field(default_factory=tiny_gpt2_kv_bytes_per_token)
    prefill_s_per_token: float = 0.00035
    decode_s_per_token: float = 0.02
    response_bytes_per_token: float = 4.0
    embedding_bytes: int = 384 * 4
    embedding_s: float = 0.005

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class CandidateOptions:
    """How far back and ahead to look.

    Attributes:
        horizon_s: seconds ahead that predicted hits cover when there is no forecast (with one,
            its own horizon); the default is the forecaster's: 6 buckets of 3 min.
        half_life_s: the heat fallback's decay half-life.
        window_s: requests older than this before `now` are not looked at.
        min_repeats: an exact prompt seen this often gets response and embedding candidates.
    """

    horizon_s: float = 6 * 180.0
    half_life_s: float = DEFAULT_HALF_LIFE_S
    window_s: float = 86_400.0
    min_repeats: int = 2

    def __post_init__(self) -> None:
        if not (self.horizon_s > 0 and self.half_life_s > 0 and self.window_s > 0):
            raise ValueError("horizon_s, half_life_s and window_s must be positive")
        if self.min_repeats < 2:
            raise ValueError("min_repeats must be at least 2 (one request is not a repeat)")


def build_candidates(
    requests: pd.DataFrame,
    forecast: DataFrame[KeyForecast] | None = None,
    demand: DataFrame[DemandSeries] | None = None,
    costs: CostModel | None = None,
    now: pd.Timestamp | None = None,
    options: CandidateOptions | None = None,
    follows: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
    hot: pd.DataFrame | None = None,
) -> DataFrame[WarmupCandidate]:
    """Candidates for the keys of `requests` (RequestLog columns, at least `REQUEST_COLUMNS`).

    Args:
        requests: recent requests; only those in (now - window_s, now] are used.
        forecast: the champion's per-key predictions, or None when there is no champion.
        demand: one granularity of demand series, for the heat fallback; None or empty to
            fall back to request counts.
        costs: bytes and seconds per token and item.
        now: the plan's time zero; default: where the data ends (the forecast's first bucket,
            else the end of the last demand bucket, else the last request), so an old lake
            plans as of its own end rather than as of the wall clock.
        options: horizon, decay and window.
        follows: optional (None: off): per-key predictions (tenant, key, hits, ...) -> the
            same with more hits for the keys that usually follow the hot ones in sessions
            (`HotspotGraph.successor_boost`, whose docstring says why and where it stops).
        hot: each key's share of the next bucket's requests (tenant, key, share:
            `hot_set.HotSet.shares`), or None to use the forecast's per-key predictions.
    """
    costs, options = costs or CostModel(), options or CandidateOptions()
    now = _data_end(requests, forecast, demand) if now is None else pd.Timestamp(now)
    recent = _recent(requests, now, options.window_s)
    if recent.empty:
        return _validated([])
    predictions = _predictions(recent, forecast, demand, now, options, hot)
    if follows is not None:
        predictions = follows(predictions)
    frames = [
        kv_candidates(recent, predictions, costs.kv_bytes_per_token, costs.prefill_s_per_token),
        *_prompt_candidates(recent, predictions, costs, options.min_repeats),
    ]
    return _validated(frames)


def recent_requests(
    requests: pd.DataFrame,
    forecast: DataFrame[KeyForecast] | None = None,
    demand: DataFrame[DemandSeries] | None = None,
    now: pd.Timestamp | None = None,
    options: CandidateOptions | None = None,
) -> pd.DataFrame:
    """The rows `build_candidates` reads for the same arguments (its window), with their demand
    `key`: the executor resolves each planned item's text from exactly these rows."""
    options = options or CandidateOptions()
    now = _data_end(requests, forecast, demand) if now is None else pd.Timestamp(now)
    return _recent(requests, now, options.window_s)


def _validated(frames: list[pd.DataFrame]) -> DataFrame[WarmupCandidate]:
    columns = list(WarmupCandidate.to_schema().columns)
    frames = [f for f in frames if len(f)]
    if not frames:
        empty = {c: pd.Series(dtype=STRING) for c in columns}
        return WarmupCandidate.validate(pd.DataFrame(empty))
    frame = pd.concat([f[columns] for f in frames], ignore_index=True)
    return WarmupCandidate.validate(frame, lazy=True)


def _data_end(
    requests: pd.DataFrame, forecast: pd.DataFrame | None, demand: pd.DataFrame | None
) -> pd.Timestamp:
    if forecast is not None and len(forecast):
        return pd.Timestamp(forecast["bucket_start"].min())
    if demand is not None and len(demand):
        width = pd.Timedelta(seconds=GRANULARITIES[str(demand["granularity"].iloc[0])])
        return pd.Timestamp(demand["bucket_start"].max()) + width
    if len(requests):
        return pd.Timestamp(requests["timestamp"].max())
    return pd.Timestamp.now(tz="UTC")


def _recent(requests: pd.DataFrame, now: pd.Timestamp, window_s: float) -> pd.DataFrame:
    since = now - pd.Timedelta(seconds=window_s)
    stamps = requests["timestamp"]
    recent = requests[(stamps > since) & (stamps <= now)].reset_index(drop=True)
    recent = recent.assign(key=demand_keys(recent).astype(STRING))
    return recent.dropna(subset=["key"]).reset_index(drop=True)


def _predictions(
    recent: pd.DataFrame,
    forecast: pd.DataFrame | None,
    demand: pd.DataFrame | None,
    now: pd.Timestamp,
    options: CandidateOptions,
    hot: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Per (tenant, key): requests in the window, predicted hits, needed_in_s and source."""
    keys = recent.groupby(_KEYS, observed=True).size().rename("requests").reset_index()
    horizon_s, parts = options.horizon_s, []
    if hot is not None and len(hot):
        predicted, horizon_s = _from_shares(hot, forecast, demand, now, options)
        parts.append(keys.merge(predicted, on=_KEYS, how="inner"))
    elif forecast is not None and len(forecast):
        predicted, horizon_s = _from_forecast(forecast, now)
        parts.append(keys.merge(predicted, on=_KEYS, how="inner"))
    if demand is not None and len(demand):
        source, fallback = "heat", _from_heat(demand, now, horizon_s, options.half_life_s)
    else:
        source, fallback = "recency_frequency", _from_counts(recent, now, horizon_s)
    covered = pd.MultiIndex.from_frame(parts[0][_KEYS]) if parts else []
    rest = keys[~pd.MultiIndex.from_frame(keys[_KEYS]).isin(covered)]
    rest = rest.merge(fallback.assign(source=source), on=_KEYS, how="left")
    parts.append(rest.fillna({"hits": 0.0, "needed_in_s": horizon_s, "source": source}))
    return pd.concat(parts, ignore_index=True)


def _from_forecast(forecast: pd.DataFrame, now: pd.Timestamp) -> tuple[pd.DataFrame, float]:
    """Hits = predictions summed over the horizon; needed when the expected count reaches 1,
    arrivals taken as uniform within a bucket (so a key busy right now is needed in seconds,
    not at 0 s, and a quiet one near the end of the bucket that tips it over 1)."""
    forecast = KeyForecast.validate(forecast, lazy=True)
    forecast = forecast.sort_values([*_KEYS, "step"], ignore_index=True)
    cumulative = forecast.groupby(_KEYS, observed=True)["predicted"].cumsum()
    width_s = GRANULARITIES[str(forecast["granularity"].iloc[0])]
    horizon_s = (forecast["bucket_start"].max() - now).total_seconds() + width_s
    per_key = forecast.groupby(_KEYS, observed=True)["predicted"].sum().rename("hits")
    crossing = forecast[cumulative >= 1.0].assign(before=(cumulative - forecast["predicted"]))
    crossing = crossing.groupby(_KEYS, observed=True).first()
    into_bucket = (1.0 - crossing["before"]) / crossing["predicted"] * width_s
    start_s = (crossing["bucket_start"] - now).dt.total_seconds()
    needed = (start_s + into_bucket).clip(lower=0.0).rename("needed_in_s")
    out = pd.concat([per_key, needed], axis=1).reset_index()
    out["needed_in_s"] = out["needed_in_s"].fillna(horizon_s)
    out["source"] = "forecast"
    return out, float(horizon_s)


def _from_shares(
    hot: pd.DataFrame,
    forecast: pd.DataFrame | None,
    demand: pd.DataFrame | None,
    now: pd.Timestamp,
    options: CandidateOptions,
) -> tuple[pd.DataFrame, float]:
    """Hits = each key's share of the requests to come: the forecast's total per step (its rows
    add up to every tenant's traffic), timed as `_from_forecast` times a key's own forecast;
    without one, the heat's total rate over the horizon."""
    shares = hot[[*_KEYS, "share"]].astype({"tenant": STRING, "key": STRING})
    if forecast is not None and len(forecast):
        forecast = KeyForecast.validate(forecast, lazy=True)
        steps = forecast.groupby(["granularity", "step", "bucket_start"], observed=True)
        totals = steps["predicted"].sum().rename("total").reset_index()  # (H,)
        spread = shares.merge(totals, how="cross")
        spread["predicted"] = spread["share"] * spread["total"]
        predicted, horizon_s = _from_forecast(spread.drop(columns=["share", "total"]), now)
    else:
        if demand is None or not len(demand):
            raise ValueError("hot-set shares need a forecast or demand series for the volume")
        horizon_s = options.horizon_s
        heat = _from_heat(demand, now, horizon_s, options.half_life_s)
        rate = shares.set_index(_KEYS)["share"] * heat["hits"].sum() / horizon_s
        predicted = _rate_frame(rate, horizon_s)
    return predicted.assign(source="hotset"), horizon_s


def _from_heat(
    demand: pd.DataFrame, now: pd.Timestamp, horizon_s: float, half_life_s: float
) -> pd.DataFrame:
    """Rate from exponentially decayed counts, corrected for a history shorter than the decay:
    rate = sum(count x e^(-l x age)) x l / (1 - e^(-l x span)); hits = rate x horizon."""
    demand = DemandSeries.validate(demand, lazy=True)
    if demand["granularity"].nunique() != 1:
        raise ValueError("the heat fallback needs demand series of one granularity")
    demand = demand[(demand["key"] != TOTAL_KEY) & (demand["bucket_start"] < now)]
    width = GRANULARITIES[str(demand["granularity"].iloc[0])] if len(demand) else 1
    middle = demand["bucket_start"] + pd.Timedelta(seconds=width / 2)
    age = (now - middle).dt.total_seconds().clip(lower=0.0).to_numpy()
    decay = math.log(2) / half_life_s
    span = (now - demand["bucket_start"].min()).total_seconds() if len(demand) else width
    weighted = demand[_KEYS].assign(heat=demand["count"].to_numpy() * np.exp(-decay * age))
    heat = weighted.groupby(_KEYS, observed=True)["heat"].sum()
    rate = heat * decay / -math.expm1(-decay * max(span, width))
    return _rate_frame(rate, horizon_s)


def _from_counts(recent: pd.DataFrame, now: pd.Timestamp, horizon_s: float) -> pd.DataFrame:
    """Rate = the key's requests over the span the window actually covers."""
    span = max((now - recent["timestamp"].min()).total_seconds(), 1.0)
    rate = recent.groupby(_KEYS, observed=True).size() / span
    return _rate_frame(rate, horizon_s)


def _rate_frame(rate: pd.Series, horizon_s: float) -> pd.DataFrame:
    """Hits over the horizon and, as a Poisson process, the mean wait for the next request."""
    values = rate.to_numpy(dtype="float64")
    with np.errstate(divide="ignore"):
        wait = np.where(values > 0, 1.0 / np.maximum(values, 1e-300), horizon_s)
    return rate.index.to_frame(index=False).assign(
        hits=values * horizon_s, needed_in_s=np.minimum(wait, horizon_s)
    )


def _prompt_candidates(
    recent: pd.DataFrame, predictions: pd.DataFrame, costs: CostModel, min_repeats: int
) -> list[pd.DataFrame]:
    """A response and an embedding per exact prompt repeated `min_repeats` times or more."""
    prompts = recent.dropna(subset=["prompt"])
    grouped = prompts.groupby([*_KEYS, "prompt"], observed=True).agg(
        seen=("timestamp", "size"),
        prompt_tokens=("prompt_tokens", "mean"),
        output_tokens=("output_tokens", "mean"),
    )
    repeated = grouped[grouped["seen"] >= min_repeats].reset_index()
    if repeated.empty:
        return []
    repeated = repeated.merge(predictions, on=_KEYS, how="inner")
    digest = pd.util.hash_array(repeated["prompt"].to_numpy(dtype=object))
    suffix = pd.Series([f":{d:016x}" for d in digest.tolist()], dtype=STRING)
    common = {
        "tenant": repeated["tenant"],
        "key": repeated["key"],
        "parent": pd.Series(pd.NA, index=repeated.index, dtype=STRING),
        "predicted_hits": repeated["hits"] * repeated["seen"] / repeated["requests"],
        "fanout": 1,
        "needed_in_s": repeated["needed_in_s"],
        "source": repeated["source"],
    }
    full = (
        repeated["prompt_tokens"] * costs.prefill_s_per_token
        + repeated["output_tokens"] * costs.decode_s_per_token
    )
    response_bytes = np.ceil(repeated["output_tokens"] * costs.response_bytes_per_token)
    response = pd.DataFrame(
        {
            **common,
            "item": "response:" + repeated["key"] + suffix,
            "kind": "response",
            "latency_saved_s": full,
            "bytes": response_bytes.clip(lower=1).astype("int64"),
            "compute_s": full,
        }
    )
    embedding = pd.DataFrame(
        {
            **common,
            "item": "embedding:" + repeated["key"] + suffix,
            "kind": "embedding",
            "latency_saved_s": costs.embedding_s,
            "bytes": int(costs.embedding_bytes),
            "compute_s": costs.embedding_s,
        }
    )
    return [response, embedding]
