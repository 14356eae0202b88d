"""`models.training.quiet_training`: a command that trains prints its JSON and no Lightning banners,
also when nothing imported Lightning before the call, as in the commands (its import resets its
loggers to INFO: the case that printed banners until 2026-12-06)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# called before anything imports Lightning, as the commands call it; then one epoch of a
# one-weight model through the project's own fit
FIT = """
from models.training import fit_on_cpu, quiet_training
quiet_training()
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

class Line(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.line = torch.nn.Linear(1, 1)

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.line(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

fit_on_cpu(Line(), DataLoader(TensorDataset(torch.ones(4, 1), torch.ones(4, 1)), batch_size=2), 1)
print("fitted")
"""


@pytest.mark.slow  # a fresh interpreter importing torch and Lightning
def test_a_fit_after_quiet_training_prints_no_lightning_banner() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FIT], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "fitted"
    for banner in ("GPU available", "TPU available", "Tip:", "max_epochs"):
        assert banner not in done.stderr, done.stderr
