"""The A/B replay: exact latency on tiny traces, restarts, rehydration from the past only, Redis;
the fast (simulated) tiers against the real ones; the CLI's JSON, flags and report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from helpers import invoke_cli, run_cli

from cache_runtime.traces import AccessTrace
from models.evaluation.replay.engine import (
    PreparedTrace,
    ReplayConfig,
    after_restart_mask,
    limit_redis,
    replay_arm,
    request_times,
    run_replay,
)
from models.evaluation.replay.latency import ReplayLatency

pytestmark = pytest.mark.integration

LATENCY = ReplayLatency(
    prefill_ms_per_token=0.1, load_ms_per_block={"memory": 1.0, "ssd": 2.0, "redis": 3.0},
    base_ms=10.0, source="test",
)  # fmt: skip


def _trace(requests: list[tuple[float, list[int]]], tokens: int = 512) -> AccessTrace:
    """A trace from (time s, block ids) requests; every block holds `tokens` tokens."""
    blocks = [b for _, ids in requests for b in ids]
    starts = np.cumsum([0] + [len(ids) for _, ids in requests[:-1]])
    times = [t for t, ids in requests for _ in ids]
    return AccessTrace(
        "test", np.array(blocks), starts.astype(np.int64), np.array(times, dtype=float),
        np.full(len(blocks), tokens),
    )  # fmt: skip


def _arm(trace: AccessTrace, **config: object) -> object:
    settings = {"memory": 1.0, "ssd": 1.0, **config}
    return replay_arm(PreparedTrace.build(trace), ReplayConfig(**settings), LATENCY)


def test_ttft_prices_prefix_hits_and_prefill_exactly() -> None:
    # request 2 shares blocks 1, 2 with request 1, then diverges: 2 hits, 1 prefill
    trace = _trace([(0.0, [1, 2, 3]), (1.0, [1, 2, 4]), (2.0, [5, 2])])
    result = _arm(trace, memory=1.0, ssd=0.0)
    # one server of 10 idle when each arrives: no wait, prefill in chunks of 512 tokens
    expected = [10 + 3 * 51.2, 10 + 2 * 1.0 + 51.2, 10 + 2 * 51.2]
    assert result.ttft_ms.tolist() == pytest.approx(expected)
    assert result.hit_blocks.tolist() == [0, 2, 0]  # block 2 of request 3 follows a miss


def test_restart_empties_local_tiers_and_restore_reference_does_not() -> None:
    trace = _trace([(float(t), [1, 2, 3]) for t in range(0, 100, 5)])
    restarted = _arm(trace, restart_every_s=50.0)
    assert restarted.restarts == [50.0]
    first_after = int(np.searchsorted(np.arange(0, 100, 5), 50))
    assert restarted.hit_blocks[first_after] == 0  # cold after the restart
    summary = run_replay(
        trace, ReplayConfig(memory=1.0, ssd=1.0, restart_every_s=50.0, window_s=20), LATENCY
    )
    assert summary["after_restart"]["requests"] == 4
    assert summary["restore_reference"]["after_restart"]["hit_ratio"] == 1.0
    assert summary["after_restart"]["hit_ratio"] == pytest.approx(9 / 12)
    assert summary["warmup"] == {
        "items": 0, "precision": 0.0, "cost_s": 0.0, "target_precision": 0.6,
        "expected_precision": 0.0,
    }  # fmt: skip


def test_warmup_rehydrates_from_the_past_and_matches_the_reference() -> None:
    trace = _trace([(float(t), [1, 2, 3]) for t in range(0, 100, 5)])
    config = ReplayConfig(  # the restart at 52 s is 3 s before the next request
        memory=1.0, ssd=1.0, restart_every_s=52.0, window_s=20, warmup=True, half_life_s=30
    )
    summary = run_replay(trace, config, LATENCY)
    # three blocks recomputed in 3 x 51.2 ms, long before the next request 5 s later
    assert summary["after_restart"]["hit_ratio"] == 1.0
    reference = summary["restore_reference"]["after_restart"]
    assert summary["after_restart"]["hit_ratio"] == reference["hit_ratio"]
    # warmed into the SSD: the first request loads 3 blocks at 2 ms instead of 1 ms, then memory
    assert summary["after_restart"]["ttft_ms"]["mean"] == pytest.approx(
        reference["ttft_ms"]["mean"] + 3 / 4
    )
    assert summary["warmup"]["items"] == 3 and summary["warmup"]["precision"] == 1.0
    assert summary["warmup"]["cost_s"] == pytest.approx(3 * 0.0512, abs=1e-3)  # rounded


def test_warmup_never_warms_a_block_it_has_not_seen() -> None:
    """A block first requested after the restart cannot be in the manifest: no look-ahead."""
    early = [(float(t), [1, 2]) for t in range(0, 50, 5)]
    late = [(float(t), [7, 8, 9]) for t in range(50, 100, 5)]
    result = _arm(_trace(early + late), restart_every_s=50.0, warmup=True, half_life_s=30)
    assert result.warm["items"] == 2  # blocks 1 and 2 only
    assert result.hit_blocks[10] == 0  # the first request of 7, 8, 9 is cold


def test_warmup_work_takes_time_so_early_requests_still_miss() -> None:
    blocks = list(range(1, 41))  # 40 blocks: rehydration takes 40 x 51.2 ms ~ 2 s
    trace = _trace([(0.0, blocks), (10.0, blocks), (50.1, blocks), (60.0, blocks)])
    result = _arm(trace, restart_every_s=50.0, warmup=True, half_life_s=30, memory=1.0, ssd=1.0)
    assert result.hit_blocks[2] < 40  # 0.1 s after the restart only one block is warm
    assert result.hit_blocks[3] == 40  # 10 s later everything is


@pytest.mark.parametrize("real_tiers", [False, True])
def test_shared_redis_survives_restarts(real_tiers: bool) -> None:
    """On a private server: the replay empties and caps the Redis it is given."""
    from cache_runtime.services import RedisServer

    trace = _trace([(float(t), [1, 2, 3]) for t in range(0, 100, 5)])
    config = ReplayConfig(
        memory=1.0, ssd=1.0, redis=1.0, restart_every_s=50.0, window_s=20, real_tiers=real_tiers
    )
    with RedisServer() as server:
        summary = run_replay(trace, config, LATENCY, server.url)
        assert summary["after_restart"]["hit_ratio"] == 1.0  # the first loads from Redis
        assert summary["hit_ratio"]["redis"] > 0
        assert summary["tiers"] == ("real" if real_tiers else "simulated")


def _mooncake_slice(path: Path, requests: int) -> AccessTrace:
    from cache_runtime.traces import load_trace

    trace = load_trace(path, "mooncake")
    assert trace.times is not None
    end = int(trace.request_starts[requests])
    return AccessTrace(
        "slice", trace.accesses[:end], trace.request_starts[:requests], trace.times[:end],
        None if trace.tokens is None else trace.tokens[:end],
    )  # fmt: skip


@pytest.mark.parametrize("warmup", [False, True])
def test_simulated_tiers_serve_every_access_as_the_real_ones(
    mooncake_like: Path, warmup: bool
) -> None:
    """The fast replay is the real replay: on 300 requests of a Mooncake-like trace with tight
    memory and SSD budgets (evicting and refusing), restarts and warm-up, and a shared Redis
    with room for every block (the real one evicts by sampled LRU once full: below its cap it
    must agree exactly), the same tier serves every access, and TTFT is the same."""
    from cache_runtime.services import RedisServer

    prepared = PreparedTrace.build(_mooncake_slice(mooncake_like, 300))
    common = dict(memory=0.03, ssd=0.1, redis=1.0, restart_every_s=15.0, window_s=10.0,
                  warmup=warmup, half_life_s=60.0)  # fmt: skip
    fast = replay_arm(prepared, ReplayConfig(**common), LATENCY)
    with RedisServer() as server:
        limit_redis(server.url, len(prepared.keys), 64, prepared.keys[0])
        real = replay_arm(prepared, ReplayConfig(**common, real_tiers=True), LATENCY, server.url)
    assert fast.access_tiers is not None and real.access_tiers is not None
    mismatch = np.flatnonzero(fast.access_tiers != real.access_tiers)
    assert not len(mismatch), f"{len(mismatch)} accesses differ, first at {mismatch[:5]}"
    assert fast.served == real.served and min(fast.served.values()) > 0  # every tier served
    assert fast.ttft_ms.tolist() == real.ttft_ms.tolist()
    assert fast.warm == real.warm and len(fast.restarts) >= 3


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--memory must be a fraction"):
        ReplayConfig(memory=1.5, ssd=0.1)
    with pytest.raises(ValueError, match="--restart-every must be positive"):
        ReplayConfig(memory=0.1, ssd=0.1, restart_every_s=0)


def _replay_cli(trace: Path, cwd: Path, *extra: str) -> object:
    return run_cli(
        "replay", "--trace", str(trace), "--format", "mooncake", "--memory", "0.05",
        "--ssd", "0.2", "--restart-every", "100", "--window", "30", *extra, cwd=cwd,
    )  # fmt: skip


def test_replay_cli_json_and_errors(
    mooncake_like: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREHEAT_POLICY__POOL", '["lru", "mq"]')  # a node's settings: its pool
    done = _replay_cli(mooncake_like, tmp_path, "--warmup", "on", "--latency", "reference",
                       "--load", "2", "--json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["config"]["policy"]["pool"] == ["lru", "mq"]
    assert {"requests", "hit_ratio", "ttft_ms", "utilisation", "after_restart", "warmup",
            "restore_reference", "warmup_off", "recovered", "tiers", "load",
            "latency_model"} <= result.keys()  # fmt: skip
    assert set(result["hit_ratio"]) == {"memory", "ssd", "redis", "total"}
    # the trace's 300 s at twice the rate: 150 s, one restart (every 100 s of clock time)
    assert result["requests"] == 1200 and result["restarts"] == 1
    assert result["tiers"] == "simulated" and result["load"] == 2.0
    assert result["latency_model"]["source"].startswith("reference")
    for block in (result, result["restore_reference"], result["warmup_off"]):
        for figures in (block, block["after_restart"]):
            assert set(figures["ttft_ms"]) == {"p50", "p95", "p99", "mean"}
            ttft = figures["ttft_ms"]
            assert ttft["p50"] <= ttft["p95"] <= ttft["p99"]
            assert 0 < figures["utilisation"] <= 1
    bad = invoke_cli(
        "replay", "--trace", str(mooncake_like), "--memory", "2", "--ssd", "0.1",
        "--warmup", "on", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    wrong = invoke_cli("replay", "--trace", str(mooncake_like), "--memory", "0.1", "--ssd", "0.1",
                       "--warmup", "maybe", cwd=tmp_path)  # fmt: skip
    assert wrong.returncode == 2 and "choose on or off" in wrong.stderr


@pytest.mark.parametrize("load", ["0", "-1", "abc", "inf"])
def test_replay_cli_refuses_a_bad_load_in_one_line(
    mooncake_like: Path, tmp_path: Path, load: str
) -> None:
    done = invoke_cli(
        "replay", "--trace", str(mooncake_like), "--memory", "0.05", "--ssd", "0.2",
        "--warmup", "off", "--latency", "reference", "--load", load, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--load {load!r}: a positive factor" in done.stderr and not done.stdout


def test_replay_cli_real_tiers_and_a_pinned_latency_model(
    mooncake_like: Path, tmp_path: Path
) -> None:
    """`--real-tiers` runs the real SSD tier and says so, with the same numbers as the fast
    replay; `--latency FILE` prices a run with the model an earlier run printed, and
    `--servers` changes only the engine's size."""
    sliced = tmp_path / "slice.jsonl"
    sliced.write_bytes(b"".join(mooncake_like.read_bytes().splitlines(keepends=True)[:300]))
    fast = _replay_cli(sliced, tmp_path, "--warmup", "on", "--latency", "reference")
    real = _replay_cli(sliced, tmp_path, "--warmup", "on", "--latency", "reference",
                       "--real-tiers")  # fmt: skip
    assert fast.returncode == 0 and real.returncode == 0, fast.stderr + real.stderr
    fast_json, real_json = orjson.loads(fast.stdout), orjson.loads(real.stdout)
    assert (fast_json["tiers"], real_json["tiers"]) == ("simulated", "real")
    assert {k: v for k, v in fast_json.items() if k not in ("tiers", "config")} == {
        k: v for k, v in real_json.items() if k not in ("tiers", "config")
    }
    pinned = tmp_path / "earlier.json"
    pinned.write_bytes(fast.stdout.encode())
    again = _replay_cli(sliced, tmp_path, "--warmup", "on", "--latency", str(pinned))
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout) == fast_json
    one = _replay_cli(sliced, tmp_path, "--warmup", "on", "--latency", str(pinned),
                      "--servers", "1")  # fmt: skip
    one_json = orjson.loads(one.stdout)
    assert one_json["latency_model"] == {**fast_json["latency_model"], "servers": 1}
    assert one_json["hit_ratio"] == fast_json["hit_ratio"]
    assert one_json["utilisation"] > fast_json["utilisation"]
    broken = tmp_path / "broken.json"
    broken.write_text('{"prefill_ms_per_token": 0.1}')
    bad = _replay_cli(sliced, tmp_path, "--warmup", "on", "--latency", str(broken))
    assert bad.returncode == 2 and "not a latency model" in bad.stderr


