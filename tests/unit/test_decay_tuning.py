"""The decay tuner on a small trace: valid output, never worse than the default, near the grid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from cache_runtime.heat import DecayParams
from cache_runtime.policies import HeatPolicy
from flows.bench.traces import load_trace
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
    bad = subprocess.run(
        [preheat, "tune", "decay", "--trace", str(mooncake_like), "--format", "lirs"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "needs per-request timestamps" in bad.stderr


@pytest.mark.integration
def test_tune_decay_flow_logs_to_mlflow_and_publishes_params(
    mooncake_like: Path, tmp_path: Path
) -> None:
    import mlflow

    from flows.tuning.flow import decay_params_path, tune_decay_flow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tune_decay_flow.fn(
        trace=str(mooncake_like), data_dir=str(tmp_path / "data"), mlflow_uri=uri,
        mlflow_artifacts=str(tmp_path / "artifacts"), window=600, rounds=4, grid=5,
    )  # fmt: skip
    params = DecayParams.load(decay_params_path(tmp_path / "data"))
    assert params.half_life_s == pytest.approx(out["best"]["half_life_s"])
    mlflow.set_tracking_uri(uri)
    run = mlflow.get_run(out["run_id"])
    assert run.data.metrics["best_objective"] == pytest.approx(out["best"]["objective"])
    assert run.data.metrics["best_objective"] >= run.data.metrics["default_objective"]
    assert (tmp_path / "artifacts").is_dir()


def test_decay_params_round_trip_and_default(tmp_path: Path) -> None:
    path = tmp_path / "decay.json"
    assert DecayParams.load(path) == DecayParams()
    DecayParams(half_life_s=42.0).save(path, objective=0.1)
    assert DecayParams.load(path).half_life_s == 42.0
    path.write_text("{not json")
    with pytest.raises(ValueError):
        DecayParams.load(path)
