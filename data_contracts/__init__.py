"""Pandera contracts for every table that crosses a package boundary.

This package imports nothing else from the project: flows, models and the cache runtime all
depend on it, never the reverse. Each table has one `DataFrameModel` with `coerce`, `strict` and
`ordered` set, so a frame either has exactly the documented columns in the documented order and
types, or it is rejected with an error that names the column, the check and the row.
"""

from __future__ import annotations

from data_contracts.demand import GRANULARITIES, TOTAL_KEY, DemandSeries
from data_contracts.forecast import KeyForecast
from data_contracts.quarantine import QuarantineRow
from data_contracts.request_log import TIMESTAMP_MAX, TIMESTAMP_MIN, RequestLog
from data_contracts.templates import TemplateTable
from data_contracts.validation import RowFailure, failures_by_row, validate
from data_contracts.version import CONTRACT_VERSION
from data_contracts.warmup import WarmupCandidate, WarmupPlan

__all__ = [
    "CONTRACT_VERSION",
    "GRANULARITIES",
    "TIMESTAMP_MAX",
    "TIMESTAMP_MIN",
    "TOTAL_KEY",
    "DemandSeries",
    "KeyForecast",
    "QuarantineRow",
    "RequestLog",
    "RowFailure",
    "TemplateTable",
    "WarmupCandidate",
    "WarmupPlan",
    "failures_by_row",
    "validate",
]
