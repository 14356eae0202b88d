"""Template mining with the real MiniLM on the built-in workload (~10 s: the one real-model test).

The structure is the same as the shipped-prompt workload's (instruction, slot-first, multi-slot
and role templates, one-offs); the closure test and the DBSCAN merges run on real embeddings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from models.templates.mining import mine_templates
from models.templates.quality import template_quality
from models.templates.workload import builtin_corpus, templated_workload

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_real_minilm_recovers_the_builtin_workload() -> None:
    from models.templates.embeddings import Embedder

    work = templated_workload(builtin_corpus(), n_prompts=500, n_roles=6, seed=1)
    mined = mine_templates(work.prompts, embed=Embedder().embed)
    quality = template_quality(work.labels, mined.labels, None)
    assert quality["ari"] >= 0.9, quality
    texts = {t.constant_text for t in mined.templates}
    assert (
        "Compare these two client questions and say which is more urgent. First: <*> Second: <*>"
        in texts
    )
    assert "<*> Translate the text above into French." in texts
