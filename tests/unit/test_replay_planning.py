"""Warm-up plans in the replay: the demand model learned from the stream, and plans sized to
what the worker can deliver before the demand comes."""

from __future__ import annotations

import numpy as np
import pytest

from models.evaluation.replay.demand import DemandModel, cells, isotonic
from models.evaluation.replay.planning import chain_min, deliverable
from models.evaluation.replay.warming import HeatManifest


def _requested_at(at_s: float) -> object:
    """Survival of candidates all first asked for at exactly `at_s`."""
    return lambda delays: (np.asarray(delays) < at_s).astype(float)


def test_isotonic_pools_violators_by_weight() -> None:
    fitted = isotonic(np.array([0.5, 0.2, 0.4, 0.9]), np.array([1.0, 1.0, 2.0, 1.0]))
    assert fitted == pytest.approx([0.35, 0.35, 0.4, 0.9])


def test_chain_min_reaches_the_top_of_every_chain() -> None:
    up = np.array([0, 0, 1, 2, 4])  # a chain 0 <- 1 <- 2 <- 3, and 4 alone
    assert chain_min(np.array([0.2, 0.9, 0.8, 0.95, 0.7]), up).tolist() == pytest.approx(
        [0.2, 0.2, 0.2, 0.2, 0.7]
    )


def test_a_slow_worker_gets_only_what_it_can_deliver_before_the_demand() -> None:
    """Thirty blocks all asked for 10 s after the plan: at 1 s a block the worker delivers nine
    in time and the rest would arrive after their request; at 0.1 s it delivers all thirty."""
    slow, _ = deliverable(np.full(30, 1.0), _requested_at(10.0), 40.0, target=None)
    assert slow.tolist() == list(range(9))
    fast, used = deliverable(np.full(30, 0.1), _requested_at(10.0), 40.0, target=None)
    assert fast.tolist() == list(range(30)) and used == pytest.approx(np.ones(30))
    capped, _ = deliverable(np.full(30, 0.1), _requested_at(10.0), 40.0, None, capacity=5)
    assert len(capped) == 5


def test_blocks_asked_for_before_the_worker_gets_there_are_dropped_and_cost_no_time() -> None:
    """The first five are asked for at 0.5 s, before any could arrive: they leave the plan, and
    the blocks behind them move up (nine of the rest arrive before their request at 10 s)."""
    at = np.r_[np.full(5, 0.5), np.full(25, 10.0)]

    def survival(delays: np.ndarray) -> np.ndarray:
        return (np.asarray(delays) < at).astype(float)

    kept, used = deliverable(np.full(30, 1.0), survival, 40.0, target=None)
    assert kept.tolist() == list(range(5, 14))
    assert used[:5] == pytest.approx(np.zeros(5))


def test_the_cut_meets_the_target_and_the_floor() -> None:
    chance = np.array([0.95, 0.9, 0.55, 0.45, 0.3])

    def survival(delays: np.ndarray) -> np.ndarray:  # P(used) = chance, whenever it arrives
        return np.where(np.asarray(delays) >= 40.0, 0.0, chance)

    kept, _ = deliverable(np.full(5, 0.01), survival, 40.0, target=0.6)
    assert kept.tolist() == [0, 1, 2, 3, 4]  # mean 0.63
    kept, _ = deliverable(np.full(5, 0.01), survival, 40.0, target=0.6, floor=0.5)
    assert kept.tolist() == [0, 1, 2]
    kept, _ = deliverable(np.full(5, 0.01), survival, 40.0, target=0.8)
    assert kept.tolist() == [0, 1, 2]  # mean 0.8


def test_no_block_is_kept_without_its_parent_nor_worth_more() -> None:
    """A prefix cache uses a block only behind its parent: a likely child of an unlikely parent
    is no better than the parent."""
    chance = np.array([0.3, 0.9, 0.9, 0.8])  # 0 <- 1 <- 2, and 3 alone

    def survival(delays: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(delays) >= 40.0, 0.0, chance)

    up = np.array([0, 0, 1, 3])
    kept, used = deliverable(np.full(4, 0.01), survival, 40.0, None, floor=0.5, up=up)
    assert kept.tolist() == [3]
    assert used[:3] == pytest.approx([0.3, 0.3, 0.3])


def _stream(model: DemandModel, requests: list[tuple[float, list[int]]], n: int) -> tuple:
    long, short = HeatManifest(n, 300.0), HeatManifest(n, 30.0)
    for now, blocks in requests:
        seen = np.array(blocks)
        model.observe(now, seen, (long, short))
        long.bump(seen, now)
        short.bump(seen, now)
    return long, short


def test_demand_model_learns_from_the_stream_who_comes_back() -> None:
    """Where the Poisson prior guesses, the stream shows: blocks asked for every 30 s are always
    back within 30 s, and blocks of one-off prompts, hot for a second, never come back."""
    steady = DemandModel(120.0, 120.0, floor=0.5, groups=np.arange(2), probe_every_s=10.0)
    long, short = _stream(steady, [(float(t), [0, 1]) for t in range(0, 600, 30)], 2)
    cell = cells(long.expected_uses(600.0, 120.0), short.expected_uses(600.0, 120.0))[[0]]
    prior = DemandModel(120.0, 120.0, floor=0.5, groups=np.arange(2))
    thirty = np.array([30.0])
    assert steady.survival(cell, thirty)[0] < 0.1 < 0.3 < prior.survival(cell, thirty)[0]

    one_off = DemandModel(120.0, 120.0, floor=0.5, groups=np.arange(300), probe_every_s=10.0)
    bursts = [(float(t) + dt, [t // 2]) for t in range(0, 600, 2) for dt in (0.0, 0.5, 1.0)]
    long, short = _stream(one_off, bursts, 300)
    cell = cells(long.expected_uses(600.0, 120.0), short.expected_uses(600.0, 120.0))[[299]]
    retention = np.array([120.0])
    assert (
        1 - one_off.survival(cell, retention)[0]
        < 0.2
        < 0.5
        < 1 - prior.survival(cell, retention)[0]
    )


def test_demand_model_counts_only_the_delays_a_probe_has_watched() -> None:
    """A probe younger than the retention informs the early delays only, and the forty blocks
    of one prompt count as one piece of evidence."""
    model = DemandModel(10.0, 40.0, floor=0.0, groups=np.zeros(40, dtype=int))
    long, short = HeatManifest(40, 300.0), HeatManifest(40, 30.0)
    model.observe(0.0, np.arange(40), (long, short))  # probes all forty, then sees them asked for
    model.advance(6.0)  # delay bins end at 0.625, 1.25, 2.5, 5, 10, ... (fractions of 40 s)
    assert model.at_risk.sum(axis=0) == pytest.approx([1, 0, 0, 0, 0, 0, 0, 0, 0])
    assert model.events.sum(axis=0) == pytest.approx([1, 0, 0, 0, 0, 0, 0, 0, 0])
    model.advance(45.0)
    assert model.at_risk.sum() == pytest.approx(1) and not model.open


def test_demand_model_starts_from_the_poisson_prior() -> None:
    model = DemandModel(60.0, 120.0, floor=0.5, groups=np.arange(2), prior_weight=5.0)
    cell = cells(np.array([2.0]), np.array([2.0]))  # λ 2 per minute: bin [2, 3)
    assert 1 - model.survival(cell, np.array([120.0]))[0] == pytest.approx(1 - np.exp(-4.0))
