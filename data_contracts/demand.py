"""`DemandSeries`: how many requests a key received per time bucket."""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import STRING_KW, UTC_KW

# Bucket widths in seconds. The three feature scales (5 s bursts, 3 min sessions, 1 h tides) come
# from the features flow; 10 min is what the ServeGen rate trace ships with.
GRANULARITIES: dict[str, int] = {"5s": 5, "3min": 180, "10min": 600, "1h": 3600}
TOTAL_KEY = "__total__"  # the key of all of a tenant's traffic


def check_granularity(granularity: str) -> None:
    """`ValueError` naming the choices when `granularity` is not one the lake builds."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity {granularity!r}: choose one of {', '.join(GRANULARITIES)}")


class DemandSeries(pa.DataFrameModel):
    """Sparse demand: a bucket that is absent had zero requests for that key.

    `key` is namespaced by kind (`template:…`, `prefix:…`, `route:…`, or `__total__` for all of a
    tenant's traffic) so keys of different kinds never collide. `count` is a float because rate
    traces (ServeGen) give expected counts, not integers.
    """

    tenant: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 64}
    )
    key: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 300}
    )
    granularity: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW, isin=list(GRANULARITIES))
    bucket_start: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs=UTC_KW)
    count: Series[float] = pa.Field(ge=0)

    @pa.dataframe_check(name="bucket_start_aligned_to_granularity")
    def _aligned(cls, df: pd.DataFrame) -> Series[bool]:
        seconds = df["bucket_start"].astype("int64") // 1_000_000_000
        # An unknown granularity is the `isin` check's failure; do not report it twice.
        width = df["granularity"].map(GRANULARITIES).fillna(1).astype("int64")
        return (seconds % width) == 0

    @pa.dataframe_check(name="one_row_per_bucket")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "key", "granularity", "bucket_start"])

    class Config:
        coerce = True
        strict = True
        ordered = True
