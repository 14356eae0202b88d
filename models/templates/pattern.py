"""A template's constant parts and slots, and the token matcher behind `assign`.

A `Pattern` is a list of constant segments with a slot between each two, and optionally a slot
before the first and after the last: "Compare <*> with <*>. Which is riskier?" has segments
("compare",), ("with",), (".", "which", "is", "riskier", "?") and two slots. A prompt matches
when the segments occur in order with at least one token in every slot.

`PatternIndex` finds the matching pattern without embedding anything: patterns that start with a
constant hang off a token trie of their first segment, patterns that start with a slot off a trie
of their reversed last segment, so a prompt walks at most two tries as deep as its shared opening
(or closing) and checks only the patterns found on the way. Rejected alternative: nearest
embedding of the prompt to the template centroids — ~5 ms a prompt on a CPU thread, and the
variable content pulls a prompt towards whichever template's slots talk about the same topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from models.templates.tokens import Tokens, tokenize, word_count

SLOT = "<*>"


@dataclass(frozen=True, slots=True)
class Pattern:
    """Constant segments (normalised tokens) with slots between them and maybe at the ends."""

    segments: tuple[tuple[str, ...], ...]
    leading_slot: bool
    trailing_slot: bool

    def __post_init__(self) -> None:
        if not self.segments or any(not segment for segment in self.segments):
            raise ValueError("a pattern needs at least one non-empty constant segment")

    @property
    def slots(self) -> int:
        return len(self.segments) - 1 + self.leading_slot + self.trailing_slot

    @property
    def constant_tokens(self) -> tuple[str, ...]:
        return tuple(token for segment in self.segments for token in segment)

    @property
    def specificity(self) -> tuple[int, int, int]:
        """Rank among patterns a prompt matches: an opening first, then constant words, tokens.

        An opening wins over a closing because the opening is what the user chose (and what a
        KV cache shares); a closing that wins is most often the boilerplate end of a slot's
        filler, e.g. a role prompt pasted into "List the covenants in this loan agreement: <*>".
        """
        tokens = self.constant_tokens
        return int(not self.leading_slot), word_count(tokens), len(tokens)

    def key(self) -> str:
        """The normalised form: equal keys are the same template."""
        parts = [" ".join(segment) for segment in self.segments]
        body = f" {SLOT} ".join(parts)
        return f"{SLOT} " * self.leading_slot + body + f" {SLOT}" * self.trailing_slot

    def match(self, words: Sequence[str]) -> bool:
        """True when the segments occur in order with at least one token in every slot."""
        return self.locate(words) is not None

    def locate(self, words: Sequence[str]) -> list[int] | None:
        """Start positions of the segments in `words`, or None when the prompt does not match."""
        n, segments = len(words), self.segments
        end = n
        if not self.trailing_slot:
            last = segments[-1]
            if len(last) > n or tuple(words[n - len(last) :]) != last:
                return None
            end = n - len(last)
        at = 1 if self.leading_slot else 0
        starts: list[int] = []
        inner = segments if self.trailing_slot else segments[:-1]
        for i, segment in enumerate(inner):
            found = find_segment(words, segment, at, end)
            if found is None or (i == 0 and not self.leading_slot and found != 0):
                return None
            starts.append(found)
            at = found + len(segment) + 1  # a slot holds at least one token
        if not self.trailing_slot:
            # The slot before the last segment needs a token; with no slot, it starts the prompt.
            room = at <= end if inner else (end >= 1 if self.leading_slot else end == 0)
            if not room:
                return None
            starts.append(end)
        elif at > n:  # the trailing slot is empty
            return None
        return starts

    def render(self, tokens: Tokens) -> str:
        """The constant text as written in `tokens` (a prompt it matches), slots as `<*>`."""
        starts = self.locate(tokens.words)
        if starts is None:
            return self.key()
        parts = []
        for start, segment in zip(starts, self.segments, strict=True):
            first, last = tokens.spans[start], tokens.spans[start + len(segment) - 1]
            text = " ".join(tokens.text[first[0] : last[1]].split())
            parts.append(text.replace(SLOT, "< * >"))  # a literal "<*>" must not read as a slot
        body = f" {SLOT} ".join(parts)
        return f"{SLOT} " * self.leading_slot + body + f" {SLOT}" * self.trailing_slot

    @classmethod
    def parse(cls, constant_text: str) -> Pattern:
        """The pattern of a rendered constant text (`render`'s inverse up to case and spacing)."""
        pieces = constant_text.split(SLOT)
        segments = tuple(tokenize(piece).words for piece in pieces)
        leading, trailing = not segments[0], not segments[-1]
        kept = tuple(segment for segment in segments if segment)
        if len(kept) != len(segments) - leading - trailing:
            raise ValueError(f"two slots with no constant between them: {constant_text!r}")
        return cls(kept, leading, trailing)


def find_segment(
    words: Sequence[str], segment: tuple[str, ...], start: int = 0, end: int | None = None
) -> int | None:
    """First position >= start where `segment` occurs entirely before `end`."""
    first, size = segment[0], len(segment)
    end = len(words) if end is None else end
    for i in range(start, end - size + 1):
        if words[i] == first and tuple(words[i : i + size]) == segment:
            return i
    return None


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    entries: list[int] = field(default_factory=list)


class PatternIndex:
    """Which pattern (by position in the list given) a prompt matches, most specific first."""

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        self.patterns = list(patterns)
        # Ties broken by the normalised text, so the winner never depends on the list's order.
        self._rank = [(p.specificity, p.key()) for p in self.patterns]
        self._heads, self._tails, self._floating = _Node(), _Node(), []
        for i, pattern in enumerate(self.patterns):
            if not pattern.leading_slot:
                _insert(self._heads, pattern.segments[0], i)
            elif not pattern.trailing_slot:
                _insert(self._tails, tuple(reversed(pattern.segments[-1])), i)
            else:  # only from a hand-edited table: mining anchors every template at one end
                self._floating.append(i)

    def lookup(self, words: Sequence[str]) -> int | None:
        """The index of the most specific matching pattern, or None."""
        candidates = [
            *_walk(self._heads, words),
            *_walk(self._tails, list(reversed(words))),
            *self._floating,
        ]
        best: int | None = None
        for i in candidates:
            if (best is None or self._rank[i] > self._rank[best]) and self.patterns[i].match(words):
                best = i
        return best


def _insert(root: _Node, tokens: tuple[str, ...], entry: int) -> None:
    node = root
    for token in tokens:
        node = node.children.setdefault(token, _Node())
    node.entries.append(entry)


def _walk(root: _Node, words: Sequence[str]) -> list[int]:
    found, node = [], root
    for token in words:
        next_node = node.children.get(token)
        if next_node is None:
            break
        node = next_node
        found.extend(node.entries)
    return found
