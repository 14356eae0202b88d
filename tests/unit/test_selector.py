"""The pool's choice (`cache_runtime.selector`): the wins it counts over the window, and the
families it scores, without a cache (the pool following the choice: test_pool_policy.py)."""

from __future__ import annotations

import numpy as np
import pytest

from cache_runtime.candidates import CANDIDATES, DEFAULT_POOL
from cache_runtime.pool import DEFAULT_HYSTERESIS, DEFAULT_WINDOW
from cache_runtime.selector import EARLY_WINDOW, EARLY_WINDOW_PLAIN, Selector

LEAD = DEFAULT_HYSTERESIS * DEFAULT_WINDOW  # a switch's lead over a full window, in hits


def _selector(names: tuple[str, ...] = DEFAULT_POOL, window: int = DEFAULT_WINDOW) -> Selector:
    return Selector([CANDIDATES[name] for name in names], window, DEFAULT_HYSTERESIS)


def _scored(selector: Selector, names: tuple[str, ...], wins: list[int]) -> str:
    """The target after `retarget` over a full window of `wins`, the twins forked (as after the
    first hint: before it they share a shadow, so their wins cannot differ)."""
    selector.forked = True
    selector.window.clear()
    selector.window.extend([0] * DEFAULT_WINDOW)
    selector.wins = list(wins)
    selector.retarget()
    return names[selector.target]


@pytest.mark.parametrize("window", [64, 4096])
def test_the_wins_are_the_windows_hits_per_candidate(window: int) -> None:
    """`record` counts each candidate's hits over the window from only the bits that change:
    checked against a count of the window itself, full (64) and not (4096)."""
    selector = _selector(window=window)
    rng = np.random.default_rng(7)
    for hits in rng.integers(0, 1 << len(DEFAULT_POOL), 3_000).tolist():
        selector.record(hits)
    counted = [sum((b >> i) & 1 for b in selector.window) for i in range(len(DEFAULT_POOL))]
    assert selector.wins == counted and all(counted)
    assert len(selector.window) == min(window, selector.seen) and selector.seen == 3_000


@pytest.mark.parametrize("hinted", [True, False])
def test_early_on_the_lead_counts_a_full_early_window(hinted: bool) -> None:
    """With a few accesses in the window the lead is still a share of an early window (not of
    the few seen, which would make one hit a lead): once a hint has reached the shadows,
    `EARLY_WINDOW` accesses, about 5 hits, and MQ, hitting where LRU misses, takes over on its
    sixth hit of lead; with no hint yet `EARLY_WINDOW_PLAIN`, on its fourth."""
    names = ("lru", "mq")
    selector = _selector(names)
    selector.forked = hinted
    early_lead = DEFAULT_HYSTERESIS * (EARLY_WINDOW if hinted else EARLY_WINDOW_PLAIN)
    assert (5 < early_lead < 6) if hinted else (3 < early_lead < 4)
    for n in range(1, 7):
        selector.record(0b10)  # MQ hits, LRU misses
        assert names[selector.target] == ("mq" if n > early_lead else "lru"), n
    assert selector.wins == [0, 6]


def test_a_family_is_scored_by_its_twin_only_once_the_twins_hints_have_paid_the_lead() -> None:
    """A hinted twin replaces its plain head, as the family's score and as the target, once its
    shadow leads the head's by a switch's full lead; a lead short of that moves nothing, even
    where the twin alone would lead every other family (which the pool followed before,
    parting its path from the one it takes without the hints)."""
    assert LEAD > 4
    names = ("lru", "prefix-slru", "slru")
    selector = _selector(names)
    assert selector.choice == [0, 1, 2] and selector.family == [0, 2, 2]  # plain heads
    short, enough = round(0.75 * LEAD), round(1.5 * LEAD)
    # the twin leads LRU by 1.5 leads, but its own head by 0.75: the family is still SLRU's head
    assert _scored(selector, names, [100, 100 + enough, 100 + enough - short]) == "lru"
    assert selector.choice[2] == 2
    # the twin leads its head by 1.5 leads: it scores the family, which now leads LRU
    assert _scored(selector, names, [100, 100 + enough, 100]) == "prefix-slru"
    assert selector.choice[2] == 1
    # and it stays the family's until the head leads it back by a lead
    assert _scored(selector, names, [100, 100 + enough, 100 + enough + short]) == "prefix-slru"
    assert _scored(selector, names, [100, 100 + enough, 100 + 2 * enough]) == "slru"


def test_before_the_first_hint_the_twins_are_never_chosen_apart() -> None:
    """Unforked, twins share a shadow, so wins that differ between them (which the pool never
    records) move no choice."""
    names = ("lru", "prefix-slru", "slru")
    selector = _selector(names)
    selector.window.extend([0] * DEFAULT_WINDOW)
    selector.wins = [100, 100 + round(3 * LEAD), 100]
    selector.retarget()
    assert selector.choice == [0, 1, 2] and names[selector.target] == "lru"


def test_the_first_candidate_leads_with_its_own_hints_until_the_shadows_disagree() -> None:
    """The pool's first candidate is its family's choice from the start, hinted or not, so an
    application's explicit close counts before the shadows have evidence; the other families
    start from their plain heads."""
    selector = _selector()
    first, lirs, arc = (DEFAULT_POOL.index(n) for n in ("prefix-lirs", "lirs", "prefix-arc"))
    assert selector.target == first and selector.family[first] == lirs
    assert selector.choice[lirs] == first
    assert selector.choice[selector.family[arc]] == selector.family[arc] != arc
    even = [100] * len(DEFAULT_POOL)
    ahead = {lirs: round(0.75 * LEAD)}  # the plain twin ahead, by less than a switch's lead
    wins = [w + ahead.get(i, 0) for i, w in enumerate(even)]
    assert _scored(selector, DEFAULT_POOL, wins) == "prefix-lirs"
    ahead = {lirs: round(1.5 * LEAD)}
    wins = [w + ahead.get(i, 0) for i, w in enumerate(even)]
    assert _scored(selector, DEFAULT_POOL, wins) == "lirs"


def test_a_hinted_candidate_without_a_plain_twin_heads_its_own_family() -> None:
    names = ("prefix-arc", "lru")
    selector = _selector(names)
    assert selector.family == [0, 1] and selector.heads == [0, 1] and selector.twinned == []
