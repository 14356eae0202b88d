"""One way to fit the platform's small Lightning models: on the CPU, quietly, deterministically.

Lightning is imported when a model is fitted or `quiet_training` is called, not with this module:
commands that never train (the cache's, the gateway's) do not pay for its import.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader


def quiet_training() -> None:
    """One thread and no Lightning banners: small models, and stdout carries only the JSON.
    Lightning first: its import sets its loggers to INFO, so levels set before it were undone
    (until 2026-12-06 `bench forecast` printed "GPU available" and a tip on every fit)."""
    import pytorch_lightning  # noqa: F401  (imported for its import-time logger set-up)
    import torch

    torch.set_num_threads(1)
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fit_on_cpu(module: pl.LightningModule, loader: DataLoader, epochs: int) -> None:
    """`Trainer.fit` without loggers, checkpoints or progress bars; leaves `module` in eval mode.

    CPU on purpose: models this small train faster on one core than through a GPU launch.
    """
    import pytorch_lightning as pl

    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        deterministic=True,
    )
    with warnings.catch_warnings():
        # Batches come from arrays in memory (a TensorDataset, or `attention.DrawnSamples`'s
        # few vectorised gathers): loader worker processes would cost more than they save, so
        # Lightning's "does not have many workers" advice does not apply.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        # pytorch-lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; not ours.
        warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*", category=FutureWarning)
        trainer.fit(module, loader)
    module.eval()
