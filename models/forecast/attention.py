"""Multi-granularity temporal attention: one shared encoder over three time scales, gated fusion.

The model reads a key's demand history at several scales at once — the last `context` base
buckets, the last `context` buckets of `scales[1]` base buckets each, and so on (for the lake's
5 s / 3 min / 1 h series the factors are 1, 36, 720) — because bursts, sessions and daily tides
live at different scales and a single window long enough for the tides would drown the bursts.
One encoder (shared weights, so every scale trains it) turns each scale's tokens into a vector;
a learned gate weighs the scales per sample; a head predicts the next `horizon` base buckets.

Targets are the change from the last observed value, divided by the sample's recent level, and
the loss is the (sample-weighted) absolute error of the non-negative forecast. Why: counts are
bursty and heavy-tailed, so a squared loss chases the bursts and a model that must learn the
level itself wastes capacity on it; dividing by the level lets one model serve keys whose volumes
differ by orders of magnitude, and the absolute error targets the median, the forecast that MAE
rewards. Rejected: Poisson negative log-likelihood (it fits the mean, which bursts drag up, and
the rate traces carry fractional expected counts that are not Poisson draws).

Shape names: B samples, S scales, L context tokens per scale, D model width, H horizon.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, RandomSampler, WeightedRandomSampler

from models.training import fit_on_cpu

LEVEL_FLOOR = 1.0  # a key with almost no recent demand is scaled as if it had one request/bucket


@dataclass(frozen=True)
class AttentionConfig:
    """Hyper-parameters; they travel with the weights so a checkpoint rebuilds its own model."""

    scales: tuple[int, ...] = (1, 6, 36)
    context: int = 24
    horizon: int = 6
    d_model: int = 32
    heads: int = 4
    hidden: int = 64
    # Regularised because the series are short: on ServeGen (1.5k train samples) dropout 0.1,
    # weight decay 1e-2 and lr 1e-3 cut the test MAE from 215k to 200k against 0.0 / 1e-4 / 3e-3;
    # the season phase (below) raised it to 211k there, so it is off unless asked for.
    dropout: float = 0.1
    lr: float = 1e-3
    weight_decay: float = 1e-2
    epochs: int = 40
    batch_size: int = 128
    seed: int = 0
    season: int | None = None  # buckets per cycle (144 for a day of 10 min); feeds the phase
    # Samples drawn per epoch at most, a fresh draw each epoch: a bound on training time. The
    # demo lake's top 100 keys at 3 min give ~75k windows, 20 s an epoch on one CPU thread: 20
    # epochs, twice over, were 12 of `preheat train forecaster`'s 15.6 minutes. One series'
    # windows (`bench forecast`) stay under it.
    epoch_samples: int = 20_000

    def __post_init__(self) -> None:
        if not self.scales or any(s < 1 for s in self.scales):
            raise ValueError(f"scales must be positive aggregation factors, got {self.scales}")
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by heads {self.heads}")
        if self.context < 1 or self.horizon < 1:
            raise ValueError("context and horizon must be at least 1")
        if self.season is not None and self.season < 2:
            raise ValueError(f"season must be at least 2 buckets, got {self.season}")
        if self.epoch_samples < 1:
            raise ValueError(f"epoch_samples must be at least 1, got {self.epoch_samples}")

    @property
    def min_history(self) -> int:
        """Past buckets an origin needs (one: the last value its targets are relative to)."""
        return 1


@dataclass
class Windows:
    """Model inputs for a batch of (key, origin) samples, built from the past of each origin."""

    tokens: np.ndarray  # (B, S, L) per-base-bucket mean of each token's span, divided by level
    mask: np.ndarray  # (B, S, L) True where the token's whole span lies in the past
    last: np.ndarray  # (B,) the last observed base-bucket value
    level: np.ndarray  # (B,) the sample's recent level (mean of the last L base buckets, floored)
    phase: np.ndarray  # (B, 2) sin and cos of the origin's place in the season (zeros: no season)

    def take(self, index: np.ndarray) -> Windows:
        """The samples at `index`, in its order."""
        return Windows(
            self.tokens[index], self.mask[index], self.last[index], self.level[index],
            self.phase[index],
        )  # fmt: skip

    def sample_keys(self) -> list[bytes]:
        """One key per sample: a 128-bit BLAKE2 digest of everything the model reads about it
        (equal keys, equal forecasts), for memoising forecasts across calls. A digest, not the
        bytes themselves: those are 1,184 bytes a sample at the default config."""
        b = len(self.last)
        inputs = np.column_stack(
            [self.tokens.reshape(b, -1), self.mask.reshape(b, -1), self.last, self.level,
             self.phase]
        )  # fmt: skip  # (B, 2*S*L + 4)
        return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in inputs]


class WindowSource:
    """Builds the windows of any (row, origin) samples of one (K, T) series, from
    series[:, :origin] only. Each token is a span sum from one running sum, computed once here:
    building thousands of windows is then a few vectorised gathers, however many calls ask."""

    def __init__(self, series: np.ndarray, config: AttentionConfig) -> None:
        series = np.asarray(series, dtype=np.float64)
        self.series = series[None, :] if series.ndim == 1 else series  # (K, T)
        self.config = config
        self.cumulative = np.concatenate(
            [np.zeros((self.series.shape[0], 1)), np.cumsum(self.series, axis=1)], 1
        )  # (K, T + 1)

    def windows(self, rows: np.ndarray, origins: np.ndarray) -> Windows:
        """Windows for samples (rows[i], origins[i])."""
        config, cumulative = self.config, self.cumulative
        rows = np.asarray(rows, dtype=np.int64)
        origins = np.asarray(origins, dtype=np.int64)
        if np.any(origins < config.min_history) or np.any(origins > self.series.shape[1]):
            raise ValueError(
                "every origin needs at least one past bucket and must lie in the series"
            )
        steps = np.arange(config.context, 0, -1)  # (L,) tokens L..1 buckets of the scale back
        tokens, masks = [], []
        for scale in config.scales:
            start = origins[:, None] - steps[None, :] * scale  # (B, L)
            end = start + scale
            valid = start >= 0
            start_c, end_c = np.clip(start, 0, None), np.clip(end, 0, None)
            spans = cumulative[rows[:, None], end_c] - cumulative[rows[:, None], start_c]  # (B, L)
            tokens.append(np.where(valid, spans / scale, 0.0))
            masks.append(valid)
        tokens_arr = np.stack(tokens, axis=1)  # S x (B, L) -> (B, S, L)
        mask_arr = np.stack(masks, axis=1)
        base, base_mask = tokens_arr[:, 0], mask_arr[:, 0]  # (B, L) the finest scale
        level = np.maximum(base.sum(1) / np.maximum(base_mask.sum(1), 1), LEVEL_FLOOR)  # (B,)
        last = self.series[rows, origins - 1]
        phase = np.zeros((len(origins), 2))
        if config.season is not None:  # origins are bucket indices, so the phase is exact
            angle = 2 * np.pi * (origins % config.season) / config.season
            phase = np.stack([np.sin(angle), np.cos(angle)], axis=1)
        return Windows(tokens_arr / level[:, None, None], mask_arr, last, level, phase)


def multiscale_windows(
    series: np.ndarray, rows: np.ndarray, origins: np.ndarray, config: AttentionConfig
) -> Windows:
    """Windows for samples (rows[i], origins[i]) of `series` (K, T), from series[:, :origin] only
    (one `WindowSource` call)."""
    return WindowSource(series, config).windows(rows, origins)


class MultiScaleAttention(nn.Module):
    """Shared token encoder -> per-scale pooled vectors -> learned gate -> horizon head."""

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config
        d, n_scales = config.d_model, len(config.scales)
        self.value_in = nn.Linear(2, d)  # (value, log1p(value)) per token
        self.position = nn.Parameter(torch.randn(config.context, d) * 0.02)
        self.scale_embedding = nn.Parameter(torch.randn(n_scales, d) * 0.02)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn = nn.Sequential(
            nn.Linear(d, config.hidden), nn.GELU(), nn.Linear(config.hidden, d)
        )
        self.gate = nn.Linear(d, 1)
        self.head = nn.Sequential(
            nn.Linear(d + 3, config.hidden), nn.GELU(), nn.Linear(config.hidden, config.horizon)
        )
        self.dropout = nn.Dropout(config.dropout)

    def encode(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, S, L) tokens and mask -> (B, S, D) one pooled vector per scale."""
        b, s, length = tokens.shape
        d, heads = self.config.d_model, self.config.heads
        features = torch.stack([tokens, torch.log1p(tokens.clamp_min(0))], dim=-1)  # (B,S,L,2)
        x = self.value_in(features) + self.position + self.scale_embedding[:, None, :]  # (B,S,L,D)
        x = x.reshape(b * s, length, d)  # (B, S, L, D) -> (B*S, L, D): one encoder for all scales
        # A scale with no past token (an origin early in the series) would give a softmax over
        # nothing; let it attend to its last slot instead and drop it in the gate below.
        keep = mask.reshape(b * s, length).clone()  # (B*S, L)
        keep[:, -1] |= ~keep.any(dim=1)
        attend = keep[:, None, None, :]  # (B*S, 1, 1, L) broadcast over heads and queries
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)  # 3 x (B*S, L, D)
        q, k, v = (  # (B*S, L, D) -> (B*S, heads, L, D/heads)
            t.reshape(b * s, length, heads, d // heads).transpose(1, 2) for t in (q, k, v)
        )
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=attend)
        attended = attended.transpose(1, 2).reshape(b * s, length, d)  # -> (B*S, L, D)
        x = x + self.dropout(self.attn_out(attended))
        x = x + self.dropout(self.ffn(self.norm2(x)))
        # Pool by the most recent token, which has attended to every valid one. Rejected: a
        # masked mean, which is blind to order (two phases of an alternating series hold the same
        # values) and measurably failed to learn one (MAE 2.5 vs 0.1 on the unit test's series).
        return x[:, -1, :].reshape(b, s, d)  # (B*S, L, D) -> (B*S, D) -> (B, S, D)

    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, point: torch.Tensor
    ) -> torch.Tensor:
        """Predicted change from the last value, in level units: (B, H)."""
        per_scale = self.encode(tokens, mask)  # (B, S, D)
        gate_logits = self.gate(per_scale).squeeze(-1)  # (B, S)
        gate_logits = gate_logits.masked_fill(~mask.any(dim=2), float("-inf"))
        gate = torch.softmax(gate_logits, dim=1)  # (B, S); the finest scale is always present
        fused = (gate[..., None] * per_scale).sum(1)  # (B, D)
        return self.head(torch.cat([fused, point], dim=1))  # (B, D + 3) -> (B, H)

    def gate_weights(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, S) how much each scale contributed: the model's own explanation of a forecast."""
        logits = self.gate(self.encode(tokens, mask)).squeeze(-1)
        return torch.softmax(logits.masked_fill(~mask.any(dim=2), float("-inf")), dim=1)


