"""`RequestLog`: one LLM request as the platform sees it, from any log source."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import INT64_LIST_KW, STRING_KW, UTC_KW

# Timestamps outside this range are quarantined: before 2000 is a unit mistake (seconds read as
# milliseconds, or a relative trace without an epoch); far in the future is a broken clock. The
# upper bound is fixed rather than "now + slack" so a validation result never depends on when it
# ran (re-validating an old lake must give the same answer).
TIMESTAMP_MIN = pd.Timestamp("2000-01-01T00:00:00Z")
TIMESTAMP_MAX = pd.Timestamp("2100-01-01T00:00:00Z")

# Identifiers are bounded so one bad producer cannot blow up keys and indexes downstream.
_ID = {"min_value": 1, "max_value": 256}


class RequestLog(pa.DataFrameModel):
    """One request. Token counts are the serving model's tokenizer's counts.

    `prefix_hashes` are the chained hashes of the prompt's fixed-size prefix blocks (equal prefixes
    share their leading hashes), as a non-empty list of signed 64-bit ints; null when the source
    does not have them.
    `priority` runs from 1 (background) to 10 (interactive, SLA-bound); sources without one get 5.
    """

    timestamp: Series[pd.DatetimeTZDtype] = pa.Field(
        dtype_kwargs=UTC_KW, ge=TIMESTAMP_MIN, lt=TIMESTAMP_MAX
    )
    tenant: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 64}
    )
    request_id: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_ID)
    session_id: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length=_ID)
    prompt: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, nullable=True)
    prompt_tokens: Series[int] = pa.Field(ge=0)
    output_tokens: Series[int] = pa.Field(ge=0)
    # An Arrow list column: the int64 element type is enforced by Arrow in C, not by a Python
    # loop per row (which cost more than parsing the rows). Rejected: an object column of lists.
    prefix_hashes: Series[pd.ArrowDtype] = pa.Field(nullable=True, dtype_kwargs=INT64_LIST_KW)
    template_id: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, nullable=True, str_length=_ID
    )
    route: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, nullable=True, str_length=_ID)
    latency_ms: Series[float] = pa.Field(nullable=True, ge=0)
    priority: Series[int] = pa.Field(ge=1, le=10)

    @pa.check("prefix_hashes", name="prefix_hashes_not_empty")
    def _prefix_hashes(cls, hashes: Series) -> Series[bool]:
        # An empty prompt has no blocks: that is null, not [], so "has blocks" stays one test.
        # A numpy bool result (not Arrow's) is what lets pandera name the failing rows.
        lengths = hashes.list.len().fillna(1).to_numpy(dtype="int64")
        return pd.Series(lengths > 0, index=hashes.index)

    @pa.dataframe_check(name="request_id_unique_per_tenant")
    def _unique_ids(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "request_id"], keep="first")

    class Config:
        coerce = True
        strict = True
        ordered = True


REQUEST_LOG_COLUMNS: tuple[str, ...] = tuple(RequestLog.to_schema().columns)
