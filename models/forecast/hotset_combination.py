"""`preheat` hot set: the AdaHedge combination of hot-set scorers, from past windows only.

Each expert (last window, the EWMA and decayed frequencies, the attention model, the feature
booster fitted once and refitted every window) names its top K at every window boundary. When
a window ends its loss is charged to every expert: the share of the window's requests whose key
its top K missed (one minus the recall each window adds to `recall_of_requests`). The weights
of window w come from windows before w only (`combination.AdaHedge`, with its fixed share: the
trace drifts, and the expert that wins early is not the one that wins late).

The combined ranking is the top K of the weighted average of the experts' scores, each scaled
to sum to 1 first: read as its forecast of the share of the next window's requests each key
gets, so the combination is the weighted average forecast and no expert's units dominate. With
one expert holding most of the weight it is that expert's top K. Rejected: a weighted vote over
the experts' top K sets (recall 0.159 / 0.143 / 0.112 at 30 / 60 / 120 s on the Mooncake trace
against 0.167 / 0.145 / 0.115: the vote drops what a heavy expert ranks 51st), following the
heaviest expert (0.157 / 0.143 / 0.112), and drawing one expert at random by the weights (the
textbook randomised forecaster, whose expected loss the regret bound speaks of): the planner
wants one deterministic hot set. The weights are the fixed-share ones as they are: dropping the
experts held up only by the share (as the forecasts do) recalled 0.165 / 0.144 / 0.111.
At 60 s the combination recalls less than EWMA where EWMA holds two thirds of the weight (one
window: 0.109 against 0.134), so the scale of each expert's scores was tried again (2026-12-06,
the experts' scores of `preheat bench hotset` replayed offline, shipped 0.1668 / 0.1442 /
0.1148): weighted reciprocal rank fusion, 1 / (c + rank) at c = 1, 10, 60, 0.1590-0.1611 /
0.1427-0.1447 / 0.1113-0.1138; each expert scaled by the mass of its own top K, by its best
key's score or by its K-th's, 0.1630-0.1641 / 0.1425-0.1445 / 0.1073-0.1133. None reaches EWMA's
0.1475 at 60 s, and each loses at 30 s and 120 s. Nor does another weighting of the same scores
(twenty-second session, offline, shipped 0.1663 / 0.1451 / 0.1148 there): AdaHedge's share at
0.01 or 0.2, 0.1614-0.1626 / 0.1441 / 0.1138-0.1195; BOA on the recall losses, 0.1616 / 0.1464 /
0.1087; equal weights, 0.1649 / 0.1453 / 0.1123; a softmax of the summed losses at temperature
0.01-0.1, 0.1605-0.1639 / 0.1444-0.1466 / 0.1072-0.1194; the shipped weighting without the
weakest experts (attention, last window, the fit-once booster, or two of them), 0.1613-0.1668 /
0.1428-0.1466 / 0.1073-0.1148. Nor each expert's scores replaced by what its ranks were worth
(thirty-first session, offline, the experts of seeds 0-2): the key at rank r scored by the mean
share of the next window's requests that the expert's rank r got over the past windows, over
the top 100-2,000 ranks. Smoothed over bins of 10 ranks, 60 s fell to 0.984-0.998 of the better
baseline in every run; smoothed isotonically or over bins doubling in width, 30 s fell to
0.970-0.998 in 22 of 23 runs. Only bins of 5 held all three windows from 200 ranks on
(1.008-1.050), a width found by looking at these figures: chosen on this one trace, so not
shipped.

The experts are fitted on the windows before the held-back `val_windows`, which warm up the
weights, and refitted on every window before `until` for the windows from `until` on: the same
honesty as the total-series `preheat` (a window is never scored by an expert fitted on it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from models.forecast.combination import AdaHedge, check_losses
from models.forecast.hotset import HotsetScorer, KeyWindows, LastWindow, top_k

HOTSET_SHARE = 0.05  # a few dozen windows, not thousands of origins: switch sooner


def hotset_experts(k: int, seed: int = 0) -> dict[str, Callable[[], HotsetScorer]]:
    """Last window first, then `hotset_models.default_candidates` (imported here: the learned
    experts bring Lightning, which the warm-up planner's combination does without)."""
    from models.forecast.hotset_models import default_candidates

    return {"last_window": LastWindow, **default_candidates(k, seed)}


class PreheatHotset:
    """Scores every key at a window boundary by the experts' weighted vote (see module doc)."""

    def __init__(
        self,
        k: int,
        candidates: dict[str, Callable[[], HotsetScorer]] | None = None,
        val_windows: int = 3,
        share: float = HOTSET_SHARE,
        memory: int | None = None,
    ) -> None:
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share}")
        if memory is not None and memory < 1:
            raise ValueError(f"memory must be at least 1 window, got {memory}")
        if candidates is not None and not candidates:
            raise ValueError("combine at least one hot-set expert")
        self.k, self.val_windows, self.share = k, val_windows, share
        self.memory = memory  # the weights learn from at most this many windows before w
        self.candidates = hotset_experts(k) if candidates is None else candidates
        self.chosen = "adahedge"
        self.notes: list[str] = []
        self.names: list[str] = []
        self._before: list[HotsetScorer] = []  # fitted on windows < val_start
        self._after: list[HotsetScorer] = []  # fitted on windows < until
        self._val_start = self._until = 0
        self._kw: KeyWindows | None = None
        self._tops: dict[int, list[np.ndarray]] = {}  # window -> each expert's top K codes
        self._losses: dict[int, np.ndarray] = {}  # window -> (M,) share of requests missed

    def fit(self, kw: KeyWindows, until: int) -> PreheatHotset:
        val_start = until - self.val_windows
        if val_start < 2:
            raise ValueError(
                f"{until} windows leave too few before the {self.val_windows} held back"
            )
        self._kw, self._val_start, self._until = kw, val_start, until
        self._tops, self._losses, self.notes = {}, {}, []
        self.names, self._before, self._after = [], [], []
        for name, make in self.candidates.items():
            try:
                before = make().fit(kw, val_start)
                after = make().fit(kw, until)
            except ValueError as err:
                self.notes.append(f"{name} left out: {err}")
                continue
            self.names.append(name)
            self._before.append(before)
            self._after.append(after)
        if not self.names:
            raise ValueError("no hot-set candidate could be fitted: " + "; ".join(self.notes))
        return self

    def _experts_at(self, w: int) -> list[HotsetScorer]:
        return self._before if w < self._until else self._after

    def _top(self, kw: KeyWindows, w: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each expert's scores (n_keys,) and top K codes at window w."""
        scores = [np.asarray(e.scores(kw, w), dtype=np.float64) for e in self._experts_at(w)]
        last = kw.last_seen(w)
        tops = [top_k(s, self.k, last) for s in scores]
        self._tops[w] = tops
        return scores, tops

    def _loss(self, kw: KeyWindows, w: int) -> np.ndarray | None:
        """(M,) the share of window w's requests each expert's top K missed; None if w is idle."""
        if w not in self._losses:
            counts = kw.row(w)
            total = counts.sum()
            tops = self._tops.get(w) or self._top(kw, w)[1]
            self._losses[w] = np.array([1.0 - counts[t].sum() / total for t in tops]) if total \
                else np.full(len(tops), np.nan)  # fmt: skip
        loss = self._losses[w]
        return None if np.isnan(loss).all() else loss

    def weights(self, kw: KeyWindows, w: int) -> np.ndarray:
        """(M,) the experts' weights at window w, from windows val_start..w-1 (those with
        requests: an idle window says nothing about who ranks better), the last `memory` of
        them when it is set."""
        self._check(kw)
        hedge = AdaHedge(len(self.names), self.share, prune=False)
        first = self._val_start if self.memory is None else max(self._val_start, w - self.memory)
        for past in range(first, w):
            loss = self._loss(kw, past)
            if loss is not None:
                hedge.update(check_losses(loss[None, :])[0])
        return hedge.weights

    def scores(self, kw: KeyWindows, w: int) -> np.ndarray:
        weights = self.weights(kw, w)  # (M,)
        scores, _ = self._top(kw, w)
        mixed = np.zeros(kw.n_keys)
        for weight, score in zip(weights, scores, strict=True):
            share = np.clip(score, 0.0, None)  # (n_keys,) as shares of the next window
            total = share.sum()
            if total > 0:
                mixed += weight * share / total
        return mixed

    def _check(self, kw: KeyWindows) -> None:
        if self._kw is None:
            raise RuntimeError("fit the preheat hot-set scorer first")
        if kw is not self._kw:
            raise ValueError("score the trace the hot-set combination was fitted on")

    def expert_recall(self, kw: KeyWindows, windows: range) -> dict[str, float]:
        """Each expert's mean recall over `windows` with requests, as `mean_metrics` takes it."""
        losses = [loss for w in windows if (loss := self._loss(kw, w)) is not None]
        if not losses:
            return dict.fromkeys(self.names, 0.0)
        recall = 1.0 - np.mean(losses, axis=0)  # (M,)
        return dict(zip(self.names, recall.tolist(), strict=True))

    @property
    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"chosen": self.chosen, "share": self.share, "notes": self.notes}
        if self._kw is not None:
            last = max(self._losses, default=self._until - 1) + 1
            weights = self.weights(self._kw, last).round(4).tolist()
            held_back = range(self._val_start, self._until)
            out["validation_recall"] = self.expert_recall(self._kw, held_back)
            out["weights_at_last_window"] = dict(zip(self.names, weights, strict=True))
        return out
