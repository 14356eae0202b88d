"""`QuarantineRow`: an input row that failed validation, kept with the reason."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import STRING_KW, UTC_KW


class QuarantineRow(pa.DataFrameModel):
    """A rejected row. Nothing is dropped silently: every row read is accepted or lands here.

    `row_number` is the 1-based line of the source file (the header is line 1 for CSV), or the
    stream entry's sequence for live ingestion. `raw` is the row as read, capped at
    `RAW_LIMIT_BYTES`; `raw_bytes` is its full length so a truncation is visible.
    """

    source: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length={"min_value": 1})
    row_number: Series[int] = pa.Field(ge=0)
    raw: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW)
    raw_bytes: Series[int] = pa.Field(ge=0)
    reason: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, str_length={"min_value": 1})
    quarantined_at: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs=UTC_KW)

    class Config:
        coerce = True
        strict = True
        ordered = True


RAW_LIMIT_BYTES = 64 * 1024
