"""Unit fixtures shared by several test files.

The heat GAN's (test_heat_gan.py, test_heat_gan_realism.py, test_heat_gan_simulate.py): one tiny
GAN trained once per session, not once per file. The tests only read it (training is seeded and
deterministic, sampling takes its own seed), so sharing it changes no test's numbers. Their
modules are imported inside the fixtures: every unit test loads this conftest, and torch is not
for all of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from models.heat.gan import HeatGan
    from models.heat.series import HeatSplit


@pytest.fixture(scope="session")
def split() -> HeatSplit:
    """The sawtooth heat cut into training and held-back windows (L buckets back, T ahead)."""
    from heat_gan_support import L, T, sawtooth_heat

    from models.heat.series import HeatSplit

    return HeatSplit.build(sawtooth_heat(), L, T)


@pytest.fixture(scope="session")
def model(split: HeatSplit) -> HeatGan:
    """The tiny GAN (`TINY`) trained on `split`'s training windows."""
    from heat_gan_support import TINY

    from models.heat.gan import train_gan

    return train_gan(split.train, TINY)
