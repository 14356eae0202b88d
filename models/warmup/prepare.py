"""One warm-up plan from a data dir: the lake's requests, the demand features and the champion.

Shared by `preheat warmup` (plan only, or plan and execute) and the Prefect flow `warmup`, so
both plan from the same inputs the same way. Failures a user can fix (no lake, an empty lake)
are `LookupError`s with the command to run; a missing or unusable forecaster is not a failure:
the plan falls back to the heat of the demand series and its summary says so. Which keys the
plan expects to be hot is the hot-set combination's (`hot_set.py`), the champion one of its
experts; the summary's `hot_set` gives its weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from data_contracts import GRANULARITIES
from models.warmup.candidates import REQUEST_COLUMNS, recent_requests
from models.warmup.hot_set import MIN_FIT_WINDOWS, HotSet, LearnedRanker, hot_set
from models.warmup.plan import Budgets, CostModel, PlanResult, build_candidates, plan_warmup

if TYPE_CHECKING:
    from models.forecast.registry import Champion

TOP_EXCLUDED = 20


@dataclass(frozen=True)
class PlanOptions:
    """What a user may choose about planning (the CLI's options, the flow's parameters).

    Attributes:
        budgets: bytes per tier, compute seconds and the deadline.
        granularity: demand series for the forecaster and the heat fallback.
        prefill_s_per_token: the node's measured prefill cost.
        top_excluded: how many left-out candidates the plan explains.
        follow_boost: weight of the hotspot graph's successor boost (0: off, the default; see
            `HotspotGraph.successor_boost` for why it is a tilt, not a forecast); used only
            where `mine-templates` has written the graph.
    """

    budgets: Budgets
    granularity: str = "3min"
    prefill_s_per_token: float = 0.00035
    top_excluded: int = TOP_EXCLUDED
    follow_boost: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.follow_boost) and self.follow_boost >= 0):
            raise ValueError(f"follow_boost must be a finite number >= 0, not {self.follow_boost}")
        if self.granularity not in GRANULARITIES:
            choices = ", ".join(GRANULARITIES)
            raise ValueError(f"--granularity {self.granularity!r}: choose one of {choices}")


@dataclass
class PreparedPlan:
    """The plan, its summary (with the forecaster used or why none) and the requests it was
    built from — what the executor resolves each item's text from."""

    result: PlanResult
    recent: pd.DataFrame
    forecaster: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary


class EmptyLake(LookupError):
    """No lake, or a lake without requests: nothing to plan from yet."""


def read_requests(data_dir: Path) -> pd.DataFrame:
    """The lake's requests (the columns planning reads).

    Raises:
        EmptyLake: no lake, or a lake without requests (the message names the fix).
    """
    from data_contracts.lake import lake_of

    if not (Path(data_dir) / "lake").is_dir():
        raise EmptyLake(f"no lake under {data_dir}: run `preheat ingest` first")
    requests = lake_of(data_dir).read("requests", columns=list(REQUEST_COLUMNS))
    if requests.empty:
        why = "holds no requests: run `preheat ingest` first"
        raise EmptyLake(f"the lake under {data_dir} {why}")
    return requests


def load_forecast(
    data_dir: Path, mlflow_uri: str, granularity: str
) -> tuple[pd.DataFrame | None, pd.DataFrame, dict[str, Any], Champion | None]:
    """(forecast or None, the demand series used, {"model"} or {"fallback": why not}, the
    champion that forecast or None).

    The champion reads the granularity it was trained on, whatever `granularity` says. A store
    that does not exist yet holds no champion: it is not created just to find that out.
    """
    from data_contracts.derived import read_demand

    features = Path(data_dir) / "features"
    demand = read_demand(features, granularity)
    if missing_sqlite_store(mlflow_uri):
        why = f"no MLflow store at {mlflow_uri}, so no forecaster"
        return None, demand, {"fallback": why}, None
    from models.forecast.registry import load_champion

    try:
        champion = load_champion(mlflow_uri)
    except LookupError as err:
        return None, demand, {"fallback": str(err)}, None
    trained_on = str(champion.meta.get("granularity", granularity))
    if trained_on != granularity:
        demand = read_demand(features, trained_on)
    if demand.empty:
        why = f"no {trained_on} demand features: run `preheat features`"
        return None, demand, {"fallback": why}, None
    try:
        forecast = champion.predict_per_key(demand)
    except ValueError as err:  # e.g. less history than the model reads
        why = f"{champion.name} v{champion.version} failed: {err}"
        return None, demand, {"fallback": why}, None
    return forecast, demand, {"model": f"{champion.name} v{champion.version}"}, champion


