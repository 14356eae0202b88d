"""Column dtypes shared by the contracts.

Text and list columns are Arrow-backed (`pd.ArrowDtype`): checks on them run in Arrow's C kernels
and they go to Parquet without conversion. Measured on 200k rows: validating object-dtype string
columns took 0.62 s (pandera coerces to `str` element by element), Arrow strings 0.04 s.
"""

from __future__ import annotations

import pandas as pd
import pyarrow

STRING_KW = {"pyarrow_dtype": pyarrow.string()}
INT64_LIST_KW = {"pyarrow_dtype": pyarrow.list_(pyarrow.int64())}
UTC_KW = {"unit": "ns", "tz": "UTC"}

STRING = pd.ArrowDtype(pyarrow.string())
INT64_LIST = pd.ArrowDtype(pyarrow.list_(pyarrow.int64()))
