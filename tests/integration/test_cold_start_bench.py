"""The cold-start benchmark (`benchmarks/cold_start.py`): its pieces, and a `--quick` run of both
arms through a real gateway, Redis and warm-up on a small generated trace (no ../shared)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import orjson
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(BENCHMARKS))  # a script imports its sibling by name
        return importlib.import_module("cold_start")


@pytest.fixture(scope="module")
def parts(bench: ModuleType) -> ModuleType:
    return importlib.import_module("cold_start_parts")  # imported by the script, cached


def write_trace(path: Path, requests: int = 36, gap_ms: int = 400, roots: int = 4) -> Path:
    """Mooncake rows: each request its root's 3 shared blocks and 2 blocks of its own."""
    with path.open("wb") as out:
        for i in range(requests):
            root = i % roots
            blocks = [100 * root + j for j in range(3)] + [1000 + 2 * i, 1001 + 2 * i]
            row = {"timestamp": i * gap_ms, "input_length": 512 * len(blocks),
                   "output_length": 4, "hash_ids": blocks}  # fmt: skip
            out.write(orjson.dumps(row) + b"\n")
    return path


@pytest.fixture(scope="module")
def tokenizer():
    from models.tiny_llm import load_tokenizer

    return load_tokenizer()


def test_equal_block_ids_give_equal_token_blocks(bench: ModuleType, tokenizer) -> None:
    builder = bench.PromptBuilder(tokenizer, tokens_per_block=4, max_tokens=500, seed=3)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    a, b = encode(builder.prompt([7, 8, 9])), encode(builder.prompt([7, 8, 5]))
    assert len(a) == len(b) == 12 == builder.tokens([7, 8, 9])  # one token a word
    assert a[:8] == b[:8] and a[8:] != b[8:]  # the shared blocks, and only those
    assert encode(builder.block(7)) == a[:4]  # a block tokenises alone as inside a prompt
    other = bench.PromptBuilder(tokenizer, tokens_per_block=4, max_tokens=500, seed=4)
    assert other.prompt([7]) != builder.prompt([7])  # the seed chooses the words


def test_prompts_are_cut_at_the_context(bench: ModuleType, tokenizer) -> None:
    builder = bench.PromptBuilder(tokenizer, tokens_per_block=4, max_tokens=10, seed=0)
    assert builder.tokens(range(50)) == 8
    assert len(tokenizer(builder.prompt(range(50)), add_special_tokens=False)["input_ids"]) == 8


def test_root_sampling_keeps_whole_prefix_trees(bench: ModuleType, tmp_path: Path) -> None:
    arrivals = bench.read_trace(write_trace(tmp_path / "t.jsonl", 400, roots=40), 400)
    assert len(arrivals) == 400 and arrivals[1].at == pytest.approx(0.4)
    kept = bench.root_sample(arrivals, 0.5, seed=1)
    roots = {a.blocks[0] for a in kept}
    assert roots and roots < {a.blocks[0] for a in arrivals}
    assert kept == [a for a in arrivals if a.blocks[0] in roots]  # every request of a kept root
    assert bench.root_sample(arrivals, 1.0, seed=1) == arrivals


def test_predicted_busy_counts_the_trace_reuse(bench: ModuleType, tokenizer) -> None:
    builder = bench.PromptBuilder(tokenizer, tokens_per_block=8, max_tokens=500, seed=0)
    first, again = bench.Arrival(0.0, (1, 2, 3, 4)), bench.Arrival(1.0, (1, 2, 3, 9))
    cost = {"request_s": 0.1, "token_ms": 1.0}
    # 32 tokens cold, then the 16-token pages of blocks 1-3 (24 tokens: one full page) kept
    assert bench.predicted_busy_s([first, again], builder, cost) == pytest.approx(
        0.1 + 0.032 + 0.1 + 0.016
    )


def test_busy_fraction_is_the_union_of_requests_in_flight(bench: ModuleType, parts) -> None:
    samples = [parts.Sample(0.0, 0.1, 2.0, 0), parts.Sample(1.0, 0.1, 3.0, 0),
               parts.Sample(6.0, 0.1, 12.0, 0)]  # fmt: skip
    assert bench.busy_fraction(samples, 0.0, 10.0) == pytest.approx(0.7)


def test_bad_input_is_one_line_and_exit_2(bench: ModuleType, capsys, tmp_path: Path) -> None:
    for argv in (["--bogus"], ["--trace", str(tmp_path / "missing.jsonl")], ["--requests", "0"]):
        with pytest.raises(SystemExit) as exited:
            bench.main(argv)
        assert exited.value.code == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
    short = write_trace(tmp_path / "short.jsonl", requests=5)  # 1.6 s: not two windows
    assert bench.main(["--trace", str(short), "--quick"]) == 2
    assert "two windows" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.slow
def test_quick_run_reports_both_arms(bench: ModuleType, capsys, tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "trace.jsonl")
    out = tmp_path / "result.json"
    assert bench.main(["--trace", str(trace), "--quick", "--out", str(out)]) == 0
    result = orjson.loads(out.read_text())
    assert orjson.loads(capsys.readouterr().out) == result
    assert result["scaling"]["tokens_per_block"] == 4 and result["model"]["name"] == "tiny-gpt2"
    assert result["ingest"]["accepted"] >= result["replayed"]["history_back_to_back"]  # in the lake
    for arm in ("off", "on"):
        after = result["arms"][arm]["after"]
        assert after["n"] == result["replayed"]["after"] > 0 and after["errors"] == 0
        assert after["p95_ms"] >= after["p50_ms"] > 0
        assert result["arms"][arm]["before"]["n"] > 0
    warm = result["arms"]["on"]["warmup"]
    assert warm["items_done"] >= 1 and warm["items_failed"] == 0 and warm["wall_s"] > 0
    assert result["arms"]["off"]["warmup"] is None
    assert isinstance(result["p95_cut_after"], float)
