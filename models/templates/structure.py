"""Structure-aware candidates: the shared openings (or closings) of prompts, as a tree.

Log miners such as Drain group lines by token count and leading tokens, then turn the positions
that vary into `<*>`. That works for log lines, whose variables are single tokens; a prompt's slot
holds a whole question or document, so token counts say nothing. What survives is the idea of
leading tokens: prompts of one template share their opening (system prompt, instruction) up to
the first slot, or their closing when the slot comes first.

For each distinct prompt, `shared_depths` finds how many leading tokens it shares with at least
`min_support - 1` other prompts: sort the token sequences, and the prompts sharing a prefix form a
contiguous run whose adjacent longest common prefixes are all at least that long (a suffix-array
argument: O(N log N) comparisons, no trie of N x 256 nodes in memory). That depth over-shoots
into the slot where fillers happen to agree ("Summarise ...: who", "...: how many"), which is why
the candidates form a tree (`constant_tree`) whose edges the embedding step then judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from models.templates.tokens import word_count


def _lcp(a: Sequence[str], b: Sequence[str]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def shared_depths(sequences: Sequence[tuple[str, ...]], min_support: int) -> np.ndarray:
    """(N,) for each sequence, the longest prefix it shares with >= min_support sequences."""
    n = len(sequences)
    if min_support <= 1:
        return np.array([len(s) for s in sequences], dtype=np.int64)
    if n < min_support:
        return np.zeros(n, dtype=np.int64)
    order = sorted(range(n), key=sequences.__getitem__)
    lcp = np.array(
        [0] + [_lcp(sequences[order[i - 1]], sequences[order[i]]) for i in range(1, n)],
        dtype=np.int64,
    )
    # window[j]: the prefix shared by sorted positions j .. j+m-1 (the min of their adjacent LCPs)
    window = sliding_window_view(lcp[1:], min_support - 1).min(axis=1)
    # a position's depth: the best window that contains it (positions r-m+1 .. r)
    padded = np.pad(window, (min_support - 1, min_support - 1))
    best = sliding_window_view(padded, min_support).max(axis=1)
    depths = np.empty(n, dtype=np.int64)
    depths[order] = best
    return depths


@dataclass(frozen=True, slots=True)
class ConstantNode:
    """A candidate constant: a shared opening, in the orientation the tree was built in.

    Attributes:
        tokens: the normalised tokens (reversed, for the tree of closings).
        parent: the nearest ancestor node, or None at a root.
        members: distinct prompts whose longest shared opening is exactly this node.
        example: a prompt (index) that starts with `tokens`, to render the original text.
    """

    tokens: tuple[str, ...]
    parent: int | None
    members: tuple[int, ...]
    example: int


def constant_tree(
    sequences: Sequence[tuple[str, ...]], depths: np.ndarray, min_words: int
) -> list[ConstantNode]:
    """The tree of candidate constants (a prompt is a member of at most one node).

    Nodes are every prompt's shared opening with at least `min_words` words, plus the branch
    points between them (the longest common prefix of two neighbouring openings), so openings
    that differ only past a branch point ("...: who", "...: what") hang off one common node even
    when no prompt stops exactly there. A branch point with fewer words is left out: openings that
    only share "What is the" are separate candidates.
    """
    openings: dict[tuple[str, ...], list[int]] = {}
    for i, (sequence, depth) in enumerate(zip(sequences, depths, strict=True)):
        opening = sequence[: int(depth)]
        if depth > 0 and word_count(opening) >= min_words:
            openings.setdefault(opening, []).append(i)
    keys = sorted(openings)
    branches = {
        a[: _lcp(a, b)] for a, b in pairwise(keys) if word_count(a[: _lcp(a, b)]) >= min_words
    }
    every = sorted(set(keys) | branches)
    index = {tokens: i for i, tokens in enumerate(every)}
    nodes: list[ConstantNode] = []
    stack: list[int] = []  # ancestors of the current node, in sorted (depth-first) order
    for tokens in every:
        while stack and every[stack[-1]] != tokens[: len(every[stack[-1]])]:
            stack.pop()
        members = tuple(openings.get(tokens, ()))
        example = members[0] if members else -1
        nodes.append(ConstantNode(tokens, stack[-1] if stack else None, members, example))
        stack.append(index[tokens])
    _fill_examples(nodes)
    return nodes


def _fill_examples(nodes: list[ConstantNode]) -> None:
    """A branch point with no members of its own borrows an example from a descendant."""
    for i in range(len(nodes) - 1, -1, -1):  # children come after their parent in sorted order
        node = nodes[i]
        if node.parent is not None and nodes[node.parent].example < 0:
            parent = nodes[node.parent]
            nodes[node.parent] = ConstantNode(
                parent.tokens, parent.parent, parent.members, node.example
            )


def subtree_components(
    nodes: Sequence[ConstantNode], chosen: Sequence[int], dropped: int
) -> list[list[int]]:
    """Split `chosen` (a connected set of nodes) into the parts left when `dropped` goes."""
    rest = set(chosen) - {dropped}
    parts: dict[int, list[int]] = {}
    for i in sorted(rest):
        top = i
        while nodes[top].parent is not None and nodes[top].parent in rest:
            top = nodes[top].parent  # type: ignore[assignment]
        parts.setdefault(top, []).append(i)
    return list(parts.values())


def roots_of(nodes: Sequence[ConstantNode], chosen: Sequence[int]) -> list[int]:
    """Nodes of `chosen` whose parent is not in `chosen`."""
    inside = set(chosen)
    return [i for i in chosen if nodes[i].parent not in inside]


def members_of(nodes: Sequence[ConstantNode], chosen: Sequence[int]) -> list[int]:
    return sorted(m for i in chosen for m in nodes[i].members)
