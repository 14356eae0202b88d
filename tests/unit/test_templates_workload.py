"""The templated workload, the templates table contract and `preheat bench templates`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pandera.errors
import pytest
from test_templates_mining import fake_embed

from data_contracts import TemplateTable
from data_contracts.templates import read_templates, template_frame, write_templates
from models.evaluation.bench.templates_bench import PromptFileError, bench_templates, read_prompts
from models.templates.workload import SLOT, builtin_corpus, load_corpus, templated_workload

STAMP = pd.Timestamp("2024-03-04T00:00:00Z")


def test_workload_is_seeded_labelled_and_runs_without_shared_data(tmp_path: Path) -> None:
    corpus = load_corpus(tmp_path / "missing")
    assert corpus.source == "builtin"
    a = templated_workload(corpus, n_prompts=400, n_roles=6, seed=3)
    b = templated_workload(corpus, n_prompts=400, n_roles=6, seed=3)
    assert a == b and len(a.prompts) == len(a.labels) == 400
    assert a != templated_workload(corpus, n_prompts=400, n_roles=6, seed=4)
    for prompt, label in zip(a.prompts, a.labels, strict=True):
        if label >= 0:
            first = a.templates[label].split(SLOT)[0].strip()
            assert prompt.strip().startswith(first) or a.templates[label].startswith(SLOT)
    # 20 % one-offs asked, half questions; only 6 role prompts are left unused, and half of
    # those are one-offs (a small corpus gives fewer one-offs rather than repeating them).
    assert a.labels.count(-1) == 40 + 3
    assert sum(t.startswith("I want you to act as") for t in a.templates) == 6


def test_builtin_corpus_fillers_rarely_repeat() -> None:
    corpus = builtin_corpus()
    assert len(set(corpus.questions)) > 0.99 * len(corpus.questions) > 1_000


def test_template_table_contract_and_round_trip(tmp_path: Path) -> None:
    row = {
        "template_id": "tpl-1", "tenant": "acme", "constant_text": "Compare <*> with <*>",
        "slots": 2, "volume": 7, "representative": "Compare a with b", "mined_at": STAMP,
    }  # fmt: skip
    frame = template_frame([row])
    write_templates(tmp_path, frame)
    pd.testing.assert_frame_equal(read_templates(tmp_path), frame)
    assert read_templates(tmp_path / "none").empty
    with pytest.raises(pandera.errors.SchemaErrors, match="slots_match_constant_text"):
        TemplateTable.validate(template_frame([row]).assign(slots=1), lazy=True)
    with pytest.raises(pandera.errors.SchemaErrors, match="one_row_per_tenant_template"):
        template_frame([row, row])


def _prompt_file(tmp_path: Path) -> Path:
    from test_templates_mining import workload

    prompts, labels = workload()
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(
        b"".join(
            orjson.dumps({"text": p, "label": "" if label < 0 else f"t{label}"}) + b"\n"
            for p, label in zip(prompts, labels, strict=True)
        )
    )
    return path


def test_bench_templates_reports_the_issue_fields(tmp_path: Path) -> None:
    path = _prompt_file(tmp_path)
    out = bench_templates(path, None, "text", "label", embed=fake_embed)
    assert {"n", "clusters", "coverage", "silhouette", "ari", "nmi"} <= out.keys()
    assert (out["n"], out["clusters"], out["ari"]) == (30, 3, 1.0)
    unlabelled = bench_templates(path, "jsonl", "text", embed=fake_embed)
    assert "ari" not in unlabelled and unlabelled["coverage"] == out["coverage"]
    assert np.isfinite(out["assign_us_per_prompt"])


def test_bench_templates_on_prompts_without_templates(tmp_path: Path) -> None:
    path = tmp_path / "questions.jsonl"
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    path.write_text(
        "".join(
            orjson.dumps({"q": " ".join(rng.choice(words, size=6))}).decode() + "\n"
            for _ in range(40)
        )
    )
    out = bench_templates(path, None, "q", embed=fake_embed)
    assert (out["n"], out["clusters"], out["coverage"], out["silhouette"]) == (40, 0, 0.0, None)


def test_prompt_files_in_csv_and_bad_input(tmp_path: Path) -> None:
    csv_path = tmp_path / "p.csv"
    csv_path.write_text('act,prompt\nPoet,"Write, then rhyme"\nChef,\n')
    assert read_prompts(csv_path, None, "prompt", "act") == (["Write, then rhyme"], ["Poet"])
    with pytest.raises(PromptFileError, match="no field 'text'"):
        read_prompts(csv_path, "csv", "text")
    with pytest.raises(PromptFileError, match="no such file"):
        read_prompts(tmp_path / "none.csv", None, "prompt")
    with pytest.raises(PromptFileError, match="unknown --format 'xml'"):
        read_prompts(csv_path, "xml", "prompt")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(PromptFileError, match=r"bad\.jsonl:2: not a JSON object"):
        read_prompts(bad, None, "text")
