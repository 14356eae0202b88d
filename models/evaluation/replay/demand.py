"""How likely, and how soon, a block is asked for again: learned from the request stream itself.

The heat manifest gives each block its expected uses λ in the next window, a Poisson rate read
off the past. Whether a block at that λ is really asked for, and when, depends on the traffic
(how bursty it is, how long sessions live), and a warm-up plan needs both: a block the worker
delivers after its request came is wasted work, and one nobody asks for before the node's tiers
are wiped is a warmed item never used.

`DemandModel` learns it from the traffic the node serves anyway, not from warmed items: every
`probe_every_s` it notes the λ of every block a plan could consider, then watches when each is
first requested. Per λ bin it keeps a survival curve S(d) = P(no request within d): a
Kaplan-Meier estimate over delay bins, each probe adding a delay bin to the counts once it has
watched for all of it — so it knows the past only, and a probe younger than the retention still
informs the early delays (what a plan right after the first restart needs most).

Rejected: learning from warmed items only (the previous `UseCalibration`): at the first restart
there are none, so the first plan ran on the Poisson prior, which on Mooncake warmed nothing
after the first restart; and each item shows one delivery delay, so "nobody wanted it" and
"wanted before it arrived" look alike. Rejected too: one P(requested within the window) per λ
bin: on Mooncake a block at λ ~ 1 is asked for within the 120 s window about half the time but
within the 300 s a warmed block survives three times in four, so a window-only model called
every plan below a 0.6 precision target and warmed nothing until the last restart.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from models.evaluation.replay.warming import HeatManifest

# λ bins (expected uses in the window)
LAMBDA_EDGES = np.array([0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0])
# upper ends of the delay bins, as fractions of the retention: fine where first requests crowd
DELAY_FRACTIONS = np.array([1, 2, 4, 8, 16, 24, 32, 48, 64]) / 64


def isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Non-decreasing weighted least-squares fit of `values` (pool adjacent violators)."""
    merged: list[list[float]] = []  # [mean, weight, count] of each pooled run
    for value, weight in zip(values.tolist(), weights.tolist(), strict=True):
        merged.append([value, weight, 1])
        while len(merged) > 1 and merged[-2][0] > merged[-1][0]:
            (m1, w1, c1), (m2, w2, c2) = merged[-2], merged.pop()
            merged[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2]
    return np.repeat([m for m, _, _ in merged], [int(c) for _, _, c in merged])


@dataclass
class _Probe:
    at: float
    members: np.ndarray  # (M,) blocks probed
    bins: np.ndarray  # (M,) their cells (long λ bin x short λ bin)
    weights: np.ndarray  # (M,) 1 / probed blocks of the same group
    first: np.ndarray  # (n_blocks,) delay of the first request since `at`; inf: none yet
    done: int = 0  # delay bins already counted