def _hot_set(demand: pd.DataFrame, ranker: LearnedRanker | None) -> tuple[HotSet | None, str]:
    """(the hot set, "") or (None, why not): no hot set is no failure, the plan falls back to
    the forecast's per-key predictions and the heat."""
    if demand.empty:
        return None, "no demand features: run `preheat features`"
    try:
        hot = hot_set(demand, ranker)
    except ValueError as err:  # demand the contract allows and windows cannot hold
        return None, f"the demand series cannot be read as windows: {err}"
    if hot is None:
        return None, f"fewer than {MIN_FIT_WINDOWS} buckets of demand before the weights' ones"
    return hot, ""


def missing_sqlite_store(uri: str) -> bool:
    """True for a `sqlite:///` URI whose file does not exist (opening it would create it)."""
    return uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file()


def successor_boost(
    data_dir: Path, weight: float
) -> tuple[Callable[[pd.DataFrame], pd.DataFrame] | None, dict[str, Any] | None]:
    """(the hotspot graph's boost at `weight`, or None; what the summary says about it).

    None and nothing to say when the weight is 0; None and the reason when no graph was mined.
    """
    if weight == 0:
        return None, None
    from models.templates.hotspot import HotspotGraph, graph_path

    path = graph_path(Path(data_dir) / "features")
    if not path.is_file():
        return None, {"weight": weight, "off": f"no hotspot graph at {path}: run mine-templates"}
    graph = HotspotGraph.from_json(path)
    return partial(graph.successor_boost, weight=weight), {"weight": weight, "graph": str(path)}


def plan_from_lake(data_dir: Path, mlflow_uri: str, options: PlanOptions) -> PreparedPlan:
    """Read, forecast, build candidates and plan; the summary names the forecaster or the
    fallback that replaced it.

    Raises:
        LookupError: no lake or no requests in it.
    """
    requests = read_requests(Path(data_dir))
    forecast, demand, forecaster, champion = load_forecast(
        Path(data_dir), mlflow_uri, options.granularity
    )
    costs = CostModel(prefill_s_per_token=options.prefill_s_per_token)
    follows, boost = successor_boost(Path(data_dir), options.follow_boost)
    ranker = None if champion is None or forecast is None else LearnedRanker.of(champion, forecast)
    hot, no_hot_set = _hot_set(demand, ranker)
    candidates = build_candidates(
        requests, forecast, demand, costs, follows=follows,
        hot=None if hot is None else hot.shares,
    )  # fmt: skip
    result = plan_warmup(candidates, options.budgets, options.top_excluded)
    summary = result.summary
    summary["forecaster"] = forecaster.get("model")
    if hot is None:
        summary["hot_set"] = {"off": no_hot_set}
    else:  # how many requests come: the forecast's rows, or without one the heat's total
        summary["hot_set"] = {**hot.summary(), "volume": "heat" if forecast is None else "forecast"}
    if boost is not None:
        summary["follow_boost"] = boost
    if forecaster.get("fallback"):
        note = summary["fallback"]
        summary["fallback"] = forecaster["fallback"] + (f"; {note}" if note else "")
    recent = recent_requests(requests, forecast, demand)
    return PreparedPlan(result=result, recent=recent, forecaster=forecaster)
