"""Semantic-key goals of issue 6 on development pairs built from the shipped prompts.

Builds seeded development pairs (`models.templates.pairs`: perturbation positives, hard negatives)
and the guard set from ../shared/data/prompts (read by path, never copied), writes them as JSONL
next to the result, runs `preheat bench semantic` on them in-process and adds:

- goals: realised false-hit rate on the evaluation half <= 2 x target (1% -> 2%); recall within
  0.02 of GPTCache's calibrated recall; zero false hits on the guard set and on the
  entity-substitution set (`models.templates.substitutions`);
- simhash: how robust the SimHash key and its buckets are: for one-character typos and for all
  positives, the share with the same 64-bit SimHash, the same bucket, and a bucket found by the
  lookup's probes, for several bucket widths and probe counts (how BUCKET_BITS and PROBES were
  chosen), counted over positives whose cosine clears the calibrated threshold.

Usage: python benchmarks/semantic.py [--shared ../shared/data] [--pairs 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson

from models.evaluation.bench.semantic_bench import bench_semantic
from models.evaluation.bench.shared_data import add_shared_argument
from models.templates.embeddings import Embedder
from models.templates.pairs import (
    Pair,
    build_guard_pairs,
    build_pairs,
    load_corpus,
    write_pairs,
)
from models.templates.semantic import bucket_of, normalise, probe_buckets, simhash64
from models.templates.substitutions import build_substitution_pairs

WIDTHS = (4, 6, 8, 10, 12)
PROBE_COUNTS = (1, 4, 8, 16, 32)


def bucket_robustness(embedder: Embedder, pairs: list[Pair], threshold: float) -> dict:
    """Shares of positive pairs whose stored prompt the lookup's buckets reach."""
    positives = [p for p in pairs if p.label == 1]
    a = embedder.embed([normalise(p.text_a) for p in positives])
    b = embedder.embed([normalise(p.text_b) for p in positives])
    cosine = (a * b).sum(axis=1)
    hash_a = [simhash64(v) for v in a]
    hash_b = [simhash64(v) for v in b]
    typo = np.asarray([p.kind == "typo" for p in positives])
    same = np.asarray([x == y for x, y in zip(hash_a, hash_b, strict=True)])
    out: dict = {
        "typos": int(typo.sum()),
        "typo_median_cosine": round(float(np.median(cosine[typo])), 4) if typo.any() else None,
        "typo_same_simhash64": round(float(same[typo].mean()), 4) if typo.any() else None,
        "positives_same_simhash64": round(float(same.mean()), 4),
        "positives_above_threshold": int((cosine >= threshold).sum()),
    }
    for name, mask in (("typo", typo), ("positive", np.ones(len(positives), dtype=bool))):
        keep = np.flatnonzero(mask & (cosine >= threshold))
        table = {}
        for bits in WIDTHS:
            row = {}
            for probes in PROBE_COUNTS:
                found = [bucket_of(hash_a[i], bits) in probe_buckets(b[i], bits, probes)
                         for i in keep]  # fmt: skip
                row[f"probes_{probes}"] = round(float(np.mean(found)), 4) if keep.size else None
            table[f"bits_{bits}"] = row
        out[f"{name}_above_threshold_found"] = {"n": int(keep.size), **table}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_shared_argument(parser)
    parser.add_argument("--pairs", type=int, default=4000)
    parser.add_argument("--guards-per-category", type=int, default=100)
    parser.add_argument("--target-fhr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="Directory for the pair files.")
    args = parser.parse_args()
    prompts = args.shared / "prompts"
    if not prompts.is_dir():
        sys.exit(f"{prompts}: not found (the shipped prompts are needed)")
    corpus = load_corpus(prompts)
    pairs = build_pairs(corpus, args.pairs, seed=args.seed)
    guards = build_guard_pairs(corpus, args.guards_per_category, seed=args.seed)
    substitutions = build_substitution_pairs(corpus, seed=args.seed)
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="preheat-semantic-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pairs(pairs, out_dir / "dev_pairs.jsonl")
    write_pairs(guards, out_dir / "guard_pairs.jsonl")
    write_pairs(substitutions, out_dir / "substitution_pairs.jsonl")
    embedder = Embedder(threads=1)
    result = bench_semantic(
        pairs, args.target_fhr, args.seed, guards, embedder,
        progress=lambda text: print(text, file=sys.stderr), substitution_pairs=substitutions,
    )  # fmt: skip
    result["simhash"] = bucket_robustness(embedder, pairs, result["preheat"]["threshold"])
    gpt = result["gptcache"].get("calibrated", {})
    result["goals"] = {
        "fhr_within_2x_target": result["preheat"]["false_hit_rate"] <= 2 * args.target_fhr,
        "recall_gap_to_gptcache": (
            round(gpt["recall"] - result["preheat"]["recall"], 4) if gpt else None
        ),
        "recall_within_0.02_of_gptcache": (
            result["preheat"]["recall"] >= gpt["recall"] - 0.02 if gpt else None
        ),
        "zero_guard_false_hits": result["guards"]["false_hits"] == 0,
        "zero_substitution_false_hits": result["substitutions"]["false_hits"] == 0,
    }
    result["files"] = str(out_dir)
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