class DemandModel:
    """Per cell of blocks, P(first request within d) for d up to `retention_s`, from probes of
    the stream; a cell is a pair of λ bins (the long manifest's, the short one's: how hot,
    and how hot right now).

    Each delay bin's hazard (the share of blocks still unrequested at its start that are
    requested in it) starts from the Poisson prior of the bin's least λ, worth `prior_weight`
    groups (blocks first asked for together share a fate: they count as one), so plans are sane
    before any probe has watched long. Hazards are kept non-decreasing in λ: a bin of a few
    prompts is noisy, and a hotter block being asked for later is never the better bet.
    """

    def __init__(
        self,
        window_s: float,
        retention_s: float,
        floor: float,
        groups: np.ndarray,
        probe_every_s: float | None = None,
        prior_weight: float = 5.0,
    ) -> None:
        """`groups` (n_blocks,): the request that first asked for each block; the blocks that came
        together share a fate (a prompt is asked for again, or not), so one group is one piece
        of evidence."""
        if window_s <= 0 or retention_s <= 0:
            raise ValueError("window_s and retention_s must be positive")
        self.groups, self.n_blocks = groups, len(groups)
        self.window_s, self.retention_s = window_s, retention_s
        self.floor, self.prior_weight = floor, prior_weight
        self.probe_every_s = probe_every_s or min(window_s, retention_s) / 4
        self.next_probe = -np.inf
        self.open: deque[_Probe] = deque()
        self.edges = DELAY_FRACTIONS * retention_s  # (D,) upper end of each delay bin
        shape = ((len(LAMBDA_EDGES) + 1) ** 2, len(self.edges))  # (B x B cells, D)
        self.at_risk, self.events = np.zeros(shape), np.zeros(shape)

    def observe(
        self, now: float, blocks: np.ndarray, manifests: tuple[HeatManifest, ...] | None
    ) -> None:
        """A request for `blocks` (distinct indices) at `now`; `manifests` (long, short), not yet
        bumped with it, give the λs a probe notes when one is due (None: no new probe)."""
        self.advance(now)
        if manifests is not None and now >= self.next_probe:
            long, short = (m.expected_uses(now, self.window_s) for m in manifests)
            members = np.flatnonzero(long >= self.floor)
            first = np.full(self.n_blocks, np.nan)  # nan: not probed
            first[members] = np.inf
            # a group is one piece of evidence, however many of its blocks are probed
            _, group, size = np.unique(
                self.groups[members], return_inverse=True, return_counts=True
            )
            cell = cells(long[members], short[members])
            self.open.append(_Probe(now, members, cell, 1.0 / size[group], first))
            self.next_probe = now + self.probe_every_s
        for probe in self.open:
            seen = probe.first[blocks]
            probe.first[blocks] = np.where(np.isposinf(seen), now - probe.at, seen)

    def advance(self, now: float) -> None:
        """Count what the open probes have watched by `now` (a quiet spell is evidence too)."""
        for probe in self.open:
            self._count(probe, now)
        while self.open and self.open[0].done == len(self.edges):
            self.open.popleft()

    def _count(self, probe: _Probe, now: float) -> None:
        """Add every delay bin `probe` has now watched in full (requests at `now` not yet in)."""
        n_cells = (len(LAMBDA_EDGES) + 1) ** 2
        while probe.done < len(self.edges) and now - probe.at > self.edges[probe.done]:
            j = probe.done
            low = self.edges[j - 1] if j else -np.inf
            delays = probe.first[probe.members]
            at_risk = delays > low
            self.at_risk[:, j] += np.bincount(
                probe.bins[at_risk], probe.weights[at_risk], minlength=n_cells
            )
            event = at_risk & (delays <= self.edges[j])
            self.events[:, j] += np.bincount(
                probe.bins[event], probe.weights[event], minlength=n_cells
            )
            probe.done += 1

    def survival_table(self) -> np.ndarray:
        """(B x B, D + 1) P(no request within each delay edge, 0 first) of each cell.

        Hazards shrink twice: a λ bin's (summed over recency) toward the Poisson prior of its
        least λ, kept non-decreasing in λ; a cell's toward its λ bin's, so recency refines the
        long-term rate where the stream has shown it, and says nothing where it has not.
        """
        k, n_bins = self.prior_weight, len(LAMBDA_EDGES) + 1
        lower = np.concatenate([[0.0], LAMBDA_EDGES])  # (B,) each bin's least λ
        widths = np.diff(np.concatenate([[0.0], self.edges]))  # (D,)
        prior = 1 - np.exp(-np.outer(lower / self.window_s, widths))  # (B, D) Poisson hazards
        at_risk = self.at_risk.reshape(n_bins, n_bins, -1)  # (B long, B short, D)
        events = self.events.reshape(n_bins, n_bins, -1)
        marginal = (events.sum(axis=1) + k * prior) / (at_risk.sum(axis=1) + k)  # (B, D)
        for j in range(marginal.shape[1]):
            marginal[:, j] = isotonic(marginal[:, j], at_risk.sum(axis=1)[:, j] + k)
        hazard = (events + k * marginal[:, None, :]) / (at_risk + k)  # (B, B, D)
        survival = np.cumprod(1 - hazard.reshape(n_bins * n_bins, -1), axis=1)
        return np.concatenate([np.ones((len(survival), 1)), survival], axis=1)

    def survival(self, cell: np.ndarray, delays: np.ndarray) -> np.ndarray:
        """(n,) P(no request within `delays` (n,)) for blocks in `cell` (n,) (see `cells`);
        linear between delay edges, the retention's value beyond it."""
        table = self.survival_table()
        edges = np.concatenate([[0.0], self.edges])  # (D + 1,)
        d = np.clip(np.asarray(delays, dtype=float), 0.0, self.retention_s)
        slot = np.clip(np.searchsorted(edges, d, side="right") - 1, 0, len(self.edges) - 1)
        share = (d - edges[slot]) / (edges[slot + 1] - edges[slot])
        rows = table[cell]  # (n, D + 1)
        at = np.arange(len(d))
        return rows[at, slot] + share * (rows[at, slot + 1] - rows[at, slot])


def cells(long: np.ndarray, short: np.ndarray) -> np.ndarray:
    """(n,) the model's cell of blocks with these λ (n,) under the long and short manifests."""
    bins = np.searchsorted(LAMBDA_EDGES, np.stack([long, short]), side="right")  # (2, n)
    return bins[0] * (len(LAMBDA_EDGES) + 1) + bins[1]
