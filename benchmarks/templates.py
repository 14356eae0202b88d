"""Template mining on the templated development workload and on the raw shipped prompt files.

Builds the workload of `models.templates.workload` from ../shared/data/prompts (templates whose
slots hold real NQ questions and role prompts, 20 % one-offs), writes it as a labelled JSONL and
runs `preheat bench templates` logic on it: once per seed with the chosen clustering (DBSCAN on
the constant tree) and, on the first seed, with the rejected ones (HDBSCAN, flat DBSCAN over all
constants, structure without embeddings) and with whole-prompt clustering (MiniLM embeddings of
whole prompts, DBSCAN eps 0.35 min_samples 5 and HDBSCAN). Then the raw shipped files, which are
not templated: coverage and silhouette. Prints one JSON object. Takes a few minutes (embedding
3,000 whole prompts is most of it).

Usage: python benchmarks/templates.py [--shared ../shared/data] [--prompts 3000] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import torch

from models.evaluation.bench.shared_data import add_shared_argument
from models.evaluation.bench.templates_bench import bench_templates
from models.templates.embeddings import shared_embedder
from models.templates.mining import MiningConfig
from models.templates.quality import template_quality
from models.templates.workload import load_corpus, templated_workload

RAW_FILES = (
    ("prompts/nq_open_dev.jsonl", "jsonl", "question"),
    ("prompts/awesome_chatgpt_prompts.csv", "csv", "prompt"),
)


def _write(path: Path, prompts: list[str], labels: list[int]) -> Path:
    path.write_bytes(
        b"".join(
            orjson.dumps({"text": p, "label": "" if label < 0 else str(label)}) + b"\n"
            for p, label in zip(prompts, labels, strict=True)
        )
    )
    return path


def _whole_prompt(prompts: list[str], labels: list[int]) -> dict[str, Any]:
    """The rejected baseline: density clustering of whole-prompt embeddings."""
    from sklearn.cluster import DBSCAN, HDBSCAN

    start = time.perf_counter()
    vectors = shared_embedder().embed(prompts)
    embed_s = time.perf_counter() - start
    out: dict[str, Any] = {"embed_s": round(embed_s, 1)}
    models = {
        "dbscan_eps0.35": DBSCAN(eps=0.35, min_samples=5, metric="cosine"),
        "hdbscan": HDBSCAN(min_cluster_size=5, metric="cosine", copy=True),
    }
    for name, model in models.items():
        found = model.fit(vectors).labels_.tolist()
        quality = template_quality(labels, found, None)
        out[name] = {k: round(quality[k], 4) for k in ("ari", "nmi", "coverage")}
    return out


def _workload(shared: Path, n: int, seeds: list[int], folder: Path) -> dict[str, Any]:
    corpus = load_corpus(shared / "prompts")
    out: dict[str, Any] = {"corpus": corpus.source, "prompts": n, "seeds": {}}
    for seed in seeds:
        work = templated_workload(corpus, n_prompts=n, n_roles=24 + 6 * seed, seed=seed)
        path = _write(folder / f"workload-{seed}.jsonl", work.prompts, work.labels)
        print(f"seed {seed}: mining {len(work.templates)} templates ...", file=sys.stderr)
        result = bench_templates(path, "jsonl", "text", "label", seed=seed)
        result["true_templates"] = len(work.templates)
        out["seeds"][str(seed)] = result
        if seed != seeds[0]:
            continue
        out["methods"] = {}
        for method in ("hdbscan", "flat", "structure"):
            print(f"seed {seed}: method {method} ...", file=sys.stderr)
            other = bench_templates(path, "jsonl", "text", "label", MiningConfig(method=method))
            out["methods"][method] = {k: other[k] for k in ("ari", "nmi", "coverage", "mining_s")}
        print(f"seed {seed}: whole-prompt clustering ...", file=sys.stderr)
        out["whole_prompt"] = _whole_prompt(work.prompts, work.labels)
    aris = [r["ari"] for r in out["seeds"].values()]
    out["ari_min"], out["ari_mean"] = min(aris), round(sum(aris) / len(aris), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--prompts", type=int, default=3_000)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [int(s) for s in args.seeds.split(",")]
    if not (args.shared / "prompts").is_dir():
        sys.exit(f"no prompts under {args.shared}: pass --shared")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        out["templated_workload"] = _workload(args.shared, args.prompts, seeds, Path(folder))
    out["raw_files"] = {}
    for relative, fmt, field in RAW_FILES:
        print(f"raw {relative} ...", file=sys.stderr)
        out["raw_files"][Path(relative).name] = bench_templates(args.shared / relative, fmt, field)
    print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
