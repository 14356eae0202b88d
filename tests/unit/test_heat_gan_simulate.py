"""The counterfactual rollout of the heat simulator (issue 5): events parsed and applied, the
top-k plan's sensitivity to them, long horizons in chunks, bad input refused, and the figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from heat_gan_support import L, T

from models.heat.gan import HeatGan
from models.heat.simulate import Event, Simulation, sensitivity, simulate, simulation_figure

KEYS = ["hot-a", "hot-b", "warm", "quiet", "cold"]


@pytest.fixture(scope="module")
def sim_history() -> np.ndarray:
    """(5, 10) heat in requests: two hot keys, a warm one, a quiet one and a cold (all-zero) one."""
    rng = np.random.default_rng(7)
    levels = np.array([80.0, 60.0, 20.0, 3.0, 0.0])
    return levels[:, None] * rng.uniform(0.7, 1.3, (len(levels), 10))


def test_event_parse() -> None:
    assert Event.parse("3:template:abc:0.3") == Event(3, "template:abc", 0.3)
    assert Event.parse("0:k:-1.5") == Event(0, "k", -1.5)
    assert Event.parse("12:a:b:c:2") == Event(12, "a:b:c", 2.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3:abc", "expected AT:KEY:DELTA"),
        ("nothing", "expected AT:KEY:DELTA"),
        ("3::0.3", "expected AT:KEY:DELTA"),
        ("", "expected AT:KEY:DELTA"),
        ("x:key:0.3", "'x:key:0.3'"),
        ("3:key:lots", "'3:key:lots'"),
        ("1.5:key:0.3", "'1.5:key:0.3'"),
        ("-1:key:0.3", ">= 0 buckets ahead"),
        ("3:key:nan", "finite"),
        ("3:key:inf", "finite"),
    ],
)
def test_event_parse_rejects_malformed_text(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Event.parse(text)


def test_event_rejects_negative_time_and_infinite_delta() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Event(-1, "k", 0.3)
    with pytest.raises(ValueError, match="finite"):
        Event(0, "k", math.inf)


def test_simulate_without_events_is_the_baseline(model: HeatGan, sim_history: np.ndarray) -> None:
    result = simulate(model, sim_history, KEYS, n_paths=12)
    assert isinstance(result, Simulation)
    assert result.baseline.shape == (len(KEYS), 12, T)
    np.testing.assert_array_equal(result.counterfactual, result.baseline)
    assert np.all(result.baseline >= 0)
    summary = result.summary
    assert summary["entered"] == [] and summary["left"] == [] and summary["jaccard"] == 1.0
    assert summary["baseline_top"] == summary["counterfactual_top"]
    assert summary["top_k"] == len(KEYS)  # top_k 10 > 5 keys
    again = simulate(model, sim_history, KEYS, n_paths=12)
    np.testing.assert_array_equal(again.baseline, result.baseline)
    other = simulate(model, sim_history, KEYS, n_paths=12, seed=1)
    assert not np.array_equal(other.baseline, result.baseline)


def test_an_event_bumps_its_key_and_nothing_else(model: HeatGan, sim_history: np.ndarray) -> None:
    delta = 0.3
    result = simulate(model, sim_history, KEYS, n_paths=16, events=[Event(0, "warm", delta)])
    row = KEYS.index("warm")
    peak = max(sim_history[row].max(), 1.0)
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 0], result.baseline[row, :, 0] + delta * peak
    )
    others = [i for i in range(len(KEYS)) if i != row]
    np.testing.assert_array_equal(result.counterfactual[others], result.baseline[others])
    assert not np.array_equal(result.counterfactual[row, :, 1:], result.baseline[row, :, 1:])
    numbers = result.summary["keys"]["warm"]
    assert numbers["expected_heat_after"] > numbers["expected_heat_before"]
    assert numbers["expected_heat_after"] - numbers["expected_heat_before"] >= 0.99 * delta * peak


def test_an_event_later_on_leaves_the_buckets_before_it(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    result = simulate(model, sim_history, KEYS, n_paths=8, events=[Event(2, "quiet", 4.0)])
    row = KEYS.index("quiet")
    peak = max(sim_history[row].max(), 1.0)
    np.testing.assert_array_equal(result.counterfactual[:, :, :2], result.baseline[:, :, :2])
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 2], result.baseline[row, :, 2] + 4.0 * peak
    )


def test_a_big_event_on_a_cold_key_puts_it_in_the_plan(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    assert sim_history[KEYS.index("cold")].max() == 0.0  # its peak counts as one request
    result = simulate(model, sim_history, KEYS, n_paths=16, top_k=2, events=[Event(0, "cold", 1e4)])
    row = KEYS.index("cold")
    np.testing.assert_array_equal(
        result.counterfactual[row, :, 0], result.baseline[row, :, 0] + 1e4
    )
    summary = result.summary
    assert summary["top_k"] == 2
    assert summary["baseline_top"] == ["hot-a", "hot-b"]
    assert summary["entered"] == ["cold"]
    assert summary["counterfactual_top"][0] == "cold"
    assert summary["left"] == ["hot-b"]
    assert summary["jaccard"] == pytest.approx(1 / 3, abs=1e-4)
    cold = summary["keys"]["cold"]
    assert cold["rank_after"] == 1 < cold["rank_before"]
    assert cold["share_of_paths_in_top_k_after"] == 1.0
    assert cold["share_of_paths_in_top_k_before"] == 0.0
    assert set(summary["keys"]) == {"cold", "hot-b"}  # the event's key and those that moved


def test_a_negative_event_never_makes_heat_negative(
    model: HeatGan, sim_history: np.ndarray
) -> None:
    events = [Event(0, "hot-a", -5.0), Event(3, "quiet", -0.5)]
    result = simulate(model, sim_history, KEYS, n_paths=16, horizon=10, events=events)
    assert np.all(result.counterfactual >= 0)
    row = KEYS.index("hot-a")
    np.testing.assert_array_equal(result.counterfactual[row, :, 0], 0.0)
    numbers = result.summary["keys"]["hot-a"]
    assert numbers["expected_heat_after"] < numbers["expected_heat_before"]


def test_sensitivity_by_hand() -> None:
    """Three keys, two one-bucket paths: path totals (3, 2, 1) and (1, 2, 3). All tie on
    expected heat (2), so the stable order puts the first key on top."""
    baseline = np.array([[[3.0], [1.0]], [[2.0], [2.0]], [[1.0], [3.0]]])  # (K=3, P=2, H=1)
    counterfactual = baseline.copy()
    counterfactual[2] += 1.0  # key c: totals (2, 4), expected 3
    keys = ["a", "b", "c"]
    events = [Event(0, key, 0.0) for key in keys]  # watch every key
    out = sensitivity(keys, baseline, counterfactual, top_k=1, events=events)
    assert out["top_k"] == 1
    assert out["baseline_top"] == ["a"] and out["counterfactual_top"] == ["c"]
    assert out["entered"] == ["c"] and out["left"] == ["a"] and out["jaccard"] == 0.0
    shares_before = [out["keys"][k]["share_of_paths_in_top_k_before"] for k in keys]
    shares_after = [out["keys"][k]["share_of_paths_in_top_k_after"] for k in keys]
    assert shares_before == [0.5, 0.0, 0.5]  # a tops path 0, c tops path 1
    assert shares_after == [0.5, 0.0, 0.5]  # path 0: a (3) beats c (2); path 1: c (4)
    assert [out["keys"][k]["rank_before"] for k in keys] == [1, 2, 3]
    assert [out["keys"][k]["rank_after"] for k in keys] == [2, 3, 1]
    assert out["keys"]["c"]["expected_heat_after"] == 3.0
    big = sensitivity(keys, baseline, baseline, top_k=5, events=[])
    assert big["top_k"] == 3 and big["keys"] == {} and big["jaccard"] == 1.0


def test_events_at_one_bucket_add_up(model: HeatGan, sim_history: np.ndarray) -> None:
    twice = [Event(1, "warm", 0.2), Event(1, "warm", 0.3)]
    once = [Event(1, "warm", 0.5)]
    a = simulate(model, sim_history, KEYS, n_paths=8, events=twice)
    b = simulate(model, sim_history, KEYS, n_paths=8, events=once)
    np.testing.assert_allclose(a.counterfactual, b.counterfactual, rtol=1e-12)


def test_a_long_horizon_is_rolled_out_in_chunks(model: HeatGan, sim_history: np.ndarray) -> None:
    long = simulate(model, sim_history, KEYS, n_paths=8, horizon=3 * T + 2)
    assert long.baseline.shape == (len(KEYS), 8, 3 * T + 2)
    assert np.all(long.baseline >= 0) and np.all(np.isfinite(long.baseline))
    short = simulate(model, sim_history, KEYS, n_paths=8)
    np.testing.assert_array_equal(long.baseline[:, :, :T], short.baseline)  # the first chunk
    late = simulate(model, sim_history, KEYS, n_paths=8, horizon=3 * T + 2, events=[
        Event(2 * T + 1, "quiet", 2.0)
    ])  # fmt: skip
    assert late.counterfactual.shape == (len(KEYS), 8, 3 * T + 2)
    np.testing.assert_array_equal(
        late.counterfactual[:, :, : 2 * T + 1], late.baseline[:, :, : 2 * T + 1]
    )
    assert not np.array_equal(late.counterfactual, late.baseline)


def test_simulate_uses_the_last_history_buckets(model: HeatGan, sim_history: np.ndarray) -> None:
    longer = np.concatenate([np.full((len(KEYS), 5), 0.5), sim_history], axis=1)
    a = simulate(model, longer, KEYS, n_paths=4)
    b = simulate(model, sim_history[:, -L:], KEYS, n_paths=4)
    np.testing.assert_array_equal(a.baseline, b.baseline)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"events": [Event(0, "nobody", 1.0)]}, "simulated keys"),
        ({"events": [Event(T, "warm", 1.0)]}, "past the horizon"),
        ({"history": "short"}, "the model needs"),
        ({"history": "nan"}, "finite"),
        ({"history": "negative"}, "finite"),
        ({"keys": ["a", "a", "b", "c", "d"]}, "unique"),
        ({"keys": KEYS[:4]}, "one row per key"),
        ({"n_paths": 0}, "at least 1"),
        ({"top_k": 0}, "at least 1"),
        ({"horizon": -2}, "at least 1"),
    ],
)
def test_simulate_rejects_bad_input(
    model: HeatGan, sim_history: np.ndarray, change: dict[str, object], message: str
) -> None:
    args: dict[str, object] = {"history": sim_history, "keys": KEYS, "n_paths": 4}
    args.update(change)
    history = sim_history.copy()
    if change.get("history") == "short":
        args["history"] = history[:, : L - 1]
    elif change.get("history") == "nan":
        history[1, 3] = math.nan
        args["history"] = history
    elif change.get("history") == "negative":
        history[1, 3] = -1.0
        args["history"] = history
    with pytest.raises(ValueError, match=message):
        simulate(model, **args)  # type: ignore[arg-type]


def test_simulate_rejects_a_zero_horizon(model: HeatGan, sim_history: np.ndarray) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        simulate(model, sim_history, KEYS, n_paths=4, horizon=0)


def test_event_time_must_be_whole() -> None:
    with pytest.raises(ValueError, match="whole number"):
        Event(1.5, "k", 1.0)  # type: ignore[arg-type]


def test_simulation_figure(model: HeatGan, sim_history: np.ndarray, tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    events = [Event(0, "cold", 5.0), Event(1, "warm", 0.5), Event(2, "cold", 1.0)]
    result = simulate(model, sim_history, KEYS, n_paths=8, events=events)
    figure = simulation_figure(result)
    assert isinstance(figure, Figure)
    assert [ax.get_title() for ax in figure.axes] == ["cold", "warm"]  # one per event key
    figure.savefig(tmp_path / "sim.png")
    assert (tmp_path / "sim.png").stat().st_size > 0
    plain = simulation_figure(simulate(model, sim_history, KEYS, n_paths=8, top_k=3))
    assert [ax.get_title() for ax in plain.axes] == ["hot-a", "hot-b", "warm"]
    chosen = simulation_figure(result, keys=["quiet"])
    assert [ax.get_title() for ax in chosen.axes] == ["quiet"]
