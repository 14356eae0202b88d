"""The replay's prefill queue: hand-computed schedules, the textbook limits, utilisation."""

from __future__ import annotations

import numpy as np
import pytest

from models.evaluation.replay.queueing import simulate_queue


def _run(arrivals: list[float], tokens: list[int], loads: list[float] | None = None,
         servers: int = 1, chunk: int = 512, ms_per_token: float = 0.1) -> object:  # fmt: skip
    loads = loads if loads is not None else [0.0] * len(arrivals)
    return simulate_queue(
        np.array(arrivals, dtype=float), np.array(loads), np.array(tokens), servers,
        ms_per_token, chunk,
    )  # fmt: skip


def test_a_lone_request_costs_its_loads_and_its_prefill() -> None:
    result = _run([100.0], [1536], loads=[4.0])
    assert result.done_ms.tolist() == pytest.approx([100 + 4 + 153.6])


def test_chunks_pack_the_next_request_into_the_last_iteration() -> None:
    """A (300 tokens) and B (1000) at 0, chunks of 512 at 10 tokens/ms: the first iteration
    holds A and B's first 212 tokens, so A's token comes at 51.2 ms, not 30; B's 788 left
    take a full chunk and then 276 tokens: 51.2 + 51.2 + 27.6 = 130 ms, as unchunked."""
    result = _run([0.0, 0.0], [300, 1000])
    assert result.done_ms.tolist() == pytest.approx([51.2, 130.0])
    assert result.utilisation() == pytest.approx(1.0)


def test_one_token_chunks_are_plain_fifo() -> None:
    result = _run([0.0, 0.0, 10.0], [300, 1000, 100], chunk=1)
    assert result.done_ms.tolist() == pytest.approx([30.0, 130.0, 140.0])


def test_k_servers_take_the_queue_in_arrival_order() -> None:
    """Two servers, four requests of 100 ms at 0, 0, 0 and 150: the third waits for the first
    server to free (100 -> 200), the fourth finds the second free at 150."""
    result = _run([0.0, 0.0, 0.0, 150.0], [1000] * 4, servers=2, chunk=1)
    assert result.done_ms.tolist() == pytest.approx([100.0, 100.0, 200.0, 250.0])
    # busy 400 ms of 2 x 250 ms
    assert result.utilisation() == pytest.approx(400 / 500)
    assert result.utilisation([(0.0, 100.0)]) == pytest.approx(1.0)
    assert result.utilisation([(200.0, 250.0)]) == pytest.approx(0.5)


def test_a_request_arriving_mid_iteration_waits_for_its_end() -> None:
    """An iteration is scheduled at its start: B (arriving at 10 ms) cannot join A's
    300-token iteration, which ends at 30 ms."""
    result = _run([0.0, 10.0], [300, 100])
    assert result.done_ms.tolist() == pytest.approx([30.0, 40.0])


def test_fully_cached_requests_cost_only_their_loads() -> None:
    result = _run([0.0, 0.0], [0, 0], loads=[2.0, 3.0])
    assert result.done_ms.tolist() == pytest.approx([5.0, 5.0])  # one iteration, both loads


def test_mean_wait_matches_pollaczek_khinchine_for_md1() -> None:
    """Poisson arrivals, a fixed 100 ms service, load 0.5: the mean wait of M/D/1 is
    rho x D / (2 (1 - rho)) = 50 ms; the mean of 40,000 requests is within 5%."""
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(200.0, 40_000))  # one per 200 ms
    result = simulate_queue(arrivals, np.zeros(len(arrivals)), np.full(len(arrivals), 100),
                            servers=1, ms_per_token=1.0, chunk_tokens=1)  # fmt: skip
    wait = result.done_ms - arrivals - 100.0
    assert wait.min() >= -1e-9
    assert wait.mean() == pytest.approx(50.0, rel=0.05)
    assert result.utilisation() == pytest.approx(0.5, abs=0.01)


def test_more_servers_never_make_a_request_later() -> None:
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(20.0, 2000))
    tokens = rng.integers(1, 3000, 2000)
    one, four = (simulate_queue(arrivals, np.zeros(2000), tokens, k, 0.1, 1) for k in (1, 4))
    assert (four.done_ms <= one.done_ms + 1e-9).all()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="arrival order"):
        _run([5.0, 1.0], [1, 1])
    with pytest.raises(ValueError, match="servers"):
        _run([0.0], [1], servers=0)


def test_short_requests_share_an_iteration_and_a_long_one_carries_over() -> None:
    """Chunks of 512 at 10 tokens/ms, one server: A (1200 tokens) at 0 takes two full
    iterations alone (0 -> 102.4 ms); B (100) and C (100) arrive at 50 and join A's last
    iteration with A's 176 tokens left: 376 tokens, done together at 140 ms."""
    result = _run([0.0, 50.0, 50.0], [1200, 100, 100])
    assert result.done_ms.tolist() == pytest.approx([140.0, 140.0, 140.0])
    # busy from 0 to 140 without a gap: A's first chunk (it found the queue empty), its
    # second alone, then the shared iteration
    assert result.busy_start_ms.tolist() == pytest.approx([0.0, 51.2, 102.4])
    assert result.utilisation() == pytest.approx(1.0)


def test_a_new_request_waits_behind_the_heads_chunks_but_fills_the_budget() -> None:
    """A (700) at 0: its first iteration has 512 tokens; B (600) arrives at 10 and joins A's
    second iteration (188 of A + 324 of B), then finishes its 276 alone: FIFO, chunked."""
    result = _run([0.0, 10.0], [700, 600])
    assert result.done_ms.tolist() == pytest.approx([102.4, 130.0])


def test_loads_count_as_busy_time_and_utilisation_stays_in_bounds() -> None:
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(5.0, 3000))
    tokens = rng.integers(0, 2000, 3000)
    loads = rng.uniform(0.0, 3.0, 3000)
    for servers in (1, 3, 8):
        result = simulate_queue(arrivals, loads, tokens, servers, 0.01, 512)
        assert (result.done_ms >= arrivals + loads - 1e-9).all()  # nothing before its loads
        busy = float((result.busy_end_ms - result.busy_start_ms).sum())
        assert busy == pytest.approx(float(tokens.sum() * 0.01 + loads.sum()))
        for low in rng.uniform(0, arrivals[-1], 20):
            windows = [(low, low + rng.uniform(1.0, 500.0))]
            assert 0.0 <= result.utilisation(windows) <= 1.0 + 1e-9
    assert simulate_queue(np.zeros(0), np.zeros(0), np.zeros(0), 2, 0.1, 512).utilisation() == 0


def test_each_bad_engine_parameter_is_refused() -> None:
    for kwargs in ({"servers": 0}, {"chunk": 0}, {"ms_per_token": -0.1}):
        with pytest.raises(ValueError, match="servers and chunk_tokens must be >= 1"):
            _run([0.0], [1], **kwargs)