class ForecastModule(pl.LightningModule):
    """Lightning wrapper: weighted absolute error of the non-negative forecast, AdamW."""

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config
        self.net = MultiScaleAttention(config)

    def forecast_scaled(
        self, tokens: torch.Tensor, mask: torch.Tensor, point: torch.Tensor
    ) -> torch.Tensor:
        """Non-negative forecast in level units: (B, H); point[:, 0] is the last value."""
        return F.relu(point[:, :1] + self.net(tokens, mask, point))

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        tokens, mask, point, target_scaled = batch
        # The loss sees the forecast before the clip at zero: a clipped forecast has no gradient,
        # and a model pushed below zero early stayed there (measured on the unit test's series).
        raw = point[:, :1] + self.net(tokens, mask, point)  # (B, H)
        loss = F.l1_loss(raw, target_scaled)
        self.log("train_l1", loss, prog_bar=False, on_epoch=True, on_step=False)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )


def _tensors(windows: Windows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        torch.as_tensor(windows.tokens, dtype=torch.float32),
        torch.as_tensor(windows.mask),
        # (B, 3): the last value in level units and the season phase, read by the head
        torch.as_tensor(
            np.column_stack([windows.last / windows.level, windows.phase]), dtype=torch.float32
        ),
    )


class DrawnSamples(Dataset):
    """Training samples (rows[i], origins[i]) whose windows and targets are built when a batch
    draws them (`__getitems__`, which the loader calls with the batch's indices), not all up
    front: an epoch draws `epoch_samples` of them, and at 5 s the demo lake's 103 keys x 26k
    origins are 2.7M samples: built at once, their windows took the training to 9.6 GB at most
    (3.6 GB without). The same samples, in the same draws, as tensors built up front (each
    sample's window is its own)."""

    def __init__(self, source: WindowSource, rows: np.ndarray, origins: np.ndarray) -> None:
        self.source = source
        self.rows = np.asarray(rows, dtype=np.int64)  # (N,)
        self.origins = np.asarray(origins, dtype=np.int64)  # (N,)
        # checked here, not when a batch draws them: a bad sample fails before training starts
        keys, buckets = source.series.shape
        if np.any(self.rows < 0) or np.any(self.rows >= keys):
            raise ValueError(f"a training sample's row is not one of the series' {keys}")
        if np.any(self.origins < source.config.min_history) or np.any(self.origins > buckets):
            raise ValueError(
                "every origin needs at least one past bucket and must lie in the series"
            )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        """(tokens, mask, point, targets in level units (B, H)) of the samples at `indices`."""
        index = np.asarray(indices, dtype=np.int64)
        rows, origins = self.rows[index], self.origins[index]
        windows = self.source.windows(rows, origins)
        offsets = origins[:, None] + np.arange(self.source.config.horizon)[None, :]  # (B, H)
        targets = self.source.series[rows[:, None], offsets] / windows.level[:, None]
        return (*_tensors(windows), torch.as_tensor(targets, dtype=torch.float32))


