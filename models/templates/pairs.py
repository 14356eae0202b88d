"""Labelled prompt pairs for calibrating and testing semantic hits, built from the shipped prompts.

Three sets, all seeded:

- positives (label 1): one prompt and a meaning-preserving rewrite of it: whitespace / case /
  punctuation, a one-character typo in a word no guard reads (a typo in "1972" changes the
  question), polite fillers added, dropped or moved, synonyms from a small list, and rephrasings
  ("what is X" -> "tell me X").
- negatives (label 0): two different questions, mostly hard ones: NQ questions sharing two or
  more content words (and no answer), questions opening with the same words, one content word
  swapped for another question's, two "act as" role prompts; plus some random pairs.
- guard pairs (label 0): a prompt and a copy differing only in an amount, a date, an account or
  order number, a ticker, a percentage or a negation. Embeddings barely see these changes; they
  are what the entity guards (`guards.py`) are for and are kept out of calibration (they would
  make the threshold look safer than it is).

Sources: `nq_open_dev.jsonl` (questions with answers: two questions with a common answer are
never used as a negative) and the first sentence of `awesome_chatgpt_prompts.csv`'s text prompts.
Without them (tests, CI without shared/) a small built-in corpus stands in.

The parts: `pair_corpus` (the `Pair` record and the corpus), `perturbations` (positives),
`hard_negatives` and `guard_pairs`; this module builds the mixed set, reads and writes pair
files, and names them all.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import orjson

from models.templates.guard_pairs import build_guard_pairs
from models.templates.hard_negatives import NEGATIVE_MIX, NegativeSampler
from models.templates.pair_corpus import (
    FALLBACK_PROMPTS,
    NQ_FILE,
    ROLES_FILE,
    Corpus,
    Pair,
    load_corpus,
)
from models.templates.perturbations import (
    PERTURBATIONS,
    filler,
    positive,
    rephrase,
    surface,
    synonym,
    typo,
)

__all__ = [
    "FALLBACK_PROMPTS",
    "NEGATIVE_MIX",
    "NQ_FILE",
    "PERTURBATIONS",
    "ROLES_FILE",
    "Corpus",
    "Pair",
    "build_guard_pairs",
    "build_pairs",
    "filler",
    "load_corpus",
    "positive",
    "read_pairs",
    "rephrase",
    "surface",
    "synonym",
    "typo",
    "write_pairs",
]


def build_pairs(
    corpus: Corpus, n_pairs: int = 4000, positive_share: float = 0.4, seed: int = 0
) -> list[Pair]:
    """`n_pairs` labelled pairs, shuffled: positives by perturbation, negatives by `NEGATIVE_MIX`.
    Duplicates are dropped, so a small corpus may give fewer pairs."""
    rng = random.Random(seed)
    n_pos = round(n_pairs * positive_share)
    sampler = NegativeSampler(corpus, rng)
    kinds, weights = list(NEGATIVE_MIX), list(NEGATIVE_MIX.values())
    pairs: dict[tuple[str, str], Pair] = {}
    for want, make in (
        (n_pos, lambda: positive(rng.choice(corpus.prompts), rng)),
        (n_pairs - n_pos, lambda: sampler.sample(rng.choices(kinds, weights)[0])),
    ):
        start, tries = len(pairs), 0
        while len(pairs) - start < want and tries < 50 * want:
            tries += 1
            pair = make()
            if pair is not None and (pair.text_a, pair.text_b) not in pairs:
                pairs[(pair.text_a, pair.text_b)] = pair
    out = list(pairs.values())
    rng.shuffle(out)
    return out


def write_pairs(pairs: Sequence[Pair], path: Path) -> None:
    """JSONL, one `{"text_a", "text_b", "label", "kind"}` per line."""
    Path(path).write_bytes(b"".join(orjson.dumps(asdict(p)) + b"\n" for p in pairs))


def read_pairs(path: Path) -> list[Pair]:
    """A JSON list or JSONL of `{"text_a", "text_b", "label"}` (label 0 or 1; extra fields kept
    only for `kind`). `ValueError` naming the record for anything else."""
    raw = Path(path).read_bytes()
    stripped = raw.lstrip()
    if stripped.startswith(b"["):
        records = orjson.loads(stripped)
    else:
        records = [orjson.loads(line) for line in raw.splitlines() if line.strip()]
    pairs = []
    for i, r in enumerate(records):
        ok = isinstance(r, dict) and isinstance(r.get("text_a"), str)
        if not ok or not isinstance(r.get("text_b"), str) or r.get("label") not in (0, 1):
            raise ValueError(f"{path}: record {i + 1} needs text_a, text_b (strings), label 0|1")
        pairs.append(Pair(r["text_a"], r["text_b"], int(r["label"]), str(r.get("kind", ""))))
    if not pairs:
        raise ValueError(f"{path}: no pairs")
    return pairs
