"""`KeyForecast`: the forecaster's per-key predictions, as the warm-up planner reads them."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.demand import GRANULARITIES
from data_contracts.dtypes import STRING_KW, UTC_KW


class KeyForecast(pa.DataFrameModel):
    """Predicted requests of one key in one future bucket.

    `step` 1 is the bucket right after the last observed one; `bucket_start` is that bucket's
    start, so a plan can line predictions up with its deadline. `key` `__other__` is the tenant's
    demand outside the forecast's top keys (so per-key rows sum to the tenant's total).
    """

    tenant: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 64}
    )
    key: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 300}
    )
    granularity: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(GRANULARITIES))
    step: Series[int] = pa.Field(ge=1)
    bucket_start: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs=UTC_KW)
    predicted: Series[float] = pa.Field(ge=0)

    @pa.dataframe_check(name="one_row_per_key_and_step")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "key", "step"])

    class Config:
        coerce = True
        strict = True
        ordered = True