def test_replay_report_leads_with_the_table_and_logs_to_mlflow(
    mooncake_like: Path, tmp_path: Path
) -> None:
    settings = tmp_path / "preheat.toml"
    settings.write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        f'mlflow_uri = "sqlite:///{tmp_path / "mlflow.db"}"\n'
        f'mlflow_artifacts = "{tmp_path / "mlruns"}"\n'
        '[policy]\npool = ["lirs", "lru"]\n'  # the node's pool, as a serving node reads it
    )
    done = _replay_cli(
        mooncake_like, tmp_path, "--warmup", "off", "--latency", "reference",
        "--report", str(tmp_path / "report"), "--config", str(settings),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["config"]["policy"]["pool"] == ["lirs", "lru"]
    assert result["warmup"]["items"] == 0  # the printed arm is the one asked for
    page = (tmp_path / "report" / "replay.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "restore" not in result["report"]
    assert page.index("<table") < page.index("<img")  # the table leads
    for label in ("warm-up off", "warm-up on", "restore reference", "p50/p95/p99", "utilisation"):
        assert label in page
    assert '"hit_ratio"' not in page  # no raw JSON in the page
    both = orjson.loads((tmp_path / "report" / "replay.json").read_bytes())
    assert both["on"]["warmup"]["items"] > 0 and both["off"] == {
        k: v for k, v in result.items() if k not in ("report", "mlflow_run_id")
    }
    assert both["on"]["latency_model"] == both["off"]["latency_model"]  # one model, all arms
    assert len(result["mlflow_run_id"]) == 32


def test_ahead_of_demand_rewarms_a_hot_block_the_node_lost() -> None:
    """Opt-in: a block the manifest calls hot but the node no longer holds is warmed back."""
    from models.evaluation.replay.demand import DemandModel
    from models.evaluation.replay.node import Node, TraceClock
    from models.evaluation.replay.planning import plan_ahead
    from models.evaluation.replay.warming import HeatManifest, WarmWorker

    prepared = PreparedTrace.build(_trace([(0.0, [1, 2]), (1.0, [3])]))
    long, short = HeatManifest(3, 60.0), HeatManifest(3, 10.0)
    for t in range(5):  # block 0 (id 1) asked for five times; the node has lost it
        long.bump(np.array([0]), float(t))
        short.bump(np.array([0]), float(t))
    node = Node(memory_blocks=2, ssd_blocks=2, clock=TraceClock())
    worker = WarmWorker(prepared.keys, prepared.parents, prepared.tokens, LATENCY, bytes(8))
    config = ReplayConfig(memory=1.0, ssd=1.0, warmup=True, ahead_every_s=60.0)
    demand = DemandModel(config.window_s, config.retention, 0.5, prepared.cohorts)
    try:
        plan_ahead(worker, node, demand, (long, short), 5.0, config, ssd_blocks=2)
        worker.advance(node, 6.0)  # one prefill of 51.2 ms fits in a second
        assert node.holds_locally(prepared.keys[0]) and worker.items == 1
        assert not node.holds_locally(prepared.keys[2])  # block 3 was never hot: not warmed
    finally:
        node.close()


def test_a_precision_target_raises_realised_precision_on_a_bursty_trace() -> None:
    """Many blocks seen twice in a burst and never again, a few asked for steadily: a fixed low
    threshold warms the burst's leftovers after each restart and most go unused; the demand
    model learns from the stream that such blocks are not asked for again, and the cut skips
    them."""
    rng = np.random.default_rng(0)
    requests = []
    for t in range(0, 2000, 2):
        if t % 100 < 10:  # a burst of one-off prompts, each asked twice
            block = 1000 + t
            requests += [(float(t), [block]), (float(t) + 0.5, [block])]
        requests.append((float(t) + 1, [int(rng.integers(1, 20))]))  # the steady keys
    trace = _trace(requests)
    common = dict(memory=0.05, ssd=0.5, restart_every_s=100.0, window_s=50.0, warmup=True,
                  min_expected_uses=0.05)  # fmt: skip
    fixed = replay_arm(
        PreparedTrace.build(trace),
        ReplayConfig(**common, target_precision=None, min_use_probability=0.0), LATENCY,
    )  # fmt: skip
    steered = replay_arm(PreparedTrace.build(trace), ReplayConfig(**common, target_precision=0.6),
                         LATENCY)  # fmt: skip
    precision = {n: r.warm["used"] / r.warm["items"] for n, r in (("f", fixed), ("s", steered))}
    assert precision["s"] > precision["f"] + 0.1, precision


def test_cheap_loads_from_the_shared_tier_are_queued_before_recomputes() -> None:
    """Four blocks equally hot; the shared Redis holds two of them: loading those (3 ms) goes
    before recomputing the others (51.2 ms), the benefit per second of worker time."""
    from cache_runtime.services import RedisServer
    from models.evaluation.replay.demand import DemandModel
    from models.evaluation.replay.node import Node, TraceClock
    from models.evaluation.replay.planning import ranked
    from models.evaluation.replay.warming import HeatManifest, WarmWorker

    requests = [(float(t), [b]) for t in range(0, 50, 5) for b in (1, 2, 3, 4)]
    prepared = PreparedTrace.build(_trace(requests))
    long, short = HeatManifest(4, 300.0), HeatManifest(4, 30.0)
    for now, (block,) in requests:
        index = np.array([prepared.blocks[requests.index((now, [block]))]])
        long.bump(index, now)
        short.bump(index, now)
    config = ReplayConfig(memory=1.0, ssd=1.0, redis=1.0, restart_every_s=60.0, warmup=True)
    demand = DemandModel(config.window_s, config.retention, 0.5, prepared.cohorts)
    worker = WarmWorker(prepared.keys, prepared.parents, prepared.tokens, LATENCY, bytes(8))
    with RedisServer() as server:
        node = Node(4, 4, TraceClock(), server.url)
        try:
            for block in (2, 3):  # ids 3 and 4
                node.tier("redis").put(prepared.keys[block], bytes(8))
            queue, used = ranked(worker, node, demand, (long, short), 50.0, config, capacity=4)
        finally:
            node.close()
    assert sorted(queue[:2].tolist()) == [2, 3] and sorted(queue[2:].tolist()) == [0, 1]
    assert len(used) == 4 and (used > 0.5).all()


def test_a_slow_worker_plans_what_it_can_deliver_and_keeps_precision() -> None:
    """150 prompts each asked for every 150 s, 20 live sessions asked for every 8 s; a restart
    every 120 s wipes the node; the worker recomputes a block in a second, so it cannot warm
    everything. A prompt warmed late has less of its retention left to be asked for in (the
    next restart wipes it): the plan stops where what it adds is likelier wasted than used,
    forecasts its own precision, and still cuts the windows' TTFT."""
    slow = ReplayLatency(
        prefill_ms_per_token=2.0, load_ms_per_block={"memory": 1.0, "ssd": 2.0}, base_ms=10.0,
        source="test",
    )  # fmt: skip
    phases = np.linspace(0, 150, 150, endpoint=False).round(1).tolist()
    requests = [(phase + k * 150, [block]) for block, phase in enumerate(phases) for k in range(4)]
    requests += [(t + s * 0.3, [1000 + s]) for s in range(20) for t in range(0, 600, 8)]
    trace = _trace(sorted(requests))
    common = dict(memory=0.1, ssd=1.0, restart_every_s=120.0, window_s=60.0, warmup=True,
                  min_expected_uses=0.05)  # fmt: skip
    prepared = PreparedTrace.build(trace)
    planned = replay_arm(prepared, ReplayConfig(**common), slow)
    unsized = replay_arm(
        prepared, ReplayConfig(**common, target_precision=None, min_use_probability=0.0), slow
    )  # fmt: skip
    cold = replay_arm(prepared, ReplayConfig(**{**common, "warmup": False}), slow)
    precision = {n: r.warm["used"] / r.warm["items"] for n, r in (("p", planned), ("u", unsized))}
    assert precision["p"] >= 0.7 and precision["p"] > precision["u"] + 0.1, precision
    forecast = planned.warm["expected_used"] / planned.warm["items"]
    assert forecast == pytest.approx(precision["p"], abs=0.1)
    after = after_restart_mask(request_times(trace), planned.restarts, 60.0)
    assert planned.ttft_ms[after].mean() < cold.ttft_ms[after].mean() - 10
