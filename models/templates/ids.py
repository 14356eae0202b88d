"""Template ids that survive re-mining.

A new template's id is a hash of its normalised constant text, so mining the same prompts twice
gives the same ids without any state. When a previous mining is given, a template keeps the old
id of the template it barely differs from: first exact constant text, then the highest Jaccard
similarity of constant tokens at or above `threshold` (0.8: one word changed in a ten-word
instruction), each old id going to at most one new template. Rejected alternative: matching by
member prompts (the overlap of assigned prompts) — the previous prompts are not kept, only the
templates table, and prompts churn faster than instructions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

from models.templates.pattern import Pattern

ID_PREFIX = "tpl-"


def content_id(pattern: Pattern) -> str:
    """The id a template gets from its constant text alone."""
    digest = hashlib.blake2b(pattern.key().encode(), digest_size=6).hexdigest()
    return f"{ID_PREFIX}{digest}"


def jaccard(a: Pattern, b: Pattern) -> float:
    sa, sb = set(a.constant_tokens), set(b.constant_tokens)
    return len(sa & sb) / len(sa | sb) if sa or sb else 1.0


def stable_ids(
    patterns: Sequence[Pattern],
    previous: Mapping[str, str] | None = None,
    threshold: float = 0.8,
) -> list[str]:
    """One id per pattern: an old id where the template barely changed, else a content id.

    Args:
        patterns: the new mining's templates.
        previous: old template id -> its constant text (as in the templates table).
        threshold: the Jaccard similarity of constant tokens at which an old id is reused.
    """
    ids = [content_id(p) for p in patterns]
    if not previous:
        return ids
    old = {template_id: Pattern.parse(text) for template_id, text in previous.items()}
    by_key = {pattern.key(): template_id for template_id, pattern in old.items()}
    taken: set[str] = set()
    pending = []
    for i, pattern in enumerate(patterns):
        same = by_key.get(pattern.key())
        if same is not None and same not in taken:
            ids[i] = same
            taken.add(same)
        else:
            pending.append(i)
    scored = sorted(
        (
            (jaccard(patterns[i], pattern), i, template_id)
            for i in pending
            for template_id, pattern in old.items()
            if template_id not in taken
        ),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    matched: set[int] = set()
    for score, i, template_id in scored:
        if score < threshold:
            break
        if i in matched or template_id in taken:
            continue
        ids[i] = template_id
        matched.add(i)
        taken.add(template_id)
    # A fresh content id that equals an old id given to another template would merge two
    # templates' histories: suffix it instead (only possible when old constants collide).
    for i in pending:
        if i not in matched and ids[i] in taken:
            ids[i] = f"{ids[i]}-{i}"
    return ids
