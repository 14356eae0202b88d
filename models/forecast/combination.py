"""Online aggregation of experts: AdaHedge weights with a fixed-share step, from past losses only.

`preheat` does not choose one forecaster; it combines them. Every expert (the attention model
and each baseline, or each hot-set scorer) answers every origin; after an origin's actuals are
known its loss is charged to each expert, and the weights of every later origin come from those
losses alone. This is the exponentially weighted average forecaster (Cesa-Bianchi & Lugosi,
"Prediction, Learning, and Games", 2006, ch. 2): for a loss convex in the forecast (absolute
error is), its loss exceeds the best expert's in hindsight by at most a regret that grows like
sqrt(L* ln M), on any sequence, which is what makes "never much worse than the best baseline"
hold on a series nobody tuned for.

The learning rate is AdaHedge's (de Rooij, van Erven, Grunwald & Koolen, "Follow the Leader If
You Can, Hedge If You Must", JMLR 2014): eta = ln(M) / Delta, Delta the cumulative mixability
gap, so there is nothing to tune and the loss scale (requests per bucket or per window) does not
matter; while Delta is 0 it follows the leader. After each update a fixed share `share` of the
weight is spread evenly over the experts (Herbster & Warmuth, "Tracking the Best Expert", 1998;
Cesa-Bianchi & Lugosi section 5.2), so an expert that lost early gets its weight back when it
starts to win: the regret is then against the best *sequence* of experts with few switches, not
only the best single one. The update is multiplicative with the current rate (the weights are a
state, as a server keeping them between requests holds them), which the sharing needs.

Rejected: a library. Nothing installed here implements AdaHedge or fixed share (checked:
scipy, statsmodels, scikit-learn); the update is a dozen lines, and its tests pin it.
Rejected: choosing on one validation slice (what `preheat` did): it ships whatever won there,
and lost by 4-12% to the best baseline on real series where the winner changed later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

DEFAULT_SHARE = 0.01


def check_losses(losses: np.ndarray) -> np.ndarray:
    """(N, M) finite float64 losses, or a ValueError naming what is wrong."""
    arr = np.asarray(losses, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] == 0:
        raise ValueError(f"losses must be (rounds, experts) with at least one expert: {arr.shape}")
    if not np.all(np.isfinite(arr)):
        rows, cols = np.nonzero(~np.isfinite(arr))
        raise ValueError(f"losses must be finite: NaN or inf at round {rows[0]}, expert {cols[0]}")
    return arr


class AdaHedge:
    """The weights over `n_experts`; `update` charges one round's losses, `weights` reads them."""

    def __init__(self, n_experts: int, share: float = DEFAULT_SHARE, prune: bool = True) -> None:
        if n_experts < 1:
            raise ValueError("combine at least one expert")
        if not 0 < share < 1:
            # 0 would let an expert's weight die for good on the first follow-the-leader step.
            raise ValueError(f"share must be in (0, 1), got {share}")
        self.n_experts, self.share, self.prune = n_experts, share, prune
        self._w = np.full(n_experts, 1.0 / n_experts)  # (M,)
        self.gap = 0.0  # Delta: cumulative mixability gap
        self.rounds = 0

    @property
    def weights(self) -> np.ndarray:
        """(M,) non-negative weights summing to 1, for the next round.

        An expert that holds less weight of its own than the share hands every expert (its
        weight below twice share / M) gets 0 here, the rest renormalised. The floor is there
        so that the expert can come back, which the state keeps; letting it vote would put its
        error into every forecast, so a combination could never match a perfect expert (the
        registry's gate, on steady demand, asks exactly that). `prune=False` keeps them (the
        hot set's ranking, where small weights only reorder keys, recalls more with them).
        """
        if not self.prune:
            return self._w.copy()
        floor = self.share / self.n_experts
        alive = np.where(self._w >= 2 * floor, self._w, 0.0)
        return alive / alive.sum() if alive.any() else self._w.copy()

    @property
    def eta(self) -> float:
        """The learning rate for the next round (inf: follow the leader)."""
        if self.n_experts == 1:
            return 0.0
        return math.log(self.n_experts) / self.gap if self.gap > 0 else math.inf

    def update(self, loss: np.ndarray) -> None:
        """Charge one round: `loss` (M,) finite, one per expert."""
        lo = check_losses(np.asarray(loss, dtype=np.float64)[None, :])[0]
        if lo.size != self.n_experts:
            raise ValueError(f"{lo.size} losses for {self.n_experts} experts")
        w, eta = self._w, self.eta
        mixed = float(w @ lo)  # the combination's loss, for a loss linear in the weights
        best = float(lo[w > 0].min())
        if eta == 0.0:
            post, mix = w, mixed
        elif math.isinf(eta):
            post = np.where((lo == best) & (w > 0), w, 0.0)
            mix = best
        else:
            z = w * np.exp(-eta * (lo - best))  # (M,), the best term is w_best >= 0
            post, mix = z, best - math.log(float(z.sum())) / eta
        self.gap += max(mixed - mix, 0.0)
        post = post / post.sum()
        self._w = (1.0 - self.share) * post + self.share / self.n_experts
        self.rounds += 1

    def state(self) -> dict[str, object]:
        """What a saved model carries to go on updating where it stopped."""
        return {"weights": self._w.tolist(), "gap": self.gap, "rounds": self.rounds,
                "share": self.share, "prune": self.prune}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, object]) -> AdaHedge:
        weights = np.asarray(state["weights"], dtype=np.float64)
        share, prune = float(state["share"]), bool(state.get("prune", True))  # type: ignore[arg-type]
        hedge = cls(weights.size, share, prune)
        hedge._w, hedge.gap = weights, float(state["gap"])  # type: ignore[arg-type]
        hedge.rounds = int(state["rounds"])  # type: ignore[call-overload]
        return hedge


def online_weights(
    losses: np.ndarray, known: Sequence[int] | np.ndarray, hedge: AdaHedge | None = None
) -> np.ndarray:
    """(Q, M) the weights at each of Q queries, from the losses of the rounds known at it.

    Args:
        losses: (N, M) per-round, per-expert losses, rounds in time order.
        known: (Q,) non-decreasing, each at most N: query q's weights use rounds
            [0, known[q]) only. For a forecast of horizon H at consecutive origins, origin i
            knows i - H + 1 rounds (clipped at 0): the caller's causality lives in `known`.
        hedge: the state to start from (it is updated in place with every known round); default
            a fresh `AdaHedge(M)`.
    """
    arr = check_losses(losses)
    upto = np.asarray(known, dtype=np.int64)
    if upto.ndim != 1 or np.any(np.diff(upto) < 0):
        raise ValueError("known must be a non-decreasing count of rounds per query")
    if upto.size and (upto.min() < 0 or upto.max() > arr.shape[0]):
        raise ValueError(f"known counts must lie in [0, {arr.shape[0]}] (the rounds given)")
    hedge = hedge or AdaHedge(arr.shape[1])
    out = np.empty((upto.size, arr.shape[1]))  # (Q, M)
    charged = 0
    for q, n in enumerate(upto):
        for row in arr[charged:n]:
            hedge.update(row)
        charged = max(charged, int(n))
        out[q] = hedge.weights
    return out


def combine(forecasts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(M, N, H) expert forecasts and (N, M) weights -> (N, H) weighted average forecasts."""
    return np.einsum("mnh,nm->nh", forecasts, weights)
