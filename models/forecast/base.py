"""The one interface every forecaster of a demand series implements, baseline or learned.

A forecaster is fitted once on the train part of a series and then asked for forecasts at many
origins. `forecast(series, origins, horizon)` answers all origins in one call (rolling-origin
evaluation asks for hundreds) and must use only `series[:origin]` for the row of `origin`: the
evaluation hands in the whole series, so a forecaster that peeks ahead would be caught by the
leakage test, not trusted.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Forecaster(Protocol):
    name: str

    def fit(self, train: np.ndarray) -> Forecaster:
        """Fit on `train` (T,) float64 counts; returns self."""
        ...

    def forecast(self, series: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
        """(len(origins), horizon) non-negative forecasts; row i sees only series[:origins[i]]."""
        ...
