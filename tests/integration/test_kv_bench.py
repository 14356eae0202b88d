"""`preheat bench kv`: every restore it times is checked against the cold prefill, and the JSON
has the shape issue 22 names (timings are not asserted: noisy machines)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

WAYS = (
    "cold",
    "in_process",
    "memory",
    "ssd",
    "redis",
    "redis_one_batch",
    "redis_chunks_of_two",
    "redis_page_by_page",
)
GPT2_SMALL_KV_BYTES_PER_TOKEN = 12 * 2 * 768 * 4  # layers x (keys, values) x width x fp32


def test_a_short_run_reports_every_way_for_every_length() -> None:
    from models.evaluation.bench.kv_bench import bench_kv

    result = bench_kv(lengths=(48, 80), repeats=1, device="cpu")

    assert result["device"] == "cpu" and result["model"]["parameters"] > 100_000_000
    assert set(result["lengths"]) == {"48", "80"}
    for length, row in result["lengths"].items():
        assert all(row[f"{way}_ms"] > 0 for way in WAYS)
        assert set(row["redis_transport"]) == {"mget_ms", "get_by_get_ms"}
        assert set(row["ratio_to_cold"]) == {"in_process", "memory", "ssd", "redis"}
        assert row["ratio_to_cold"]["memory"] == pytest.approx(
            row["memory_ms"] / row["cold_ms"], rel=1e-2
        )
        assert row["suffix_tokens"] == int(length) - (int(length) - 1) // 16 * 16
        # the page format's overhead (one header per page) is small next to the tensors
        assert 1 <= row["bytes_per_token"] / GPT2_SMALL_KV_BYTES_PER_TOKEN < 1.01


def test_a_restore_that_does_not_match_the_cold_prefill_fails_the_bench() -> None:
    from transformers import DynamicCache

    from models.evaluation.bench.kv_bench import _Prompt, build_model

    model, _ = build_model("cpu", 64)
    prompt = _Prompt(model, 48)
    kept = prompt.kept()
    prompt.restored(lambda kv: (kv, prompt.prefix))(kept)  # the right KV passes

    wrong = prompt.kept()
    for layer in wrong.layers:
        layer.keys = torch.randn_like(layer.keys)
    with pytest.raises(RuntimeError, match="differ from cold"):
        prompt.restored(lambda kv: (kv, prompt.prefix))(wrong)
    with pytest.raises(RuntimeError, match="restored 0 tokens"):
        prompt.restored(lambda _: (DynamicCache(config=model.config), 0))(None)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lengths", "a"], "--lengths 'a': expected token counts"),
        (["--lengths", "8"], "at least 32 tokens"),
        (["--lengths", "100000"], "at most 32768 tokens"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--device", "tpu"], "--device 'tpu': choose cpu or cuda"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    flags: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from flows.cli import main

    monkeypatch.setattr("sys.argv", ["preheat", "bench", "kv", *flags])
    with pytest.raises(SystemExit) as exited:  # main() turns a CliError into one line and 2
        main()

    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1
