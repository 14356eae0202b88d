"""`DriftFeatures`: one request of a window, as the drift check compares windows.

The drift check (`models.drift`) builds this table from the lake's requests and compares a
reference window with the current one column by column. One row per request, because two of the
three monitored quantities are per request (token lengths, template); the third, the arrival
rate, is a property of a time bucket and is attached to each request as the rate of the bucket it
arrived in (see `models.drift.request_features` for why).
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.typing import Series

from data_contracts.dtypes import UTC_KW

# The columns compared between windows, in the order the report shows them; `timestamp` only
# places a row in a window.
DRIFT_COLUMNS: tuple[str, ...] = ("rate_rps", "prompt_tokens", "output_tokens", "template")
NUMERICAL_DRIFT_COLUMNS: tuple[str, ...] = ("rate_rps", "prompt_tokens", "output_tokens")
CATEGORICAL_DRIFT_COLUMNS: tuple[str, ...] = ("template",)


class DriftFeatures(pa.DataFrameModel):
    """One request: when, the arrival rate around it, its token lengths and its template.

    `rate_rps` is requests per second over the request's rate bucket, counting the request
    itself, so it is never zero. `template` is `<tenant>/<template_id>` (template ids are
    per tenant) or `<tenant>/-` for a request without one: a plain Python string, because
    Evidently's categorical tests take object columns (Arrow strings are not what it expects).
    """

    timestamp: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs=UTC_KW)
    rate_rps: Series[float] = pa.Field(gt=0)
    prompt_tokens: Series[int] = pa.Field(ge=0)
    output_tokens: Series[int] = pa.Field(ge=0)
    template: Series[str] = pa.Field(str_length={"min_value": 3, "max_value": 330})

    class Config:
        coerce = True
        strict = True
        ordered = True
