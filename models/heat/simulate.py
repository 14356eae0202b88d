"""Counterfactual heat simulation: what happens to the warm-up plan if something happens?

`simulate` rolls the GAN's generator forward from each key's recent heat, `n_paths` times, for
`horizon` buckets (a chunk of T buckets at a time, each chunk conditioned on the last L buckets
of what came before). An `Event` adds heat to one key at one future bucket — a "sudden news"
burst — and the rollout after it is conditioned on the bumped value, so how the burst fades or
spreads is the model's learned dynamics, not an assumption.

The baseline and the counterfactual share their noise (common random numbers: the same seed
and the same chunk boundaries), so the difference between them is the event's doing, not the
sampling's. The sensitivity summary is about the plan: which keys the warm-up would pick (the
top K by expected heat over the horizon) with and without the events, and how sure that is
(the share of paths in which each key makes the top K).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.heat.gan import HeatGan


@dataclass(frozen=True)
class Event:
    """+`delta` normalised heat to `key` at future bucket `at` (0 = the first simulated one).

    Normalised: `delta` is in units of the key's peak heat in the given history (at least one
    request), so "+0.3" means "30% of its recent peak" for any key, busy or quiet.
    """

    at: int
    key: str
    delta: float

    def __post_init__(self) -> None:
        if isinstance(self.at, bool) or not isinstance(self.at, int | np.integer):
            raise ValueError(f"event time must be a whole number of buckets, got {self.at!r}")
        if self.at < 0:
            raise ValueError(f"event time must be >= 0 buckets ahead, got {self.at}")
        if not np.isfinite(self.delta):
            raise ValueError("event delta must be finite")

    @classmethod
    def parse(cls, text: str) -> Event:
        """`AT:KEY:DELTA`; the key may itself contain colons (`template:…`)."""
        head, sep, rest = text.partition(":")
        key, sep2, delta = rest.rpartition(":")
        if not (sep and sep2 and key):
            raise ValueError(f"event {text!r}: expected AT:KEY:DELTA, e.g. 3:template:abc:0.3")
        try:
            return cls(int(head), key, float(delta))
        except ValueError as err:
            raise ValueError(f"event {text!r}: {err}") from None


@dataclass
class Simulation:
    keys: list[str]
    history: np.ndarray  # (K, L') the heat the rollout started from
    baseline: np.ndarray  # (K, P, H)
    counterfactual: np.ndarray  # (K, P, H); equal to baseline without events
    events: list[Event]
    summary: dict[str, Any] = field(default_factory=dict)


def _rollout(
    model: HeatGan,
    start: np.ndarray,
    horizon: int,
    n_paths: int,
    cuts: Sequence[int],
    bumps: dict[int, np.ndarray],
    seed: int,
) -> np.ndarray:
    """(K, L) start -> (K, P, H) paths. `bumps[t]`: (K,) heat added at bucket t (after it is
    generated, before anything after it is)."""
    config = model.config
    keys = start.shape[0]
    generator = torch.Generator().manual_seed(seed)
    window = np.repeat(start[:, None, :], n_paths, axis=1).astype(np.float32)  # (K, P, L)
    out = np.zeros((keys, n_paths, horizon), dtype=np.float64)
    t = 0
    model.eval()
    while t < horizon:
        end = min([t + config.horizon, horizon, *[c for c in cuts if c > t]])
        noise = torch.randn(keys * n_paths, config.noise_dim, generator=generator)
        with torch.no_grad():
            chunk = model.generator(torch.as_tensor(window.reshape(-1, config.history)), noise)
        chunk = chunk.clamp_min(0.0).numpy().reshape(keys, n_paths, config.horizon)
        out[:, :, t:end] = chunk[:, :, : end - t]
        for at in range(t, end):
            if at in bumps:  # a negative burst takes heat down to 0 at most
                out[:, :, at] = np.maximum(out[:, :, at] + bumps[at][:, None], 0.0)
        both = np.concatenate([window, out[:, :, t:end].astype(np.float32)], axis=2)
        window = both[:, :, -config.history :]
        t = end
    return out


def _top(expected: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest, largest first (ties: the lower index, i.e. a stable order)."""
    return np.argsort(-expected, kind="stable")[:k]


def _share_in_top(paths: np.ndarray, k: int) -> np.ndarray:
    """(K, P, H) -> (K,) share of paths in which each key is in that path's top k."""
    totals = paths.sum(axis=2)  # (K, P)
    ranks = np.argsort(np.argsort(-totals, axis=0, kind="stable"), axis=0)  # (K, P) 0 = top
    return (ranks < k).mean(axis=1)


