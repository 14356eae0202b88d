"""Online aggregation of experts: AdaHedge with fixed share and BOA, mixed by AdaHedge; past only.

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

AdaHedge alone pays for noise: on a long noisy series the mixability gaps pile up, its rate
falls, and the weights stay spread over experts that lose (a week of 60 s buckets: 1.0125x the
best baseline, significantly worse than it, on 2,520 origins). BOA (Wintenberger, "Optimal
learning with Bernstein Online Aggregation", Machine Learning 2017; the opera R package's
default) keeps a learning rate per expert from the expert's own regret variance and, with the
gradient trick (the loss linearised at the combination's forecast), competes with the best
convex combination of the experts, not only the best one. It tracks slowly: its weights come
from the regret summed since the start, so on losses alone an expert that lost for 200 rounds
needs about 200 winning ones to come back. `Combination` runs both and weights the two by
AdaHedge with fixed share on their own losses, so it follows BOA on a steady series and the
tracking AdaHedge after a switch. Over 13 series (the shipped traces at several bucket sizes,
and a generated week at 60 s; throwaway harness, the experts fitted once, 2026-12-05), the
mean ratio to the best baseline, the series above 1.01x and those significantly below it:
AdaHedge alone 1.0162, 6, 1; BOA alone 0.9923, 1, 3; the two mixed 0.9972, 3, 2. On the
half-and-half switch of losses the mix costs 1.12-1.14x the switching best; BOA alone 2.9x,
and BOA with its sums discounted over 100 rounds 1.7x (that discount also gave up most of its
gain: 1.0036 over the first 12 series).

Rejected: a library. Nothing installed here implements AdaHedge, fixed share or BOA (checked:
scipy, statsmodels, scikit-learn); each update is a dozen lines, and its tests pin it.
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


class BOA:
    """Bernstein online aggregation over `n_experts`, one adaptive learning rate per expert.

    `update` takes each expert's instantaneous regret (the aggregate's loss minus the expert's,
    linearised by the caller where the loss is convex); the weights are
    eta_k exp(eta_k R_k) / Z, with R_k the regret summed less eta_k r_k^2 each round (the
    second-order term that makes the bound depend on the regret's variance, not its range)
    and eta_k = min(1 / (2 B_k), sqrt(ln M / V_k)): B_k the largest |r_k| seen, V_k the sum of
    r_k^2. Scale-free: multiplying every regret by c leaves the weights as they were.
    """

    def __init__(self, n_experts: int) -> None:
        if n_experts < 1:
            raise ValueError("combine at least one expert")
        self.n_experts = n_experts
        self._w = np.full(n_experts, 1.0 / n_experts)  # (M,)
        self.regret = np.zeros(n_experts)  # (M,) R: second-order regularised regret
        self.variance = np.zeros(n_experts)  # (M,) V
        self.range = np.zeros(n_experts)  # (M,) B

    @property
    def weights(self) -> np.ndarray:
        """(M,) non-negative weights summing to 1, for the next round."""
        return self._w.copy()

    def update(self, regret: np.ndarray) -> None:
        """Charge one round: `regret` (M,) finite, one per expert."""
        r = check_losses(np.asarray(regret, dtype=np.float64)[None, :])[0]
        if r.size != self.n_experts:
            raise ValueError(f"{r.size} regrets for {self.n_experts} experts")
        self.variance += r * r
        self.range = np.maximum(self.range, np.abs(r))
        eta = np.zeros(self.n_experts)  # (M,) 0 while an expert has never differed
        seen = self.variance > 0
        log_m = math.log(max(self.n_experts, 2))
        eta[seen] = np.minimum(1 / (2 * self.range[seen]), np.sqrt(log_m / self.variance[seen]))
        self.regret += r - eta * r * r
        if not seen.any():
            return
        log_w = np.full(self.n_experts, -np.inf)
        log_w[seen] = np.log(eta[seen]) + eta[seen] * self.regret[seen]
        z = np.exp(log_w - log_w.max())
        self._w = z / z.sum()

    def state(self) -> dict[str, object]:
        return {"weights": self._w.tolist(), "regret": self.regret.tolist(),
                "variance": self.variance.tolist(), "range": self.range.tolist()}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, object]) -> BOA:
        weights = np.asarray(state["weights"], dtype=np.float64)
        boa = cls(weights.size)
        boa._w = weights
        for name in ("regret", "variance", "range"):
            setattr(boa, name, np.asarray(state[name], dtype=np.float64))
        return boa


class Combination:
    """The experts' weights for forecasts: AdaHedge (fixed share) over two aggregators of the
    experts, the tracking `AdaHedge` and the gradient-trick `BOA`, charged on the two
    aggregators' own absolute errors. `update` takes one round's forecasts and actuals."""

    def __init__(self, n_experts: int, share: float = DEFAULT_SHARE) -> None:
        self.tracking = AdaHedge(n_experts, share)
        self.bernstein = BOA(n_experts)
        self.meta = AdaHedge(2, share, prune=False)  # (tracking, bernstein)

    @property
    def n_experts(self) -> int:
        return self.tracking.n_experts

    @property
    def weights(self) -> np.ndarray:
        """(M,) non-negative weights summing to 1, for the next round.

        An expert whose weight is below twice share / M gets 0, the rest renormalised: the
        floor of `AdaHedge.weights`, for the same reason. BOA never gives an expert 0, so
        without it a combination could not match a perfect expert (steady demand, the registry
        gate's test: 3.9e-5 of an attention model's error kept the candidate off the champion).
        """
        v = self.meta.weights
        mixed = v[0] * self.tracking.weights + v[1] * self.bernstein.weights
        alive = np.where(mixed >= 2 * self.tracking.share / self.n_experts, mixed, 0.0)
        return alive / alive.sum() if alive.any() else mixed

    def update(self, forecasts: np.ndarray, actual: np.ndarray) -> None:
        """Charge one round: `forecasts` (M, C) of the experts over C cells (keys x steps),
        `actual` (C,); the loss is the mean absolute error over the cells."""
        preds = np.asarray(forecasts, dtype=np.float64).reshape(self.n_experts, -1)  # (M, C)
        truth = np.asarray(actual, dtype=np.float64).reshape(-1)  # (C,)
        if not np.all(np.isfinite(preds)):
            bad = int(np.flatnonzero(~np.isfinite(preds).all(axis=1))[0])
            raise ValueError(f"forecasts must be finite: NaN or inf from expert {bad}")
        if truth.size != preds.shape[1] or not np.all(np.isfinite(truth)):
            raise ValueError(f"actuals must be {preds.shape[1]} finite values, one per cell")
        tracked = self.tracking.weights @ preds  # (C,)
        bernstein = self.bernstein.weights @ preds  # (C,)
        self.meta.update(
            np.array([np.abs(tracked - truth).mean(), np.abs(bernstein - truth).mean()])
        )
        gradient = np.sign(bernstein - truth)  # (C,) of |x - y| at BOA's forecast
        self.bernstein.update((gradient * (bernstein - preds)).mean(axis=1))
        self.tracking.update(np.abs(preds - truth).mean(axis=1))

    def state(self) -> dict[str, object]:
        """What a saved model carries to go on updating where it stopped."""
        return {"tracking": self.tracking.state(), "bernstein": self.bernstein.state(),
                "meta": self.meta.state()}  # fmt: skip

    @classmethod
    def from_state(cls, state: dict[str, object]) -> Combination:
        """A saved state; one saved by the AdaHedge-only combination (before 2026-12-05) goes
        on as the tracking half, with BOA and the mix starting fresh."""
        legacy = "tracking" not in state
        tracking = AdaHedge.from_state(state if legacy else state["tracking"])  # type: ignore[arg-type]
        combination = cls(tracking.n_experts, tracking.share)
        combination.tracking = tracking
        if not legacy:
            combination.bernstein = BOA.from_state(state["bernstein"])  # type: ignore[arg-type]
            combination.meta = AdaHedge.from_state(state["meta"])  # type: ignore[arg-type]
        return combination


def online_weights(
    forecasts: np.ndarray,
    actuals: np.ndarray,
    known: Sequence[int] | np.ndarray,
    combination: Combination | None = None,
) -> np.ndarray:
    """(Q, M) the weights at each of Q queries, from the rounds known at it.

    Args:
        forecasts: (M, N, ...) each expert's forecasts of N rounds, rounds in time order.
        actuals: (N, ...) what came, the same cells per round.
        known: (Q,) non-decreasing, each at most N: query q's weights use rounds
            [0, known[q]) only. For a forecast of horizon H at consecutive origins, origin i
            knows i - H + 1 rounds (clipped at 0): the caller's causality lives in `known`.
        combination: the state to start from (updated in place with every known round); default
            a fresh `Combination(M)`.
    """
    preds = np.asarray(forecasts, dtype=np.float64)
    truth = np.asarray(actuals, dtype=np.float64)
    if preds.ndim < 2 or preds.shape[0] == 0 or preds.shape[1:] != truth.shape:
        raise ValueError(
            f"forecasts must be (experts, rounds, ...) with at least one expert and actuals "
            f"(rounds, ...) alike: {preds.shape} and {truth.shape}"
        )
    upto = np.asarray(known, dtype=np.int64)
    if upto.ndim != 1 or np.any(np.diff(upto) < 0):
        raise ValueError("known must be a non-decreasing count of rounds per query")
    if upto.size and (upto.min() < 0 or upto.max() > preds.shape[1]):
        raise ValueError(f"known counts must lie in [0, {preds.shape[1]}] (the rounds given)")
    combination = combination or Combination(preds.shape[0])
    out = np.empty((upto.size, preds.shape[0]))  # (Q, M)
    charged = 0
    for q, n in enumerate(upto):
        for j in range(charged, n):
            combination.update(preds[:, j], truth[j])
        charged = max(charged, int(n))
        out[q] = combination.weights
    return out


def combine(forecasts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(M, N, H) expert forecasts and (N, M) weights -> (N, H) weighted average forecasts."""
    return np.einsum("mnh,nm->nh", forecasts, weights)
