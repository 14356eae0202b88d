"""The result of a template mining: templates by volume, each prompt's label, and `assign`.

`assign` is what the ingest path calls for every request, so it embeds nothing: it tokenises the
prompt and walks `PatternIndex` (see `pattern.py`). Measured on one CPU thread by
`benchmarks/templates.py`: ~9 us a prompt for short questions, 30-60 us for the templated
workload, ~160 us for role prompts of thousands of characters (tokenising the kept head and tail
is most of it). A stored templates table rebuilds the same assigner (`from_frame`): the constant
text with its `<*>` slots is the whole pattern.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from models.templates.pattern import Pattern, PatternIndex
from models.templates.tokens import tokenize

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class MinedTemplate:
    """One template: its id, constant text with `<*>` slots, and how much traffic it has."""

    template_id: str
    constant_text: str
    pattern: Pattern
    volume: int  # requests assigned (repeats of a prompt count)
    support: int  # distinct prompts assigned
    representatives: tuple[str, ...]

    @property
    def slots(self) -> int:
        return self.pattern.slots


@dataclass
class MinedTemplates:
    """The result of a mining: templates by volume, the input's labels, and `assign`."""

    templates: list[MinedTemplate]
    labels: list[str | None] = field(default_factory=list)  # per input prompt; None = one-off
    _index: PatternIndex = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.templates = sorted(self.templates, key=lambda t: (-t.volume, t.template_id))
        self._index = PatternIndex(t.pattern for t in self.templates)

    def assign(self, prompt: str) -> str | None:
        """The template id of `prompt`, or None for a one-off; token matching, no embedding."""
        found = self._index.lookup(tokenize(prompt).words)
        return None if found is None else self.templates[found].template_id

    def top(self, k: int) -> list[MinedTemplate]:
        """The `k` templates with the most volume."""
        return self.templates[:k]

    @property
    def coverage(self) -> float:
        return sum(x is not None for x in self.labels) / len(self.labels) if self.labels else 0.0

    def to_frame(self, tenant: str, mined_at: pd.Timestamp) -> pd.DataFrame:
        """The templates as a `TemplateTable` frame (validated)."""
        from data_contracts.templates import template_frame

        return template_frame(
            [
                {
                    "template_id": t.template_id,
                    "tenant": tenant,
                    "constant_text": t.constant_text,
                    "slots": t.slots,
                    "volume": t.volume,
                    "representative": t.representatives[0],
                    "mined_at": mined_at,
                }
                for t in self.templates
            ]
        )

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> MinedTemplates:
        """An assigner from a stored templates table (one tenant's rows)."""
        templates = [
            MinedTemplate(
                template_id=row.template_id,
                constant_text=row.constant_text,
                pattern=Pattern.parse(row.constant_text),
                volume=int(row.volume),
                support=int(row.volume),
                representatives=(row.representative,),
            )
            for row in frame.itertuples(index=False)
        ]
        return cls(templates)


def load_assigners(data_dir: str | Path) -> dict[str, MinedTemplates]:
    """Per tenant, the assigner of the mined templates table under `<data_dir>/features`
    (empty when none was mined). The gateway and warm-up both assign with it: an answer's
    template is part of its generations (`cache_runtime/generations.py`), so the two must agree
    on it for a warmed answer to be served."""
    from data_contracts.templates import read_templates

    table = read_templates(Path(data_dir) / "features")
    return {
        str(tenant): MinedTemplates.from_frame(rows)
        for tenant, rows in table.groupby("tenant", observed=True)
    }