def _built(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The loader's collate: `DrawnSamples.__getitems__` has built the batch already."""
    return batch


def train_module(
    series: np.ndarray,
    rows: np.ndarray,
    origins: np.ndarray,
    config: AttentionConfig,
    sample_weights: np.ndarray | None = None,
) -> ForecastModule:
    """Train on samples (rows[i], origins[i]); targets series[row, origin:origin+H] must exist.

    With `sample_weights`, batches are drawn with probability proportional to the weight (the
    long-tail sampling of `weighting.tail_weights`); without, every sample equally. Each epoch
    draws `config.epoch_samples` of them at most (all, shuffled, when there are fewer).
    """
    series = np.atleast_2d(np.asarray(series, dtype=np.float64))
    if np.any(origins + config.horizon > series.shape[1]):
        raise ValueError("a training origin's targets run past the end of the series")
    torch.manual_seed(config.seed)
    dataset = DrawnSamples(WindowSource(series, config), rows, origins)
    generator = torch.Generator().manual_seed(config.seed)
    per_epoch = min(len(dataset), config.epoch_samples)
    if sample_weights is None:  # as `shuffle=True` draws (the loader's generator too, as there)
        sampler = RandomSampler(dataset, num_samples=per_epoch, generator=generator)
        loader = DataLoader(
            dataset, batch_size=config.batch_size, sampler=sampler, generator=generator,
            collate_fn=_built,
        )  # fmt: skip
    else:
        weights = torch.as_tensor(sample_weights, dtype=torch.double)
        sampler = WeightedRandomSampler(weights, per_epoch, generator=generator)
        loader = DataLoader(
            dataset, batch_size=config.batch_size, sampler=sampler, collate_fn=_built
        )
    module = ForecastModule(config)
    fit_on_cpu(module, loader, config.epochs)
    return module


def predict(
    module: ForecastModule, series: np.ndarray, rows: np.ndarray, origins: np.ndarray
) -> np.ndarray:
    """(B, H) non-negative forecasts for samples (rows[i], origins[i]) from their past only."""
    return predict_windows(module, multiscale_windows(series, rows, origins, module.config))


@torch.no_grad()
def predict_windows(module: ForecastModule, windows: Windows) -> np.ndarray:
    """(B, H) non-negative forecasts for built windows."""
    scaled = module.forecast_scaled(*_tensors(windows)).double().numpy()  # (B, H)
    return scaled * windows.level[:, None]


def save_checkpoint(module: ForecastModule, path: Path, metadata: dict[str, Any]) -> None:
    """Weights plus the config that rebuilds them, plus who made them (nanoGPT-style)."""
    torch.save(
        {"config": asdict(module.config), "state_dict": module.state_dict(), "meta": metadata},
        path,
    )


def load_checkpoint(path: Path) -> tuple[ForecastModule, dict[str, Any]]:
    blob = torch.load(path, map_location="cpu", weights_only=True)
    config = blob["config"]
    module = ForecastModule(AttentionConfig(**{**config, "scales": tuple(config["scales"])}))
    module.load_state_dict(blob["state_dict"])
    module.eval()
    return module, blob["meta"]


def origin_range(length: int, config: AttentionConfig) -> np.ndarray:
    """Every origin of a series of `length` whose targets are all observed."""
    return np.arange(config.min_history, length - config.horizon + 1)


class AttentionForecaster:
    """The attention model behind the `Forecaster` protocol, for a single (total) series."""

    name = "attention"

    def __init__(self, config: AttentionConfig | None = None) -> None:
        self.config = config or AttentionConfig()
        self.module: ForecastModule | None = None

    def fit(self, train: np.ndarray) -> AttentionForecaster:
        train = np.asarray(train, dtype=np.float64)
        origins = origin_range(len(train), self.config)
        if len(origins) < 8:
            raise ValueError(
                f"{len(train)} train buckets leave {len(origins)} samples for horizon "
                f"{self.config.horizon}; the attention model needs at least 8"
            )
        self.module = train_module(train, np.zeros_like(origins), origins, self.config)
        return self

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        if self.module is None:
            raise RuntimeError("fit the attention forecaster before forecasting")
        if horizon > self.config.horizon:
            raise ValueError(f"trained for horizon {self.config.horizon}, asked for {horizon}")
        origins = np.asarray(origins, dtype=np.int64)
        out = predict(self.module, np.asarray(series), np.zeros_like(origins), origins)
        return out[:, :horizon]


def n_parameters(module: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in module.parameters())
