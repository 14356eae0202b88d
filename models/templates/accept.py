"""Which parts of a density cluster of constants are templates, and where each one's slot starts.

A cluster from `clustering.py` is a subtree of the constant tree whose edges barely move the
embedding. Three things can still be wrong with it, each decided here from its top node down:

- Fork: templates branch at the top rather than a slot starting there ("...act as a Cinematic"
  -> "Realism." | "Close-Up Portrait Generation."): hardly any prompt stops at the top (under
  `OWN_SHARE`) and they continue in at most `FORK_WAYS` ways. A slot's fillers continue in many.
- Instruction branches: below a shared system prompt, each instruction ("...rely on. List the
  covenants in this loan agreement:") is a template of its own even though the long shared prompt
  keeps the embeddings close. A branch is an instruction when it adds at least `BRANCH_WORDS`
  words and ends where a slot starts (`BOUNDARY_MARKS` or a line break); a filler's first words
  ("...analyst: who", "...: what is the") rarely do.
- Completeness: the top must be a whole instruction, not an opening that one-off prompts share
  ("when was the last time", "I want you to act as a"). A slot usually starts at a boundary; an
  opening without one must pass the closure test: followed by the slot's next `closure_words`
  words, its embedding stays within cosine `closure` of the constant alone. Measured with MiniLM
  (3 words, 8 prompts): instructions without a boundary 0.61-0.81 ("Write a haiku about" 0.81,
  "Give me three facts about" 0.76, "Tell me a joke about" 0.61), shared openings of NQ
  questions 0.29-0.71 ("who sings the theme" 0.71) and of role prompts up to 0.62; hence 0.72,
  which gives up some boundary-less instructions rather than merge one-offs. A closing needs a
  boundary or an opening that its prompts share and under `RARE_OPENING` of all prompts have
  ("Compare <*> with <*> and say which one is riskier."): shared endings of questions ("...the
  super bowl") keep their topic whatever precedes them, so the closure test cannot judge them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from models.templates.structure import ConstantNode, members_of, roots_of, subtree_components
from models.templates.tokens import GAP, Tokens, is_word, word_count

if TYPE_CHECKING:
    from models.templates.mining import MiningConfig

CLOSURE_SAMPLE = 8
OWN_SHARE = 0.1
FORK_WAYS = 3
BRANCH_WORDS = 2
RARE_OPENING = 0.05
# Marks that end a clause, after which a slot starts. Quotes, brackets and commas are left out:
# they end the constant parts of JSON and lists that fillers carry ('{ "colors": "').
BOUNDARY_MARKS = frozenset(":.?!;")


def _text(tokens: Tokens, first: int, last: int) -> str:
    return " ".join(tokens.text[tokens.spans[first][0] : tokens.spans[last][1]].split())


def boundary(tokens: Tokens, n: int, at_start: bool) -> bool:
    """Whether the slot next to the first (last) `n` tokens starts at punctuation or a new line."""
    words, spans, size = tokens.words, tokens.spans, len(tokens.words)
    inner, outer = (n - 1, n) if at_start else (size - n, size - n - 1)
    if not 0 <= outer < size or words[outer] == GAP:
        return True
    edge = words[inner] if at_start else words[outer]
    left, right = sorted((inner, outer))
    return edge in BOUNDARY_MARKS or "\n" in tokens.text[spans[left][1] : spans[right][0]]


def render(tokens: Tokens, n: int, at_start: bool, extra_words: int = 0) -> str:
    """The constant's original text (first or last `n` tokens), plus words into the slot.

    The extra words are appended after the constant for both ends: measured with MiniLM, the
    closing instructions then keep their meaning as the opening ones do (0.79-0.85 vs 0.62-0.65).
    """
    words, size = tokens.words, len(tokens.words)
    lo, hi = (0, n - 1) if at_start else (size - n, size - 1)
    constant = _text(tokens, lo, hi)
    if not extra_words:
        return constant
    step, at, seen = (1, hi + 1, 0) if at_start else (-1, lo - 1, 0)
    end = None
    while 0 <= at < size and words[at] != GAP and seen < extra_words:
        seen += is_word(words[at])
        end, at = at, at + step
    if end is None:
        return constant
    extra = _text(tokens, hi + 1, end) if at_start else _text(tokens, end, lo - 1)
    return f"{constant} {extra}"


def _sample(members: Sequence[int]) -> list[int]:
    step = max(len(members) // CLOSURE_SAMPLE, 1)
    return list(members[::step][:CLOSURE_SAMPLE])


def _fork(root: ConstantNode, members: list[int], sequences: Sequence[tuple[str, ...]]) -> bool:
    if len(root.members) >= OWN_SHARE * len(members):
        return False
    depth = len(root.tokens)
    ways = {sequences[m][depth] for m in members if len(sequences[m]) > depth}
    return len(ways) <= FORK_WAYS


def _below(nodes: Sequence[ConstantNode], chosen: Sequence[int], top: int) -> list[int]:
    """`top` and its descendants within `chosen`."""
    inside, out, stack = set(chosen), [], [top]
    children: dict[int, list[int]] = {}
    for i in chosen:
        parent = nodes[i].parent
        if parent is not None and parent in inside:
            children.setdefault(parent, []).append(i)
    while stack:
        here = stack.pop()
        out.append(here)
        stack.extend(children.get(here, ()))
    return out


class Acceptor:
    """Applies the three checks of the module docstring to one side's clusters."""

    def __init__(
        self,
        tokens: Sequence[Tokens],
        embed: Callable[[list[str]], np.ndarray],
        config: MiningConfig,
        background: Sequence[int] = (),
    ) -> None:
        self.tokens, self.embed, self.config = tokens, embed, config
        self.background = background  # a sample of all prompts (indices), for rare openings

    def accepted(
        self,
        nodes: Sequence[ConstantNode],
        group: list[int],
        sequences: Sequence[tuple[str, ...]],
        at_start: bool,
    ) -> list[tuple[list[int], int]]:
        """The template parts of a cluster: (its nodes, the anchor's length in tokens)."""
        work, out = [group], []
        while work:
            chosen = work.pop()
            if len(members_of(nodes, chosen)) < self.config.min_support:
                continue
            roots = roots_of(nodes, chosen)
            if len(roots) > 1:  # only from the flat and HDBSCAN clusterings
                work.extend(_below(nodes, chosen, root) for root in roots)
                continue
            split = self._split(nodes, chosen, roots[0], sequences, at_start)
            if split is not None:
                work.extend(split)
            elif self._complete(members_of(nodes, chosen), len(nodes[roots[0]].tokens), at_start):
                out.append((chosen, len(nodes[roots[0]].tokens)))
            elif len(chosen) > 1:
                work.extend(subtree_components(nodes, chosen, roots[0]))
        return out

    def _split(
        self,
        nodes: Sequence[ConstantNode],
        chosen: list[int],
        root: int,
        sequences: Sequence[tuple[str, ...]],
        at_start: bool,
    ) -> list[list[int]] | None:
        """The parts a cluster falls into at a fork or at instruction branches, else None."""
        if len(chosen) == 1:
            return None
        if _fork(nodes[root], members_of(nodes, chosen), sequences):
            return subtree_components(nodes, chosen, root)
        branches = self._branches(nodes, chosen, root, at_start)
        if not branches:
            return None
        taken = {i for branch in branches for i in branch}
        return [*branches, [i for i in chosen if i not in taken]]

    def _branches(
        self, nodes: Sequence[ConstantNode], chosen: list[int], root: int, at_start: bool
    ) -> list[list[int]]:
        """The highest instruction nodes below `root`, each with its subtree."""
        base = word_count(nodes[root].tokens)
        found, stack = [], [i for i in chosen if nodes[i].parent == root]
        while stack:
            i = stack.pop()
            subtree = _below(nodes, chosen, i)
            members = members_of(nodes, subtree)
            if len(members) < self.config.min_support:
                continue
            n, sample = len(nodes[i].tokens), _sample(members)
            ends = sum(boundary(self.tokens[m], n, at_start) for m in sample)
            if word_count(nodes[i].tokens) - base >= BRANCH_WORDS and 2 * ends > len(sample):
                found.append(subtree)
            else:
                stack.extend(c for c in chosen if nodes[c].parent == i)
        return found

    def _rare_opening(self, members: list[int]) -> bool:
        """Whether a closing's prompts also share an opening that few prompts have: a template
        with constants at both ends ("Compare <*> with <*> and say which one is riskier.")."""
        first = self.tokens[members[0]].words
        n = min(len(self.tokens[m].words) for m in members)
        size = next(
            (i for i in range(n) if any(self.tokens[m].words[i] != first[i] for m in members)), n
        )
        opening = first[:size]
        if not word_count(opening):
            return False
        inside = set(members)
        outside = [i for i in self.background if i not in inside]
        shared = sum(self.tokens[i].words[:size] == opening for i in outside)
        return (shared + 1) / (len(outside) + 2) <= RARE_OPENING

    def _complete(self, members: list[int], anchor_len: int, at_start: bool) -> bool:
        """A boundary after the constant, or else the closure test (module docstring)."""
        if self.config.method == "structure":
            return True
        sample = _sample(members)
        bounded = sum(boundary(self.tokens[m], anchor_len, at_start) for m in sample)
        if 2 * bounded >= len(sample):
            return True
        if not at_start:  # shared endings without a boundary are topics ("...the super bowl")
            return self._rare_opening(members)
        texts = [render(self.tokens[sample[0]], anchor_len, at_start)] + [
            render(self.tokens[m], anchor_len, at_start, self.config.closure_words) for m in sample
        ]
        vectors = self.embed(texts)
        return float((vectors[1:] @ vectors[0]).mean()) >= self.config.closure
