"""`benchmarks/tier_policy.py`: the policies through the real memory tier on KV pages, beside their
replay. One JSON object on a tiny generated prefix trace; one line and a non-zero exit on a bad
flag or a missing trace. No timings."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import orjson
import pytest
from helpers import templated_prompts, write_page_lake

from cache_runtime.queue_policies import S3FIFOPolicy
from cache_runtime.traces import load_trace
from models.evaluation.bench.tier_bench import tier_hits

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "tier_policy.py"
NAMES = ("lirs", "lru", "mq", "mq-short", "arc", "slru", "s3fifo", "wtinylfu")  # plain candidates


@pytest.fixture(scope="module")
def tier_policy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tier_policy_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_prefix_trace(path: Path, requests: int = 600, seed: int = 0) -> None:
    """Mooncake-format prompts: a few shared system prefixes, each followed by a popular
    document or a fresh tail, so most cached pages end up parents of other cached pages."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(requests):
        system = int(rng.integers(4))
        doc = int(rng.zipf(1.3)) % 50
        tail = [10_000 + i * 4 + j for j in range(int(rng.integers(1, 4)))]
        ids = [system, 100 + system * 100 + doc, *tail]
        row = {"timestamp": i, "input_length": 512 * len(ids), "output_length": 1}
        rows.append(orjson.dumps({**row, "hash_ids": ids}))
    path.write_bytes(b"\n".join(rows))


def test_one_json_object_with_every_policy_and_no_refused_page(
    tier_policy: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "prompts.jsonl"
    write_prefix_trace(trace)
    assert tier_policy.main(["--trace", str(trace), "--sizes", "0.05,0.2"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert set(out["sizes"]) == {"0.05", "0.2"} and out["refused_puts"] == 0
    for row in out["sizes"].values():
        policies = row["policies"]
        assert set(policies) == {"preheat", *NAMES}
        for figures in policies.values():
            assert 0 < figures["tier"] < 1 and 0 < figures["replay"] < 1
        best = row["best_candidate_in_tier"]
        assert best != "preheat" and policies[best]["tier"] == max(
            p["tier"] for n, p in policies.items() if n != "preheat"
        )
        assert row["preheat_margin_to_best_candidate"] == pytest.approx(
            policies["preheat"]["tier"] - policies[best]["tier"], abs=1e-4
        )


def test_a_policy_that_gives_up_shows_as_refused_pages(tmp_path: Path) -> None:
    """The figure the benchmark exists for: a victim that is None while a leaf could go."""

    class GivesUp(S3FIFOPolicy):
        def victim(self, keep):  # type: ignore[no-untyped-def]
            key = super().victim(keep)
            return None if key is not None and len(self._main) % 3 == 0 else key

    path = tmp_path / "prompts.jsonl"
    write_prefix_trace(path)
    trace = load_trace(path, "mooncake")
    assert tier_hits(S3FIFOPolicy(), trace, 40)[1] == 0
    assert tier_hits(GivesUp(), trace, 40)[1] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "0.1,x"], "expected comma-separated fractions"),
        (["--sizes", "0"], "every fraction must be in (0, 1]"),
        (["--trace", "/nonexistent/prompts.jsonl"], "not found"),
        (["--lake", "/nonexistent/data"], "is not a directory"),
        (["--trace", "t.jsonl", "--lake", "data"], "not allowed with argument"),
    ],
)
def test_a_bad_flag_or_trace_is_one_line(
    tier_policy: ModuleType,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        code = tier_policy.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1


def test_a_malformed_trace_is_one_line(
    tier_policy: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"not json\n")
    assert tier_policy.main(["--trace", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tier_policy.py: ") and len(err.strip().splitlines()) == 1


def test_a_data_directorys_request_log_runs_as_the_trace(
    tier_policy: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--lake DATA_DIR`: the requests the platform logged, as KV pages (what `make demo`
    leaves in `data`); a directory without a request log is one line."""
    trace = templated_prompts(requests=400)
    ends = [*trace.request_starts[1:].tolist(), len(trace.accesses)]
    pages = [trace.accesses[a:b].tolist() for a, b in zip(trace.request_starts, ends, strict=True)]
    write_page_lake(tmp_path / "data", pages, tokens=[16 * len(p) for p in pages], priority=5)
    assert tier_policy.main(["--lake", str(tmp_path / "data"), "--sizes", "0.05"]) == 0
    out = orjson.loads(capsys.readouterr().out)
    assert out["accesses"] == len(trace.accesses) and out["unique"] == trace.unique
    assert out["refused_puts"] == 0
    lirs = out["sizes"]["0.05"]["policies"]["lirs"]
    assert abs(lirs["tier"] - lirs["replay"]) < 0.01

    (tmp_path / "empty").mkdir()
    assert tier_policy.main(["--lake", str(tmp_path / "empty")]) == 1
    err = capsys.readouterr().err
    assert "no requests with prefix hashes" in err and len(err.strip().splitlines()) == 1
