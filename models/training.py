"""One way to fit the platform's small Lightning models: on the CPU, quietly, deterministically."""

from __future__ import annotations

import warnings

import pytorch_lightning as pl
from torch.utils.data import DataLoader


def fit_on_cpu(module: pl.LightningModule, loader: DataLoader, epochs: int) -> None:
    """`Trainer.fit` without loggers, checkpoints or progress bars; leaves `module` in eval mode.

    CPU on purpose: models this small train faster on one core than through a GPU launch.
    """
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
        # The tensors are already in memory: loader worker processes would cost more than they
        # save, so Lightning's "does not have many workers" advice does not apply.
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
        # pytorch-lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; not ours.
        warnings.filterwarnings("ignore", message=".*treespec, LeafSpec.*", category=FutureWarning)
        trainer.fit(module, loader)
    module.eval()
