"""From a group of prompts to its template: the constant parts all of them share, in order.

The group comes anchored at one end (the shared opening or closing that the tree and the
embeddings chose). The rest of the constant is what every member also shares: a common prefix
or suffix at the other end, and segments in the middle (the " with " of "Compare <*> with <*>").
Middle segments are the runs of the shortest member's middle whose tokens every member has, in
an order every member follows (rejected alternative: difflib matching blocks between members,
whose greedy longest-block choice aligns on a filler's common word and then loses the real
constant), kept only if they are unlikely to be shared by chance: a segment that a
share `p` of unrelated prompts contain appears in all `n` members by chance with probability
`p ** n`; it must be below `ALPHA`. That keeps "with" in "Compare <*> with <*>" over NQ
questions and drops "the" and "." that long fillers nearly always contain (rejected alternative:
a minimum segment length, which drops one-word constants and keeps long boilerplate of fillers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from models.templates.pattern import Pattern, find_segment
from models.templates.tokens import GAP, word_count

ALPHA = 0.01


def _common_prefix(sequences: Sequence[Sequence[str]]) -> int:
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        token = first[i]
        if token == GAP or any(s[i] != token for s in sequences):
            return i
    return n


def _common_suffix(sequences: Sequence[Sequence[str]], limit: int) -> int:
    first = sequences[0]
    for i in range(limit):
        token = first[-1 - i]
        if token == GAP or any(s[-1 - i] != token for s in sequences):
            return i
    return limit


def _common_blocks(
    regions: Sequence[Sequence[str]], real: Callable[[tuple[str, ...]], bool]
) -> list[tuple[str, ...]]:
    """Runs of the shortest region whose tokens every region contains, kept in an order that
    every region follows (the slot regions of a multi-slot template's prompts).

    Only `real` parts are placed: a filler's common words ("." "you are") would otherwise take
    positions anywhere in the regions and push the true constant out of order.
    """
    if not regions:
        return []
    base = min(regions, key=len)
    others = [set(region) for region in regions if region is not base]
    runs: list[list[str]] = [[]]
    for token in base:
        if token != GAP and all(token in other for other in others):
            runs[-1].append(token)
        elif runs[-1]:
            runs.append([])
    kept: list[tuple[str, ...]] = []
    starts = [0] * len(regions)
    for run in (tuple(r) for r in runs if r):
        # A run may hold a filler's word next to the constant ("." + "Question:"): the longest
        # part of it that every region has, in order after the last kept one, is the constant.
        for part in filter(real, _parts(run)):
            found = [find_segment(r, part, at) for r, at in zip(regions, starts, strict=True)]
            if all(f is not None for f in found):
                kept.append(part)
                starts = [f + len(part) for f in found]  # type: ignore[operator]
                break
    return kept


def _parts(run: tuple[str, ...], longest: int = 12) -> list[tuple[str, ...]]:
    """Contiguous parts of `run`, longest first (the whole run first, however long)."""
    parts = [run]
    for size in range(min(len(run) - 1, longest), 0, -1):
        parts += [run[i : i + size] for i in range(len(run) - size + 1)]
    return parts


def _by_chance(segment: tuple[str, ...], members: int, background: Sequence[Sequence[str]]) -> bool:
    """True when `segment` in all `members` prompts is what unrelated prompts would give."""
    hits = sum(1 for words in background if find_segment(words, segment) is not None)
    share = (hits + 1) / (len(background) + 2)
    return share**members >= ALPHA


def consensus_pattern(
    members: Sequence[Sequence[str]],
    anchored_at_start: bool,
    anchor_len: int,
    background: Sequence[Sequence[str]],
) -> Pattern | None:
    """The pattern every member matches, anchored by the group's chosen constant.

    Args:
        members: the group's prompts as normalised tokens (at least one).
        anchored_at_start: whether the anchor is the members' opening (else their closing).
        anchor_len: tokens of the anchor; kept even if it is common elsewhere (it was chosen).
        background: prompts outside the group, for the chance test of the other constants.
    """
    n = len(members)

    def real(segment: tuple[str, ...]) -> bool:
        return word_count(segment) >= 1 and not _by_chance(segment, n, background)

    shortest = min(len(m) for m in members)
    if anchored_at_start:  # the anchor end first, then the other end in what is left
        head = _common_prefix(members)
        tail = _common_suffix(members, max(shortest - head - 1, 0))  # a token for the slot
    else:
        tail = _common_suffix(members, max(shortest - 1, 0))
        head = min(_common_prefix(members), max(shortest - tail - 1, 0))
    if (head if anchored_at_start else tail) < anchor_len:
        return None
    prefix, suffix = tuple(members[0][:head]), tuple(members[0][len(members[0]) - tail :])
    if anchored_at_start:
        suffix = suffix if real(suffix) else ()
    else:
        prefix = prefix if real(prefix) else ()
    regions = [m[len(prefix) : len(m) - len(suffix)] for m in members]
    middles = _common_blocks(regions, real)
    pattern = _assemble(prefix, middles, suffix)
    if middles and not all(pattern.match(m) for m in members):
        pattern = _assemble(prefix, [], suffix)  # order differs between members: keep the ends
    return pattern if all(pattern.match(m) for m in members) else None


def _assemble(
    prefix: tuple[str, ...], middles: list[tuple[str, ...]], suffix: tuple[str, ...]
) -> Pattern:
    segments = tuple(s for s in (prefix, *middles, suffix) if s)
    return Pattern(segments, leading_slot=not prefix, trailing_slot=not suffix)
