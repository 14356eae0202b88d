"""Settling the mined patterns against every prompt, with the matcher `assign` uses.

Mining proposes patterns from two ends of the prompts and from clusters that may overlap; which
template a prompt belongs to is decided once, here, by `PatternIndex` (the most specific match),
so the labels of a mining and `assign` afterwards can never disagree. Then two kinds of pattern
go, and the prompts are assigned again until nothing changes:

- a pattern left with fewer than `min_support` prompts (its prompts went to a more specific one);
- a refinement: a pattern whose prompts all match a more general pattern whose constant means
  the same (`similar`, an embedding test). Fillers that are themselves templated make these:
  "Customer message: I want you to act as <*> Account note: <*>" inside "Customer message: <*>
  Account note: <*>". A refinement whose constant means something else stays: "I want you to act
  as a Poet. <*>" is not "I want you to act as a <*>"; nor does one that adds an instruction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from models.templates.accept import BOUNDARY_MARKS, BRANCH_WORDS
from models.templates.pattern import Pattern, PatternIndex
from models.templates.tokens import Tokens, word_count

REFINEMENT_SAMPLE = 32


def _assign(patterns: Sequence[Pattern], tokens: Sequence[Tokens]) -> list[int | None]:
    index = PatternIndex(patterns)
    return [index.lookup(t.words) for t in tokens]


def _adds_instruction(specific: Pattern, general: Pattern) -> bool:
    """Whether `specific` extends `general`'s opening by an instruction (see `accept.py`).

    "<system prompt> List the covenants in this loan agreement: <*>" inside "<system prompt>
    <*>" stays a template of its own however close the embeddings of the long shared prompt.
    """
    if specific.leading_slot or general.leading_slot:
        return False
    head, base = specific.segments[0], general.segments[0]
    if len(head) <= len(base) or head[: len(base)] != base:
        return False
    extension = head[len(base) :]
    return word_count(extension) >= BRANCH_WORDS and extension[-1] in BOUNDARY_MARKS


def _refinements(
    patterns: Sequence[Pattern],
    labels: Sequence[int | None],
    tokens: Sequence[Tokens],
    similar: Callable[[Pattern, Pattern], bool],
) -> set[int]:
    members: list[list[int]] = [[] for _ in patterns]
    for d, label in enumerate(labels):
        if label is not None:
            members[label].append(d)
    dropped: set[int] = set()
    for p in sorted(range(len(patterns)), key=lambda i: (len(members[i]), i)):
        step = max(len(members[p]) // REFINEMENT_SAMPLE, 1)
        sample = [tokens[d].words for d in members[p][::step][:REFINEMENT_SAMPLE]]
        for q in range(len(patterns)):
            if q == p or q in dropped:
                continue
            general = patterns[q]
            if (
                all(general.match(words) for words in sample)
                and not _adds_instruction(patterns[p], general)
                and similar(patterns[p], general)
            ):
                dropped.add(p)
                break
    return dropped


def settle(
    patterns: list[Pattern],
    tokens: Sequence[Tokens],
    min_support: int,
    similar: Callable[[Pattern, Pattern], bool] | None = None,
) -> list[int | None]:
    """Assign every distinct prompt, pruning `patterns` in place; returns the labels.

    Args:
        patterns: candidate patterns (duplicates allowed); left holding the survivors.
        tokens: the distinct prompts.
        min_support: distinct prompts a pattern must keep.
        similar: whether two patterns' constants mean the same; None keeps refinements.
    """
    patterns[:] = list({p.key(): p for p in patterns}.values())
    while True:
        labels = _assign(patterns, tokens)
        support = np.bincount([x for x in labels if x is not None], minlength=len(patterns)).astype(
            int
        )
        drop = {i for i in range(len(patterns)) if support[i] < min_support}
        if not drop and similar is not None:
            drop = _refinements(patterns, labels, tokens, similar)
        if not drop:
            return labels
        patterns[:] = [p for i, p in enumerate(patterns) if i not in drop]
