"""`preheat bench hotset`: which K keys will be hottest in the next window, from the past only.

The windows are split once: the first half fits every method (the frequency baselines their
decay, `preheat`'s experts theirs, its weights warmed up on the last of those windows), the
second half scores them all on the same windows. `preheat` is the online combination of the
experts (`models.forecast.hotset_combination`); each expert's own recall on the same windows is
reported beside it (`experts`). `planner` is the same combination over the experts the warm-up
planner fits at every plan (`models.warmup.hot_set.frequency_experts`: last window, EWMA and
decayed frequency), without the champion per-key forecaster the planner adds from the registry,
which a trace has none of. Oracle is the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cache_runtime.traces import TraceError, load_request_keys
from models.forecast.hotset import EwmaFrequency, KeyWindows, LastWindow, Oracle, evaluate_hotset
from models.forecast.hotset_combination import PreheatHotset, hotset_experts
from models.warmup.hot_set import frequency_experts

MIN_WINDOWS = 8  # four to fit on (one of them validation), four to score


def bench_hotset(path: Path, fmt: str, window_s: float, k: int, seed: int = 0) -> dict[str, Any]:
    """The JSON object of `preheat bench hotset` (fields named in issue 4)."""
    times, keys = load_request_keys(path, fmt)
    try:
        kw = KeyWindows.build(times, keys, window_s)
    except ValueError as err:
        raise TraceError(f"{path}: {err}") from None
    if kw.n_windows < MIN_WINDOWS:
        raise TraceError(
            f"{path}: {kw.n_windows} windows of {window_s:g} s, need {MIN_WINDOWS}: "
            "use a shorter --window"
        )
    first_eval = kw.n_windows // 2
    val_windows = max(1, first_eval // 3)
    preheat = PreheatHotset(k, hotset_experts(k, seed), val_windows=val_windows)
    scorers = {
        "preheat": preheat,
        "planner": PreheatHotset(k, frequency_experts(k), val_windows=val_windows),
        "last_window": LastWindow(),
        "ewma_frequency": EwmaFrequency(k),
        "oracle": Oracle(),
    }
    result = evaluate_hotset(kw, scorers, k, first_eval)
    experts = preheat.expert_recall(kw, range(first_eval, kw.n_windows))
    methods = {
        name: {metric: round(value, 4) for metric, value in scores.items()}
        for name, scores in result["methods"].items()
    }
    return {
        "trace": path.name,
        "windows": result["windows"],
        "k": k,
        "window_s": window_s,
        "keys": kw.n_keys,
        "requests": len(kw.times),
        "dropped_partial_window_requests": kw.dropped,
        "first_eval_window": first_eval,
        "methods": methods,
        "preheat_chosen": result["params"]["preheat"]["chosen"],
        "experts": {name: round(recall, 4) for name, recall in experts.items()},
        "params": result["params"],
    }
