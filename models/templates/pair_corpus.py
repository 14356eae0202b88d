"""What a pair set is made of and drawn from: the `Pair` record and the shipped prompts.

`load_corpus` reads NQ questions (with their answers, so two questions with a common answer are
never a negative) and the first sentence of each text role prompt; without those files (tests,
CI without shared/) a small built-in corpus stands in. See `models.templates.pairs`.
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

NQ_FILE = "nq_open_dev.jsonl"
ROLES_FILE = "awesome_chatgpt_prompts.csv"

FALLBACK_PROMPTS = (
    "when was the last time anyone was on the moon", "who wrote the declaration of independence",
    "how many seasons of the office are there", "what is the capital of australia",
    "who sings the song let it be", "where is the great barrier reef located",
    "when did the first world war begin", "what is the largest planet in the solar system",
    "who played the joker in the dark knight", "how many players are on a soccer team",
    "what is the boiling point of water at sea level", "who invented the telephone",
    "when was the eiffel tower built", "what language is spoken in brazil",
    "who is the author of pride and prejudice", "how long is the great wall of china",
    "what is the population of canada", "who won the world cup in 2014",
    "what does a central bank do", "how do interest rates affect inflation",
    "what is the difference between a stock and a bond", "how is a mortgage rate calculated",
    "why do bond prices fall when rates rise", "what is the tallest mountain in europe",
    "who directed the movie jaws", "when did the berlin wall fall",
    "I want you to act as a linux terminal.", "I want you to act as an English translator.",
    "I want you to act as a travel guide.", "I want you to act as a financial advisor.",
    "I want you to act as a math teacher.", "I want you to act as a storyteller.",
    "Explain how compound interest works for a savings account.",
    "Summarise the main risks of investing in emerging markets.",
    "Write a short poem about the ocean.", "Explain the rules of chess to a beginner.",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Pair:
    """Two prompts and whether one's answer serves the other (1) or not (0)."""

    text_a: str
    text_b: str
    label: int
    kind: str = ""


@dataclass(frozen=True, slots=True)
class Corpus:
    """The prompts pairs are drawn from, with the NQ answers that keep negatives honest."""

    prompts: list[str]
    answers: dict[str, frozenset[str]]  # NQ question -> its answers (empty for other prompts)


def load_corpus(prompts_dir: Path | None) -> Corpus:
    """NQ questions and role-prompt first sentences from `prompts_dir`; the built-in corpus when
    the directory or its files are missing."""
    prompts: list[str] = []
    answers: dict[str, frozenset[str]] = {}
    nq = prompts_dir / NQ_FILE if prompts_dir else None
    if nq is not None and nq.is_file():
        for line in nq.read_text(encoding="utf-8").splitlines():
            row = orjson.loads(line)
            prompts.append(row["question"])
            answers[row["question"]] = frozenset(a.lower() for a in row.get("answer", []))
    roles = prompts_dir / ROLES_FILE if prompts_dir else None
    if roles is not None and roles.is_file():
        prompts += _role_sentences(roles)
    if not prompts:
        prompts = list(FALLBACK_PROMPTS)
    return Corpus(list(dict.fromkeys(prompts)), answers)


def _role_sentences(path: Path) -> list[str]:
    csv.field_size_limit(sys.maxsize)  # some prompts are 100k+ characters
    out = []
    with path.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("type", "TEXT") != "TEXT":
                continue
            first = re.split(r"(?<=[.!?])\s", " ".join(row["prompt"].split()), maxsplit=1)[0]
            if 20 <= len(first) <= 200 and first[0].isalpha():
                out.append(first)
    return out
