"""The pool's choice (`pool.PoolPolicy`): which candidate the memory tier should follow, from what
the shadows hit over a sliding window of sampled accesses.

Apart from the pool because it is the decision, where the pool is the following (the shadows, the
switch, the rebuild, the merge): a rule for choosing is read, tested and changed here without the
cache's state. Compiled with the pool (`compiled.MODULES`): it runs on every sampled access whose
hits differ from the one leaving the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from cache_runtime.candidates import Candidate

# the hysteresis counts at least this many sampled accesses: early on, a challenger needs about
# 5 hits of lead, not 1 (cells short 18 -> 16 of 44: sprite 5-20% lost its early detours to MQ).
# What it protects is the first leader's hints: an application's explicit close pays only once
# conversations end (Mooncake 10% with it: 12.8% of the LRU-Belady gap with 512-799 here, 15.05%
# at 1,024)
EARLY_WINDOW = 1024
# the early window until the first hint has reached the shadows (`forked`): with no hint there is
# nothing that the shadows cannot see yet, and the long early lead only delays a switch the
# shadows have shown (`benchmarks/pool_sweep.py`, 2026-12-07: cells short / summed margin over
# command, held out, generated 11 / +0.0544, 11 / +0.1175, 28 / -0.2232 at 1,024 -> 11 /
# +0.0629, 11 / +0.1209, 26 / -0.2052, the worst ratios and the cells below LRU unchanged).
# The lead is compared in whole hits (4 where keys are sampled, 2 where every key is): 600-799
# give the same cells; 512 leaves 24 generated cells short but lowers their worst ratio
EARLY_WINDOW_PLAIN = 768


class Selector:
    """Names the candidate to follow (`target`): each family (a plain candidate and the hinted
    twins that share its policy) is scored by its chosen member, and the family whose score
    leads the current family's by `lead` x the window takes over (`retarget`).
    `window`: sampled accesses remembered; `lead`: a switch's lead, a share of the window (the
    pool sets it from the hysteresis once it knows whether every key is sampled)."""

    def __init__(self, candidates: Sequence[Candidate], window: int, lead: float) -> None:
        self.window: deque[int] = deque(maxlen=window)  # bit i: candidate i's shadow hit
        self.wins = [0] * len(candidates)  # each candidate's hits over the window
        self.lead = lead
        self.seen = 0  # sampled accesses so far
        self.target = 0  # the candidate the pool should follow
        self.forked = False  # a hint has reached the shadows: hinted twins have their own
        # families: a plain candidate and the hinted twins that share its policy, named by the
        # plain one, their head (a hinted candidate with no plain twin heads its own). Heads in
        # the pool's order of their first member: on a tie the first wins
        self.family = [
            i if (j := plain_twin(candidates, i)) is None else j for i in range(len(candidates))
        ]
        self.heads = list(dict.fromkeys(self.family))
        self.twinned = [
            (head, [i for i, f in enumerate(self.family) if f == head])
            for head in self.heads
            if self.family.count(head) > 1
        ]
        # the member each family is scored by and, leading, followed with: the plain one until
        # a twin's hints are shown to help; the first candidate's own at start, so that an
        # application's explicit close counts before the shadows have evidence
        self.choice = list(range(len(candidates)))
        self.choice[self.family[0]] = 0

    def record(self, hits: int) -> None:
        """One sampled access: bit i of `hits` says whether candidate i's shadow hit it."""
        window, wins = self.window, self.wins
        gone = window[0] if len(window) == window.maxlen else 0
        window.append(hits)
        self.seen += 1
        # most accesses hit or miss in every shadow alike: the wins, and so the target, change
        # only for the candidates whose bit differs from the access leaving the window
        changed = hits ^ gone
        if not changed:
            return
        i = 0
        while changed:
            if changed & 1:
                wins[i] += 1 if (hits >> i) & 1 else -1
            changed >>= 1
            i += 1
        self.retarget()

    def retarget(self) -> None:
        """Each family is scored by its chosen member: another member (a twin, or back to the
        plain head) is chosen once its shadow leads the chosen one's by the lead a switch
        needs, the evidence that its hints help or hurt. The family whose chosen member hit
        most over the window becomes the target's if it leads the current family's by that
        lead, and the target is its choice.
        Why not the candidate with the most hits, whatever its family (until 2026-12-06): a
        twin then led on a hit or two, and a hinted node's path through the families parted
        from its path without hints, at a cost no shadow counts (each switch rebuilds). On
        Mooncake, each hinted replay against the one with a hint less: 6 of 16 cells lower by
        0.0081 in all -> 6 by 0.0039; choosing the family on plain shadows alone lowered none
        for the tail hint but cut the explicit close at 10% from 15% of the LRU-Belady gap to
        8.5% (docs/robustness-log.md)."""
        wins, choice = self.wins, self.choice
        early = EARLY_WINDOW if self.forked else EARLY_WINDOW_PLAIN
        lead = self.lead * max(len(self.window), early)
        if lead < 1.0:
            lead = 1.0
        if self.forked:  # before the first hint twins share a shadow: their wins are equal
            for head, members in self.twinned:
                for i in members:
                    if wins[i] > wins[choice[head]] + lead:
                        choice[head] = i
        current = self.family[self.target]
        best, best_wins = current, wins[choice[current]]
        for head in self.heads:  # a loop, not max with a key: compiled, it is faster
            score = wins[choice[head]]
            if score > best_wins:
                best, best_wins = head, score
        if best_wins > wins[choice[current]] + lead:
            current = best
        self.target = choice[current]


def plain_twin(candidates: Sequence[Candidate], i: int) -> int | None:
    """The plain candidate whose policy hinted candidate `i` shares (its shadow too, while no
    hint has come); None for a plain candidate or a hinted one with no twin."""
    candidate = candidates[i]
    if not candidate.hinted:
        return None
    for j, other in enumerate(candidates):
        if not other.hinted and other.make is candidate.make:
            return j
    return None
