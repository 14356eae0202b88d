"""`RequestLog`: one LLM request as the platform sees it, from any log source."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

# Timestamps outside this range are quarantined: before 2000 is a unit mistake (seconds read as
# milliseconds, or a relative trace without an epoch); far in the future is a broken clock. The
# upper bound is fixed rather than "now + slack" so a validation result never depends on when it
# ran (re-validating an old lake must give the same answer).
TIMESTAMP_MIN = pd.Timestamp("2000-01-01T00:00:00Z")
TIMESTAMP_MAX = pd.Timestamp("2100-01-01T00:00:00Z")

# Identifiers are bounded so one bad producer cannot blow up keys and indexes downstream.
_ID = {"min_value": 1, "max_value": 256}


def _valid_hash_list(value: object) -> bool:
    """A prefix-block hash list is None or a non-empty list of signed 64-bit ints."""
    if value is None:
        return True
    if not isinstance(value, list) or not value:
        return False
    return all(type(h) is int and -(2**63) <= h < 2**63 for h in value)


class RequestLog(pa.DataFrameModel):
    """One request. Token counts are the serving model's tokenizer's counts.

    `prefix_hashes` are the chained hashes of the prompt's fixed-size prefix blocks (equal prefixes
    share their leading hashes), as signed 64-bit ints; None when the source does not have them.
    `priority` runs from 1 (background) to 10 (interactive, SLA-bound); sources without one get 5.
    """

    timestamp: Series[pd.DatetimeTZDtype] = pa.Field(
        dtype_kwargs={"unit": "ns", "tz": "UTC"}, ge=TIMESTAMP_MIN, lt=TIMESTAMP_MAX
    )
    tenant: Series[str] = pa.Field(str_length={"min_value": 1, "max_value": 64})
    request_id: Series[str] = pa.Field(str_length=_ID)
    session_id: Series[str] = pa.Field(str_length=_ID)
    prompt: Series[str] = pa.Field(nullable=True)
    prompt_tokens: Series[int] = pa.Field(ge=0)
    output_tokens: Series[int] = pa.Field(ge=0)
    prefix_hashes: Series[object] = pa.Field(nullable=True)
    template_id: Series[str] = pa.Field(nullable=True, str_length=_ID)
    route: Series[str] = pa.Field(nullable=True, str_length=_ID)
    latency_ms: Series[float] = pa.Field(nullable=True, ge=0)
    priority: Series[int] = pa.Field(ge=1, le=10)

    @pa.check("prefix_hashes", name="prefix_hashes_are_int64_lists", element_wise=True)
    def _prefix_hashes(cls, value: object) -> bool:  # noqa: N805 (pandera passes the class)
        return _valid_hash_list(value)

    @pa.dataframe_check(name="request_id_unique_per_tenant")
    def _unique_ids(cls, df: pd.DataFrame) -> Series[bool]:  # noqa: N805
        return ~df.duplicated(subset=["tenant", "request_id"], keep="first")

    class Config:
        coerce = True
        strict = True
        ordered = True


REQUEST_LOG_COLUMNS: tuple[str, ...] = tuple(RequestLog.to_schema().columns)
