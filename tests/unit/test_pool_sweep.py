"""`benchmarks/pool_sweep.py`: the pool on cells it was not tuned on. The generated workloads are
the same on every run and each favours the policy family it is built for; a group's summary
counts what the issue's goals count; a bad `--pool` is one line and exit 2; the peers' figures
are kept between runs. No timings."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import orjson
import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "pool_sweep.py"


@pytest.fixture(scope="module")
def sweep() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("pool_sweep_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # registered by name: its worker processes find `_replay_pool` through it
    sys.modules[spec.name] = module
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SCRIPT.parent))  # the script imports robustness.py by name
        spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_each_workload_is_the_same_on_every_run(sweep: ModuleType) -> None:
    for name in sweep.ARCHETYPES:
        first, again = sweep.generated(name), sweep.generated(name)
        assert len(first.accesses) == sweep.ACCESSES, name
        assert np.array_equal(first.accesses, again.accesses), name
        assert np.array_equal(first.request_starts, np.arange(sweep.ACCESSES))


def test_another_seed_draws_each_workload_again(sweep: ModuleType) -> None:
    """`--seed`: the same kinds, other keys; the shipped seed is the default."""
    for name in sweep.ARCHETYPES:
        shipped, other = sweep.generated(name), sweep.generated(name, seed=1)
        assert np.array_equal(shipped.accesses, sweep.generated(name, sweep.SEED).accesses)
        assert len(other.accesses) == sweep.ACCESSES, name
        assert not np.array_equal(shipped.accesses, other.accesses), name
        assert sweep.fingerprint(other) != sweep.fingerprint(shipped)  # kept peers do not fit
    assert sweep.parse([]).seed == sweep.SEED
    assert sweep.parse(["--seed", "2"]).seed == 2


def test_the_workloads_favour_the_families_they_are_built_for(sweep: ModuleType) -> None:
    """At 10% of the unique keys: LRU beats LIRS where reuse is all recency, LIRS beats LRU on
    the loop, MQ beats LRU on the static Zipf, S3-FIFO beats LRU among one-hit wonders."""
    from cache_runtime.candidates import CANDIDATES
    from cache_runtime.simulator import replay

    def hits(workload: str, candidate: str) -> float:
        trace = sweep.generated(workload)
        capacity = round(0.1 * trace.unique)
        policy = CANDIDATES[candidate].make()
        return float(replay(policy, trace.accesses, trace.request_starts, capacity).mean())

    assert hits("recency", "lru") > hits("recency", "lirs") + 0.02
    assert hits("loop_and_hot", "lirs") > hits("loop_and_hot", "lru") + 0.05
    assert hits("zipf_0.8", "mq") > hits("zipf_0.8", "lru") + 0.05
    assert hits("one_hit_wonders", "s3fifo") > hits("one_hit_wonders", "lru") + 0.02


def test_a_summary_counts_short_cells_the_worst_and_those_below_lru(sweep: ModuleType) -> None:
    cells = [
        {"where": "a", "preheat": 0.50, "best_online": 0.50, "LRU": 0.40},
        {"where": "b", "preheat": 0.45, "best_online": 0.50, "LRU": 0.46},  # short, below LRU
        {"where": "c", "preheat": 0.298, "best_online": 0.30, "LRU": 0.20},  # within 0.003
    ]
    summary = sweep.summarise(cells)
    assert summary["cells"] == 3
    assert summary["short"] == 1
    assert summary["summed_margin_to_best_online"] == pytest.approx(-0.052)
    assert summary["worst"] == {"where": "b", "ratio_to_best_online": 0.9}
    assert summary["below_lru"] == {"cells": 1, "summed": -0.01, "where": ["b"]}


def test_shipped_cells_are_the_command_s_at_its_sizes_and_held_out_at_the_others(
    sweep: ModuleType,
) -> None:
    assert [sweep.group_of("shipped", s) for s in ("0.01", "0.05", "0.1", "0.2")] == ["command"] * 4
    assert [sweep.group_of("shipped", s) for s in ("0.02", "0.03", "0.07", "0.15")] == [
        "heldout"
    ] * 4
    assert sweep.group_of("generated", "0.1") == "generated"


def test_a_cell_where_no_peer_hits_has_no_ratio(sweep: ModuleType) -> None:
    summary = sweep.summarise([{"where": "a", "preheat": 0.0, "best_online": 0.0, "LRU": 0.0}])
    assert summary["worst"] is None and summary["short"] == 0


def test_a_kept_entry_is_used_only_for_the_trace_and_sizes_it_was_made_on(
    sweep: ModuleType,
) -> None:
    trace = sweep.generated("scans")
    row = dict.fromkeys(sweep.PEER_FIELDS, 0.5)
    entry = {
        "fingerprint": sweep.fingerprint(trace),
        "sizes": [str(s) for s in sweep.SIZES],
        "rows": {"0.1": row},
    }
    assert sweep.fits(entry, trace)
    assert not sweep.fits(entry, sweep.generated("phases"))  # another trace's
    assert not sweep.fits({**entry, "sizes": ["0.1"]}, trace)  # other sizes
    assert not sweep.fits({**entry, "rows": {"0.1": {"capacity": 10}}}, trace)  # an older shape
    assert not sweep.fits([entry], trace)


@pytest.mark.parametrize(
    ("pool", "says"),
    [
        ('{"windw": 10}', "windw"),
        ('{"sample_rate": 2}', "sample_rate"),
        ("[1]", "not a JSON object"),
        ("{", "--pool"),
    ],
)
def test_a_bad_pool_is_one_line_and_exit_2(
    sweep: ModuleType, pool: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        sweep.main(["--pool", pool])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pool_sweep.py: ") and says in err and "\n" not in err


@pytest.mark.parametrize(("content", "says"), [(b"{", "not JSON"), (b"[]", "not a peers file")])
def test_a_peers_file_that_is_not_one_is_one_line_and_left_as_it_is(
    sweep: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    content: bytes,
    says: str,
) -> None:
    monkeypatch.setattr(sweep, "ARCHETYPES", {})  # nothing to load: the file is read first
    peers = tmp_path / "peers.json"
    peers.write_bytes(content)
    assert sweep.main(["--shared", str(tmp_path), "--peers", str(peers)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"pool_sweep.py: --peers {peers}: ") and says in err
    assert "\n" not in err
    assert peers.read_bytes() == content


@pytest.mark.slow
def test_a_run_without_shared_data_sweeps_the_generated_cells_and_keeps_the_peers(
    sweep: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One small workload (3,000 accesses), no shipped trace: the second run reads the peers
    from the file the first wrote and computes none."""
    monkeypatch.setattr(sweep, "ACCESSES", 3_000)
    monkeypatch.setattr(sweep, "ARCHETYPES", {"recency": sweep.ARCHETYPES["recency"]})
    peers = tmp_path / "peers.json"
    argv = ["--shared", str(tmp_path / "none"), "--peers", str(peers), "--cells"]
    assert sweep.main(argv) == 0
    first = orjson.loads(capsys.readouterr().out)
    assert first["seed"] == sweep.SEED
    assert set(first["groups"]) == {"generated"}
    assert len(first["skipped"]) == len(sweep.SHIPPED)
    cells = first["cells"]["generated"]
    assert first["groups"]["generated"]["cells"] == len(cells) > 0
    for cell in cells:
        assert 0 <= cell["preheat"] <= cell["Belady"] + 1e-9
        assert cell["best_online_policy"] != "Belady"
    assert set(orjson.loads(peers.read_bytes())) == {"recency"}
    assert not list(tmp_path.glob("*.partial"))

    def computed(*_: object) -> None:
        raise AssertionError("the peers were computed again")

    monkeypatch.setattr(sweep, "peer_rows", computed)
    assert sweep.main([*argv, "--pool", '{"hysteresis": 0.01}']) == 0
    again = orjson.loads(capsys.readouterr().out)
    assert again["pool"] == {"hysteresis": 0.01}
    assert [c["where"] for c in again["cells"]["generated"]] == [c["where"] for c in cells]
