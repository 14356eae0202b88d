"""What the heat-GAN tests (test_heat_gan*.py) share: the window sizes, the tiny GAN's
configuration and the sawtooth heat it is trained on (the `split` and `model` fixtures of
tests/unit/conftest.py)."""

from __future__ import annotations

import numpy as np
import torch

from models.heat.gan import GanConfig
from models.heat.series import decayed_heat

# every heat-GAN test module imports this one: the tiny models run on one thread
torch.set_num_threads(1)

L, T = 7, 6
TINY = GanConfig(hidden=16, noise_dim=8, mlp_hidden=16, epochs=15, batch_size=64)


def sawtooth_heat(keys: int = 8, buckets: int = 120, period: int = 5) -> np.ndarray:
    """(K, N) decayed heat of keys that burst every `period` buckets (phase and size per key):
    a deterministic pattern an LSTM can learn from its last 7 buckets."""
    counts = np.zeros((keys, buckets))
    for k in range(keys):
        counts[k, (np.arange(buckets) + k) % period == 0] = 5.0 + 3.0 * k
    return decayed_heat(counts, TINY.half_life_buckets)
