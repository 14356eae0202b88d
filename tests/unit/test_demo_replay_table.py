"""The demo's replay table reads whole in an 80-column terminal (what a pipe renders)."""

from __future__ import annotations

import io

from rich.console import Console

from models.evaluation.demo_replay import replay_table


def _block(hit: float, p95: float, utilisation: float) -> dict[str, object]:
    ttft = {"p50": 3392.0, "p95": p95, "p99": 11418.0}
    after = {"hit_ratio": hit, "ttft_ms": ttft, "utilisation": utilisation}
    return {"hit_ratio": {"total": hit}, "ttft_ms": ttft, "utilisation": utilisation,
            "after_restart": after}  # fmt: skip


def test_every_arm_and_figure_is_printed_whole_at_80_columns() -> None:
    reference = _block(0.411, 5170.0, 0.92)
    summaries = {
        "off": {**_block(0.412, 8885.0, 0.93), "warmup": None, "restore_reference": reference},
        "on": {
            **_block(0.418, 8153.0, 0.93),
            "warmup": {"items": 1354, "precision": 0.74},
            "restore_reference": reference,
        },
    }
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(replay_table(summaries))
    text = out.getvalue()

    assert "…" not in text  # rich's mark of a cut cell
    assert max(len(line) for line in text.splitlines()) <= 80
    for figure in ("8,885", "8,153", "5,170", "11,418", "1354", "0.74", "93%", "0.418"):
        assert figure in text
    for word in ("warm-up", "off", "on", "restore", "reference", "precision", "utilisation"):
        assert word in text


def test_an_idle_node_is_named_as_the_reason_ttft_barely_moves() -> None:
    from models.evaluation.demo_replay import _print_table

    def printed(busy: float) -> str:
        reference = _block(0.5, 31.4, busy)
        summaries = {"off": {**_block(0.5, 31.4, busy), "warmup": None,
                             "restore_reference": reference}}  # fmt: skip
        out = io.StringIO()
        _print_table(summaries, Console(file=out, width=200, color_system=None))
        return out.getvalue()

    assert "0.1% busy" in printed(0.001) and "--load 2" in printed(0.001)
    assert "busy at the demo's rate" not in printed(0.6)
