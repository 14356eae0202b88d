"""Hot-set prediction: exact metrics by hand, the oracle bound, no leakage, honest fitting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest

from cache_runtime.traces import TraceError, load_request_keys
from models.forecast.hotset import (
    DecayedFrequency,
    EwmaFrequency,
    HotsetScorer,
    KeyWindows,
    LastWindow,
    Oracle,
    default_scorers,
    evaluate_hotset,
    top_k,
    window_metrics,
)
from models.forecast.hotset_features import FeatureBoost

# Three 10 s windows of keys 10..50, then one request at t=30 that opens a partial window.
TINY = [
    (0, 10), (2, 10), (3, 20), (4, 30), (5, 10),  # w0: 10 x3, 20, 30 (30 seen after 20)
    (11, 10), (12, 20), (13, 40), (14, 20),  # w1: 20 x2, 10, 40 (40 seen after 10)
    (21, 20), (22, 20), (23, 40), (24, 50), (25, 20), (26, 40),  # w2: 20 x3, 40 x2, 50
    (30, 60),  # the partial window: dropped
]  # fmt: skip


def tiny() -> KeyWindows:
    times, keys = zip(*TINY, strict=True)
    return KeyWindows.build(np.array(times, dtype=float), np.array(keys), 10.0)


def random_windows(seed: int, n: int = 3000, span_s: float = 600.0) -> KeyWindows:
    rng = np.random.default_rng(seed)
    times = np.sort(rng.uniform(0, span_s, n))
    keys = rng.zipf(1.4, n) % 400 + 1000 * (times > span_s / 2)  # popularity shifts halfway
    return KeyWindows.build(times, keys, 30.0)


def test_windows_drop_the_partial_one_and_count_exactly() -> None:
    kw = tiny()
    assert kw.n_windows == 3 and kw.dropped == 1
    assert list(kw.keys) == [10, 20, 30, 40, 50]  # 60 only appears in the dropped window
    assert kw.row(1).tolist() == [1, 2, 0, 1, 0]
    assert kw.counts.sum() == len(TINY) - 1


def test_exact_precision_and_recall_on_a_hand_made_trace() -> None:
    kw = tiny()
    result = evaluate_hotset(kw, {"last": LastWindow(), "oracle": Oracle()}, 2, 1)
    # w1: predicts {10, 30} (30 beats 20 on recency); true counts 20:2, 10:1, 40:1 -> the true
    # top 2 is {20, 10 or 40}: precision 1/2, recall 1/4. w2: predicts {20, 40} (40 seen later
    # than 10); true top 2 {20, 40}: precision 1, recall 5/6.
    assert result["windows"] == 2
    assert result["methods"]["last"] == pytest.approx(
        {"precision_at_k": 0.75, "recall_of_requests": (1 / 4 + 5 / 6) / 2}
    )
    assert result["methods"]["oracle"] == pytest.approx(
        {"precision_at_k": 1.0, "recall_of_requests": (3 / 4 + 5 / 6) / 2}
    )


def test_top_k_breaks_ties_by_recency_then_code_and_skips_zero_scores() -> None:
    scores = np.array([1.0, 2.0, 1.0, 1.0, 0.0])
    last_seen = np.array([5.0, 1.0, 7.0, 5.0, 9.0])
    assert top_k(scores, 3, last_seen).tolist() == [1, 2, 0]
    assert top_k(scores, 10, last_seen).tolist() == [1, 2, 0, 3]


def test_precision_counts_fewer_requested_keys_than_k_against_the_method() -> None:
    counts = np.array([3.0, 1.0, 0.0, 0.0])
    assert window_metrics(counts, np.array([0, 1, 2]), 3) == pytest.approx((2 / 3, 1.0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_oracle_bounds_every_method_in_every_window(seed: int) -> None:
    kw = random_windows(seed)
    oracle = Oracle()
    for scorer in default_scorers(20).values():
        scorer.fit(kw, 5)
        for w in range(5, kw.n_windows):
            counts, last = kw.row(w), kw.last_seen(w)
            best = window_metrics(counts, top_k(oracle.scores(kw, w), 20, last), 20)
            got = window_metrics(counts, top_k(scorer.scores(kw, w), 20, last), 20)
            assert got[0] <= best[0] + 1e-12 and got[1] <= best[1] + 1e-12


def _replace_from(kw: KeyWindows, w: int, seed: int) -> KeyWindows:
    """The same requests before window w; from its start on, other times and other keys (new
    ones mixed with old ones), plus a last request that keeps every original window whole."""
    rng = np.random.default_rng(seed)
    b = kw.before(w)
    n_after = len(kw.times) - b + 50
    times = rng.uniform(kw.starts[w], kw.starts[-1] + kw.window_s, n_after)
    keys = rng.integers(5000, 5100, n_after)
    keys[::3] = rng.choice(kw.keys, len(keys[::3]))
    end = kw.starts[-1] + kw.window_s + 1.0
    return KeyWindows.build(
        np.concatenate([kw.times[:b], times, [end]]),
        np.concatenate([kw.keys[kw.codes[:b]], keys, [1]]),
        kw.window_s,
    )


def _by_key(kw: KeyWindows, scores: np.ndarray) -> dict[int, float]:
    return {int(kw.keys[c]): float(scores[c]) for c in np.flatnonzero(scores)}


@pytest.mark.parametrize(
    "make",
    [
        LastWindow,
        lambda: EwmaFrequency(20),
        lambda: DecayedFrequency(20),
        pytest.param(lambda: FeatureBoost(20, max_rounds=20), marks=pytest.mark.slow),
    ],
    ids=["last_window", "ewma", "decayed", "feature_boost"],
)
def test_scores_at_window_w_ignore_everything_from_its_start(
    make: Callable[[], HotsetScorer],
) -> None:
    kw, w = random_windows(3), 12
    other = _replace_from(kw, w, seed=9)
    assert np.array_equal(other.starts[: kw.n_windows], kw.starts)
    assert _by_key(kw, Oracle().scores(kw, w)) != _by_key(other, Oracle().scores(other, w))
    a, b = make().fit(kw, w), make().fit(other, w)
    scores_a, scores_b = a.scores(kw, w), b.scores(other, w)
    assert _by_key(kw, scores_a) == pytest.approx(_by_key(other, scores_b), rel=1e-12)
    top_a = kw.keys[top_k(scores_a, 20, kw.last_seen(w))]
    top_b = other.keys[top_k(scores_b, 20, other.last_seen(w))]
    assert top_a.tolist() == top_b.tolist()


def test_last_window_returns_exactly_the_previous_windows_counts() -> None:
    kw = random_windows(4)
    times, keys = kw.times, kw.keys[kw.codes]
    for w in range(1, kw.n_windows):
        in_prev = (times >= kw.starts[w - 1]) & (times < kw.starts[w])
        values, n = np.unique(keys[in_prev], return_counts=True)
        expected = dict(zip(values.tolist(), n.tolist(), strict=True))
        scores = LastWindow().scores(kw, w)
        got = {int(kw.keys[c]): int(scores[c]) for c in np.flatnonzero(scores)}
        assert got == expected
    assert not LastWindow().scores(kw, 0).any()


def _regime_trace(shifting: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """20 windows of 60 s: a fixed popular set (stable), or a new one every other window
    (shifting: only the last window tells which set is on, so alpha should be large)."""
    rng = np.random.default_rng(seed)
    times, keys = [], []
    for w in range(20):
        hot = np.arange(30) + (1000 * (w // 2) if shifting else 0)
        keys.append(np.concatenate([rng.choice(hot, 150), rng.integers(10**6, 10**7, 100)]))
        times.append(w * 60 + np.sort(rng.uniform(0, 60, 250)))
    return np.concatenate([*times, [1230.0]]), np.concatenate([*keys, [0]])


def test_ewma_alpha_is_fitted_on_windows_before_until_only() -> None:
    stable_t, stable_k = _regime_trace(shifting=False)
    shift_t, shift_k = _regime_trace(shifting=True)
    stable = EwmaFrequency(20).fit(KeyWindows.build(stable_t, stable_k, 60), 10).alpha
    assert EwmaFrequency(20).fit(KeyWindows.build(shift_t, shift_k, 60), 10).alpha > stable
    # Windows >= 10 switched from the stable regime to the shifting one: the same alpha.
    later = stable_t >= 600
    mixed_k = np.where(later, shift_k, stable_k)
    assert EwmaFrequency(20).fit(KeyWindows.build(stable_t, mixed_k, 60), 10).alpha == stable


def test_evaluate_fits_every_scorer_before_the_first_evaluated_window() -> None:
    seen: list[int] = []

    class Recording(LastWindow):
        def fit(self, kw: KeyWindows, until: int) -> Recording:
            seen.append(until)
            return self

    assert isinstance(Recording(), HotsetScorer)
    result = evaluate_hotset(random_windows(5), {"a": Recording(), "b": Recording()}, 10, 7)
    assert seen == [7, 7] and result["windows"] == 19 - 7
    with pytest.raises(ValueError, match="fits at k=20"):
        evaluate_hotset(random_windows(5), {"e": EwmaFrequency(20)}, 10, 7)


def test_unreadable_traces_raise_one_line_trace_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(orjson.dumps({"timestamp": 0, "hash_ids": [1]}) + b"\n{not json\n")
    lirs = tmp_path / "t.lirs"
    lirs.write_text("1\n2\n")
    cases = [(tmp_path / "missing.jsonl", "mooncake"), (bad, "mooncake"), (lirs, "lirs")]
    cases.append((bad, "csv"))
    for path, fmt in cases:
        with pytest.raises(TraceError) as err:
            load_request_keys(path, fmt)
        assert "\n" not in str(err.value)


def test_request_keys_are_the_fourth_block_or_the_last_of_shorter_prefixes(tmp_path: Path) -> None:
    records = [
        {"timestamp": 0, "hash_ids": [1, 2, 3, 4, 5]},
        {"timestamp": 1500, "hash_ids": []},  # no blocks: skipped
        {"timestamp": 2000, "hash_ids": [1, 7]},
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r) for r in records))
    times, keys = load_request_keys(path)
    assert times.tolist() == [0.0, 2.0] and keys.tolist() == [4, 7]
