"""The decay tuner on a small trace: valid output, never worse than the default, near the grid;
and the priority weight: the policy's gain, the objective's weights, the joint search."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest
from helpers import invoke_cli, write_page_lake

from cache_runtime.heat import DecayParams
from cache_runtime.policies import HeatPolicy, LRUPolicy
from cache_runtime.simulator import replay
from cache_runtime.traces import load_trace, trace_from_requests
from models.heat.tuning import LatencyModel, evaluate, tune_decay


@pytest.fixture(scope="module")
def window(mooncake_like: Path):
    trace = load_trace(mooncake_like, "mooncake")
    assert trace.times is not None and len(trace.times) == len(trace.accesses)
    return trace.last_requests(800)


def test_objective_prices_misses_and_rewards_a_bigger_cache(window) -> None:
    small = evaluate(window.accesses, window.request_starts, window.times, 20, 600.0)
    large = evaluate(window.accesses, window.request_starts, window.times, 2000, 600.0)
    assert large["prefix_hit_ratio"] >= small["prefix_hit_ratio"]
    assert large["objective"] >= small["objective"]
    assert small["mean_ms"] >= large["mean_ms"]
    free = LatencyModel(prefill_ms_per_block=2.0, load_ms_per_block=2.0, slo_p99_ms=1e9)
    same = evaluate(window.accesses, window.request_starts, window.times, 2000, 600.0, free)
    assert same["objective"] == pytest.approx(
        0.0, abs=1e-9
    )  # caching saves nothing when loads cost a prefill


def test_tuner_is_never_worse_than_the_default_and_close_to_the_grid(window) -> None:
    capacity = max(1, round(0.1 * window.unique))
    result = tune_decay(
        window.accesses, window.request_starts, window.times, capacity, rounds=8, grid_points=25
    )
    assert len(result["rounds"]) == 8
    assert result["rounds"][0]["lambda"] == pytest.approx(0.5, rel=1e-3)  # the default goes first
    assert result["best"]["objective"] >= result["default"]["objective"]
    assert result["best"]["objective"] >= result["grid_optimum"]["objective"] - 0.05


def test_heat_policy_spans_lru_to_lfu() -> None:
    """A hot key seen often long ago vs a key seen once just now: short half-lives keep the
    recent one (LRU-like), long half-lives the frequent one (LFU-like)."""
    for half_life, survivor in ((1.0, "recent"), (1e6, "frequent")):
        policy = HeatPolicy(half_life)
        policy.on_insert("frequent", 0.0)
        for t in range(1, 20):
            policy.on_access("frequent", float(t))
        policy.on_insert("recent", 100.0)
        victim = policy.victim(lambda key: False)
        assert victim != survivor
    with pytest.raises(ValueError):
        HeatPolicy(0)
    assert DecayParams().half_life_s > 0


@pytest.mark.slow
def test_cli_prints_the_tuning_json(mooncake_like: Path, tmp_path: Path) -> None:
    preheat = str(Path(sys.executable).parent / "preheat")
    command = [preheat, "tune", "decay", "--trace", str(mooncake_like), "--rounds", "4"]
    done = subprocess.run(
        [*command, "--grid", "6", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert {"rounds", "best", "default", "grid_optimum"} <= result.keys()
    bad = invoke_cli(
        "tune", "decay", "--trace", str(mooncake_like), "--format", "lirs", cwd=tmp_path
    )
    assert bad.returncode == 2 and "needs per-request timestamps" in bad.stderr


@pytest.mark.integration
def test_tune_decay_flow_logs_to_mlflow_and_publishes_params(
    prefect_api: None, mooncake_like: Path, tmp_path: Path
) -> None:
    import mlflow

    from flows.tuning.flow import decay_params_path, tune_decay_flow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = decay_params_path(tmp_path / "data")
    DecayParams(priority_weight=1.5).save(path)  # published earlier, from a lake with priorities
    out = tune_decay_flow.fn(
        trace=str(mooncake_like), data_dir=str(tmp_path / "data"), mlflow_uri=uri,
        mlflow_artifacts=str(tmp_path / "artifacts"), window=600, rounds=4, grid=5,
    )  # fmt: skip
    params = DecayParams.load(path)
    assert params.half_life_s == pytest.approx(out["best"]["half_life_s"])
    assert params.priority_weight == 1.5  # Mooncake has no priorities: the weight is kept
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(out["run_id"])
    assert run.data.metrics["best_objective"] == pytest.approx(out["best"]["objective"])
    assert run.data.metrics["best_objective"] >= run.data.metrics["default_objective"]
    assert "best_priority_weight" not in run.data.metrics
    assert (tmp_path / "artifacts").is_dir()

    # the scheduled run reads the lake, whose requests have priorities: the weight is tuned too
    accesses, starts, _, priorities = _vip_and_churn()
    ends = np.append(starts[1:], len(accesses))
    pages = [accesses[a:b].tolist() for a, b in zip(starts, ends, strict=True)]
    write_page_lake(tmp_path / "data", pages, priority=priorities[starts])
    out = tune_decay_flow.fn(
        data_dir=str(tmp_path / "data"), mlflow_uri=uri, mlflow_artifacts=str(tmp_path / "a"),
        window=1200, capacity=0.05, rounds=6, grid=4,
    )  # fmt: skip
    params = DecayParams.load(path)
    assert params.priority_weight == out["best"]["priority_weight"] > 0
    run = mlflow.get_run(out["run_id"])
    assert run.data.metrics["best_priority_weight"] == params.priority_weight
    assert run.data.params["priority_weight_searched"] == "True"


def test_decay_params_round_trip_and_default(tmp_path: Path) -> None:
    path = tmp_path / "decay.json"
    assert DecayParams.load(path) == DecayParams()
    DecayParams(half_life_s=42.0).save(path, objective=0.1)
    assert DecayParams.load(path).half_life_s == 42.0
    path.write_text("{not json")
    with pytest.raises(ValueError):
        DecayParams.load(path)


def test_old_decay_files_load_with_the_default_weight_and_bad_weights_are_rejected(
    tmp_path: Path,
) -> None:
    path = tmp_path / "decay.json"
    DecayParams(half_life_s=42.0, priority_weight=1.5).save(path, objective=0.1)
    assert DecayParams.load(path) == DecayParams(half_life_s=42.0, priority_weight=1.5)
    assert orjson.loads(path.read_bytes())["objective"] == 0.1
    path.write_text('{"half_life_s": 42.0, "objective": 0.1}')  # written before the weight
    assert DecayParams.load(path) == DecayParams(half_life_s=42.0, priority_weight=1.0)
    assert DecayParams().priority_weight == 1.0
    assert DecayParams(priority_weight=0.0).priority_weight == 0.0
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="priority_weight must be a finite number >= 0"):
            DecayParams(priority_weight=bad)
        with pytest.raises(ValueError, match="priority_weight must be a finite number >= 0"):
            HeatPolicy(60.0, bad)


def test_priority_weight_zero_replays_exactly_as_without_priorities(window) -> None:
    priorities = np.random.default_rng(0).integers(1, 11, len(window.accesses))
    capacity = max(1, round(0.1 * window.unique))
    for half_life in (60.0, 6000.0):
        plain = replay(
            HeatPolicy(half_life), window.accesses, window.request_starts, capacity,
            hints=False, times=window.times,
        )  # fmt: skip
        zero = replay(
            HeatPolicy(half_life, priority_weight=0.0), window.accesses, window.request_starts,
            capacity, hints=False, times=window.times, priorities=priorities,
        )  # fmt: skip
        np.testing.assert_array_equal(zero, plain)
    with pytest.raises(ValueError, match="does not weigh accesses by priority"):
        replay(LRUPolicy(), window.accesses, window.request_starts, 10, priorities=priorities)
    with pytest.raises(ValueError, match="priorities must have shape"):
        replay(HeatPolicy(), window.accesses, window.request_starts, 10, priorities=priorities[1:])


def test_a_high_priority_key_outlasts_a_newer_low_priority_one() -> None:
    """Without priorities (or w = 0) the older key goes first; with w > 0 an access of priority
    10 outweighs a newer one of priority 1, and the newer key goes."""
    for weight, evicted in ((None, "vip"), (0.0, "vip"), (1.0, "batch"), (2.0, "batch")):
        policy = HeatPolicy(10.0, 1.0 if weight is None else weight)
        if weight is None:
            policy.on_insert("vip", 0.0)
            policy.on_insert("batch", 1.0)
        else:
            policy.on_insert_priority("vip", 0.0, None, 10)
            policy.on_insert_priority("batch", 1.0, None, 1)
        assert policy.victim(lambda key: False) == evicted
    policy = HeatPolicy(10.0, 1.0)  # repeated low-priority accesses add up
    policy.on_insert_priority("vip", 0.0, None, 10)
    policy.on_insert_priority("batch", 1.0, None, 1)
    for t in range(2, 30):
        policy.on_access_priority("batch", float(t) / 10 + 1, 1)
    assert policy.victim(lambda key: False) == "vip"


def test_objective_with_equal_priorities_is_the_unweighted_one(window) -> None:
    args = (window.accesses, window.request_starts, window.times)
    n = len(window.accesses)
    for capacity, pinned in ((60, 0.065633), (283, 0.20436)):  # measured before priorities
        plain = evaluate(*args, capacity, 600.0)
        assert plain["objective"] == pinned and plain["priority_weight"] is None
        for priority in (5, 9):  # 9: the SLO's high-priority tail is then every request
            same = evaluate(
                *args, capacity, 600.0, priorities=np.full(n, priority), priority_weight=1.7
            )
            assert same == plain
    with pytest.raises(ValueError, match=r"priorities must be in 1\.\.10"):
        evaluate(*args, 60, 600.0, priorities=np.zeros(n, dtype=np.int64))


def _vip_and_churn(requests: int = 1200, seed: int = 0):
    """20% priority-9 requests over 20 prefixes (each back every ~100 requests), 40% priority-2
    requests over 20 other prefixes (back every ~50), 40% priority-1 one-offs; 4 blocks each,
    one request a second. 100 entries hold one of the two reused sets, not both: frequency
    alone keeps the priority-2 set, the priority-weighted objective wants the priority-9 one."""
    rng = np.random.default_rng(seed)
    blocks: list[int] = []
    starts, priorities = [], []
    fresh = 10_000
    for _ in range(requests):
        kind = rng.random()
        starts.append(len(blocks))
        if kind < 0.2:
            blocks += [int(rng.integers(20)) * 4 + j for j in range(4)]
            priorities += [9] * 4
        elif kind < 0.6:
            blocks += [1000 + int(rng.integers(20)) * 4 + j for j in range(4)]
            priorities += [2] * 4
        else:
            blocks += list(range(fresh, fresh + 4))
            fresh += 4
            priorities += [1] * 4
    accesses = np.array(blocks, dtype=np.int64)
    request_starts = np.array(starts, dtype=np.int64)
    times = np.repeat(np.arange(requests, dtype=np.float64), 4)
    return accesses, request_starts, times, np.array(priorities, dtype=np.int64)


def test_tuner_finds_a_priority_weight_that_beats_ignoring_priority() -> None:
    accesses, starts, times, priorities = _vip_and_churn()
    result = tune_decay(
        accesses, starts, times, 100, rounds=8, grid_points=6, priorities=priorities
    )
    assert result["rounds"][0] == {
        "lambda": pytest.approx(0.5, rel=1e-3), "priority_weight": 1.0,
        "objective": result["default"]["objective"],
    }  # fmt: skip
    assert all(r["priority_weight"] is not None for r in result["rounds"])
    best = result["best"]
    assert result["priority_weight"] == best["priority_weight"] > 0
    ignoring = evaluate(
        accesses, starts, times, 100, best["half_life_s"], priorities=priorities,
        priority_weight=0.0,
    )  # fmt: skip
    assert best["objective"] > ignoring["objective"] + 0.05
    assert best["objective"] >= result["default"]["objective"]
    assert result["grid_shape"] == [6, 5]
    assert result["grid_optimum"]["priority_weight"] > 0


def test_one_priority_keeps_the_one_dimensional_search(window) -> None:
    n = len(window.accesses)
    result = tune_decay(
        window.accesses, window.request_starts, window.times, 60, rounds=3, grid_points=4,
        priorities=np.full(n, 5),
    )  # fmt: skip
    assert result["priority_weight"] is None and "not searched" in result["priority_weight_note"]
    assert result["grid_shape"] == [4, 1]
    for entry in (*result["rounds"], result["best"], result["default"], result["grid_optimum"]):
        assert entry["priority_weight"] is None


def test_lake_requests_carry_their_priority_into_the_trace() -> None:
    requests = pd.DataFrame(
        {
            "timestamp": pd.to_datetime([3, 1, 2], unit="s", utc=True),
            "prefix_hashes": [[7, 8], [1, 2, 3], None],
            "prompt_tokens": [20, 40, 5],
            "priority": [9, 2, 5],
        }
    )
    trace = trace_from_requests(requests)
    np.testing.assert_array_equal(trace.accesses, [1, 2, 3, 7, 8])
    np.testing.assert_array_equal(trace.priorities, [2, 2, 2, 9, 9])
    last = trace.last_requests(1)
    np.testing.assert_array_equal(last.priorities, [9, 9])
    assert trace_from_requests(requests.drop(columns="priority")).priorities is None
