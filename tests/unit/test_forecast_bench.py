"""`preheat bench forecast` and `bench hotset`: the JSON the issue names, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from helpers import invoke_cli
from helpers import run_cli as run

from cache_runtime.traces import TraceError
from models.evaluation.bench.forecast_bench import total_series


@pytest.fixture(scope="module")
def azure_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An Azure-format trace: a daily-ish wave of arrivals over 2,400 s, made here."""
    rng = np.random.default_rng(5)
    path = tmp_path_factory.mktemp("traces") / "azure_like.csv"
    rate = 3 + 2 * np.sin(np.arange(240) / 12)  # requests per 10 s bucket
    start = np.datetime64("2023-11-16T18:00:00")
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for bucket, lam in enumerate(rate):
        for offset in np.sort(rng.uniform(0, 10, rng.poisson(lam))):
            stamp = start + np.timedelta64(int((bucket * 10 + offset) * 1e6), "us")
            text = str(stamp).replace("T", " ")
            lines.append(f"{text}0,{rng.integers(10, 5000)},{rng.integers(1, 50)}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_bench_forecast_json(azure_like: Path, tmp_path: Path) -> None:
    done = run(
        "bench", "forecast", "--trace", str(azure_like), "--format", "azure", "--bucket", "10",
        "--horizon", "3", "--season", "24", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    # the trace ends inside its 240th bucket from the first request: that one is dropped
    assert result["buckets"] == 239 and result["test_buckets"] == 60
    assert result["dropped_partial_bucket_requests"] > 0
    expected = {"preheat", "attention", "naive", "seasonal_naive", "moving_average", "ewma", "ar"}
    assert set(result["methods"]) == expected
    for scores in result["methods"].values():
        assert {"MAE", "sMAPE", "MASE"} <= scores.keys() and scores["MAE"] >= 0
    assert result["methods"]["preheat"]["chosen"] == "adahedge"
    experts = expected - {"preheat"}
    assert set(result["validation"]) == set(result["weights_at_train_end"]) == experts
    assert sum(result["weights_at_last_origin"].values()) == pytest.approx(1.0, abs=1e-3)
    paired = result["paired_test"]
    assert paired["against"] == result["best_baseline"] and paired["origins"] == 58
    assert 0 <= paired["dm_p_lower"] <= 1 and 0 <= paired["wilcoxon_p_lower"] <= 1
    alone = result["attention_paired_test"]
    assert alone["against"] == paired["against"] and alone["origins"] == paired["origins"]
    assert result["best_baseline"] in expected - {"preheat", "attention"}
    low, high = result["mae_diff_ci95"]
    assert low <= high


def test_the_bucket_a_trace_ends_inside_is_dropped(tmp_path: Path) -> None:
    """An event trace is known up to its last request, so the bucket holding it is partial; a
    rate trace's windows cover their width, so a bucket is whole once its windows are in."""
    events = tmp_path / "events.csv"
    stamps = ["18:00:00", "18:00:04", "18:00:12", "18:00:19", "18:00:25"]
    events.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 {t}.0000000,10,1\n" for t in stamps)
    )
    series, quarantined, dropped = total_series(events, "azure", 10)
    assert series.tolist() == [2.0, 2.0] and (quarantined, dropped) == (0, 1)
    with pytest.raises(TraceError, match="spans less than one 60 s bucket"):
        total_series(events, "azure", 60)
    rates = tmp_path / "rate.csv"
    rates.write_text("window_start_s,total_rate_rps,active_clients\n0,1,3\n600,2,3\n1200,3,3\n")
    series, _, dropped = total_series(rates, "servegen", 600)
    assert series.tolist() == [600.0, 1200.0, 1800.0] and dropped == 0
    series, _, dropped = total_series(rates, "servegen", 1200)
    assert series.tolist() == [1800.0] and dropped == 1800


def test_bench_forecast_bad_input_is_one_line(tmp_path: Path) -> None:
    missing = invoke_cli(
        "bench", "forecast", "--trace", str(tmp_path / "nope.csv"), "--format", "azure",
        "--bucket", "10", cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "no such file" in missing.stderr
    short = tmp_path / "short.csv"
    short.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0000000,1,1\n")
    done = invoke_cli(
        "bench", "forecast", "--trace", str(short), "--format", "azure", "--bucket", "10",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1


@pytest.mark.slow
def test_bench_hotset_json(mooncake_like: Path, tmp_path: Path) -> None:
    done = run(
        "bench", "hotset", "--trace", str(mooncake_like), "--format", "mooncake",
        "--window", "30", "--k", "10", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = orjson.loads(done.stdout)
    assert result["k"] == 10 and result["windows"] >= 4
    assert set(result["methods"]) == {
        "preheat",
        "planner",
        "last_window",
        "ewma_frequency",
        "oracle",
    }
    oracle = result["methods"]["oracle"]["recall_of_requests"]
    for scores in result["methods"].values():
        assert 0 <= scores["recall_of_requests"] <= oracle + 1e-9
    assert result["preheat_chosen"] == "adahedge"
    experts = {"last_window", "ewma_frequency", "decayed_frequency", "attention", "feature_boost",
               "feature_boost_online"}  # fmt: skip
    assert set(result["experts"]) <= experts and "last_window" in result["experts"]
    assert (
        result["experts"]["last_window"] == result["methods"]["last_window"]["recall_of_requests"]
    )  # the expert inside the combination is scored as the baseline is
    weights = result["params"]["preheat"]["weights_at_last_window"]
    assert sum(weights.values()) == pytest.approx(1.0, abs=1e-3)


def test_bench_hotset_too_few_windows_is_one_line(mooncake_like: Path, tmp_path: Path) -> None:
    done = invoke_cli(
        "bench", "hotset", "--trace", str(mooncake_like), "--window", "100000", cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1


def test_train_forecaster_without_features_is_one_line(tmp_path: Path) -> None:
    done = invoke_cli("train", "forecaster", "--data-dir", str(tmp_path / "d"), cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "run `preheat ingest` and `preheat features` first" in done.stderr
    bad = invoke_cli("train", "forecaster", "--granularity", "2min", cwd=tmp_path)
    assert bad.returncode == 2 and "granularity '2min'" in bad.stderr


def test_attention_alone_is_preheat_s_expert_as_a_fresh_fit_would_be() -> None:
    """Reusing the combination's attention expert is sound only because a fresh fit on the same
    train part, config and seed gives the same model; before `preheat` is fitted it fits one."""
    from models.evaluation.bench.forecast_bench import AttentionAlone
    from models.forecast.attention import AttentionConfig
    from models.forecast.selection import PreheatForecaster

    series = np.random.default_rng(3).poisson(6, 160).astype(float)
    config = AttentionConfig(scales=(1, 2), context=4, horizon=2, d_model=8, heads=2, epochs=2)
    preheat = PreheatForecaster(2, attention=config)
    fresh = AttentionAlone(preheat).fit(series[:120])  # preheat not fitted yet: its own model
    reused = AttentionAlone(preheat.fit(series[:120])).fit(series[:120])
    assert reused.model is preheat.experts[0] and fresh.model is not reused.model
    origins = np.arange(120, 159)
    np.testing.assert_array_equal(
        fresh.forecast(series, origins, 2), reused.forecast(series, origins, 2)
    )