def sensitivity(
    keys: list[str],
    baseline: np.ndarray,
    counterfactual: np.ndarray,
    top_k: int,
    events: list[Event],
) -> dict[str, Any]:
    """How the plan's top K (by expected heat over the horizon) moves with the events."""
    k = min(top_k, len(keys))
    before_heat = baseline.sum(axis=2).mean(axis=1)  # (K,) expected heat over the horizon
    after_heat = counterfactual.sum(axis=2).mean(axis=1)
    before, after = _top(before_heat, k), _top(after_heat, k)
    entered = [keys[i] for i in after if i not in set(before)]
    left = [keys[i] for i in before if i not in set(after)]
    share_before, share_after = _share_in_top(baseline, k), _share_in_top(counterfactual, k)
    rank_before = np.argsort(np.argsort(-before_heat, kind="stable"))
    rank_after = np.argsort(np.argsort(-after_heat, kind="stable"))
    watched = {e.key for e in events} | set(entered) | set(left)
    index = {key: i for i, key in enumerate(keys)}
    return {
        "top_k": k,
        "baseline_top": [keys[i] for i in before],
        "counterfactual_top": [keys[i] for i in after],
        "entered": entered,
        "left": left,
        "jaccard": round(len(set(before) & set(after)) / len(set(before) | set(after)), 4),
        "keys": {
            key: {
                "expected_heat_before": round(float(before_heat[index[key]]), 4),
                "expected_heat_after": round(float(after_heat[index[key]]), 4),
                "rank_before": int(rank_before[index[key]]) + 1,
                "rank_after": int(rank_after[index[key]]) + 1,
                "share_of_paths_in_top_k_before": round(float(share_before[index[key]]), 4),
                "share_of_paths_in_top_k_after": round(float(share_after[index[key]]), 4),
            }
            for key in sorted(watched)
        },
    }


def simulate(
    model: HeatGan,
    history: np.ndarray,
    keys: Sequence[str],
    n_paths: int = 64,
    horizon: int | None = None,
    events: Sequence[Event] = (),
    top_k: int = 10,
    seed: int = 0,
) -> Simulation:
    """Parallel heat paths for every key, with and without `events`, and the plan's sensitivity.

    Args:
        model: a trained `HeatGan`.
        history: (K, N) heat per key in requests, N >= the model's history L; the last L
            buckets start the rollout.
        keys: (K,) names, unique.
        n_paths: paths per key; horizon: buckets ahead (default: the model's T).
        events: bursts to inject; every event's key must be one of `keys` and its time inside
            the horizon.
        top_k: the plan size the sensitivity is about.

    Raises:
        ValueError: shapes, unknown event keys, events past the horizon, bad counts.
    """
    history = np.atleast_2d(np.asarray(history, dtype=np.float64))
    keys = list(keys)
    horizon = model.config.horizon if horizon is None else horizon
    if history.shape[0] != len(keys) or len(set(keys)) != len(keys):
        raise ValueError("history needs one row per key, and keys must be unique")
    if history.shape[1] < model.config.history:
        raise ValueError(
            f"history has {history.shape[1]} buckets, the model needs {model.config.history}"
        )
    if np.any(history < 0) or not np.all(np.isfinite(history)):
        raise ValueError("history must be finite heat >= 0")
    if n_paths < 1 or horizon < 1 or top_k < 1:
        raise ValueError("n_paths, horizon and top_k must be at least 1")
    index = {key: i for i, key in enumerate(keys)}
    bumps: dict[int, np.ndarray] = {}
    peak = np.maximum(history.max(axis=1), 1.0)  # (K,) the unit an event's delta is in
    for event in events:
        if event.key not in index:
            shown = ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")
            raise ValueError(
                f"event key {event.key!r} is not among the {len(keys)} simulated keys ({shown})"
            )
        if event.at >= horizon:
            raise ValueError(f"event at bucket {event.at} is past the horizon ({horizon})")
        bump = bumps.setdefault(event.at, np.zeros(len(keys)))
        bump[index[event.key]] += event.delta * peak[index[event.key]]
    cuts = sorted({at + 1 for at in bumps})  # the same chunking for both: common random numbers
    start = history[:, -model.config.history :]
    baseline = _rollout(model, start, horizon, n_paths, cuts, {}, seed)
    counterfactual = (
        _rollout(model, start, horizon, n_paths, cuts, bumps, seed) if bumps else baseline
    )
    result = Simulation(keys, history, baseline, counterfactual, list(events))
    result.summary = sensitivity(keys, baseline, counterfactual, top_k, list(events))
    return result


def simulation_figure(result: Simulation, keys: Sequence[str] | None = None) -> Any:
    """History, then the median and 10-90% band of the baseline and counterfactual paths, for
    the event keys (or the plan's top three when there are none)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    shown = (
        list(keys or dict.fromkeys(e.key for e in result.events))
        or result.summary["baseline_top"][:3]
    )
    figure = Figure(figsize=(8, 2.6 * len(shown)))
    axes = figure.subplots(len(shown), 1, squeeze=False)[:, 0]
    shown_history = result.history[:, -max(24, 3 * result.baseline.shape[2]) :]  # (K, <=N)
    past = np.arange(-shown_history.shape[1] + 1, 1)
    future = np.arange(1, result.baseline.shape[2] + 1)
    for ax, key in zip(axes, shown, strict=True):
        row = result.keys.index(key)
        ax.plot(past, shown_history[row], color="black", label="history")
        for name, paths, color in (
            ("baseline", result.baseline[row], "tab:blue"),
            ("counterfactual", result.counterfactual[row], "tab:red"),
        ):
            low, mid, high = np.percentile(paths, [10, 50, 90], axis=0)
            ax.plot(future, mid, color=color, label=f"{name} median")
            ax.fill_between(future, low, high, color=color, alpha=0.2)
        ax.set_title(key)
        ax.set_ylabel("heat (requests)")
        ax.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("buckets from now")
    figure.tight_layout()
    return figure
