"""The per-request features the drift check compares: one `DriftFeatures` row per request.

Kept apart from the windows and the decision (`models.drift`) because the rate bucket is what
both the features and the windows' bounds are cut by (`RATE_BUCKET_S`).
"""

from __future__ import annotations

import pandas as pd
from pandera.typing import DataFrame

from data_contracts.drift import DriftFeatures

RATE_BUCKET_S = 10  # 10 s: 360 buckets an hour (1 min buckets gave 60: twice the noise)
REQUEST_COLUMNS = ("timestamp", "tenant", "prompt_tokens", "output_tokens", "template_id")


def request_features(requests: pd.DataFrame) -> DataFrame[DriftFeatures]:
    """One `DriftFeatures` row per request of `requests` (RequestLog columns; extra ones ignored).

    The rate is attached to each request as the rate of the 10 s bucket it arrived in, so one
    table (and one Evidently report) carries all three quantities. Weighting buckets by their
    requests biases the rate's distribution towards busy buckets, identically in both windows,
    so a comparison stays fair. Rejected: one row per time bucket, which would reduce token
    lengths to per-bucket means and the template mix to nothing comparable; and a second
    report for the rate, which would leave two dataset-drift decisions to reconcile.
    """
    missing = [c for c in REQUEST_COLUMNS if c not in requests.columns]
    if missing:
        raise ValueError(f"request_features needs {list(REQUEST_COLUMNS)}; missing: {missing}")
    requests = requests.sort_values("timestamp", kind="stable")
    buckets = requests["timestamp"].dt.floor(f"{RATE_BUCKET_S}s")
    rate = requests.groupby(buckets)["timestamp"].transform("size") / RATE_BUCKET_S
    template = requests["tenant"].astype("string") + "/"
    template += requests["template_id"].astype("string").fillna("-")
    features = pd.DataFrame(
        {
            "timestamp": requests["timestamp"],
            "rate_rps": rate.astype(float),
            "prompt_tokens": requests["prompt_tokens"],
            "output_tokens": requests["output_tokens"],
            "template": template.astype(object),
        }
    ).reset_index(drop=True)
    return DriftFeatures.validate(features, lazy=True)
