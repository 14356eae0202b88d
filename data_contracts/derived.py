"""Derived tables (features): recomputed from the lake and replaced whole, never appended.

Each table is one Parquet file per granularity, replaced atomically (write to a temporary file,
fsync, rename), so a reader sees the old version or the new one, never half of each.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from data_contracts.demand import GRANULARITIES, DemandSeries
from data_contracts.lake import ARROW_SCHEMAS, arrow_types
from data_contracts.version import CONTRACT_VERSION


def demand_path(features_dir: Path, granularity: str) -> Path:
    if granularity not in GRANULARITIES:
        raise ValueError(f"unknown granularity {granularity!r}; choose from {list(GRANULARITIES)}")
    return Path(features_dir) / "demand" / f"granularity={granularity}.parquet"


def write_demand(features_dir: Path, granularity: str, frame: pd.DataFrame) -> Path:
    """Validate `frame` against `DemandSeries` and atomically replace that granularity's file."""
    frame = DemandSeries.validate(frame, lazy=True)
    if not (frame["granularity"] == granularity).all():
        raise ValueError(f"frame holds granularities other than {granularity!r}")
    return write_parquet_atomically(
        demand_path(features_dir, granularity), frame, ARROW_SCHEMAS["demand"]
    )


def write_parquet_atomically(path: Path, frame: pd.DataFrame, schema: pa.Schema) -> Path:
    """Write a validated frame, stamped with the contract version, so readers see the old file
    or the new one, never half of one: a temp file, fsync, then an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(frame, schema=schema, preserve_index=False)
    table = table.replace_schema_metadata({"preheat.contract": CONTRACT_VERSION})
    tmp = path.with_suffix(".parquet.tmp")
    with open(tmp, "wb") as sink:
        pq.write_table(table, sink, compression="zstd")
        sink.flush()
        os.fsync(sink.fileno())
    os.replace(tmp, path)
    return path


def read_demand(features_dir: Path, granularity: str) -> pd.DataFrame:
    """One granularity's demand series, validated; an empty frame if not built yet."""
    path = demand_path(features_dir, granularity)
    if not path.is_file():
        empty = ARROW_SCHEMAS["demand"].empty_table().to_pandas(types_mapper=arrow_types)
        return DemandSeries.validate(empty)
    table = pq.read_table(path, schema=ARROW_SCHEMAS["demand"])
    return DemandSeries.validate(table.to_pandas(types_mapper=arrow_types), lazy=True)


# A whole day without a single request: the lake holds separate periods, such as a trace ingested
# at its default epoch (`preheat ingest --epoch`), a test load or a long outage. The models work on
# a dense bucket grid, which would fill the silence with zeros: at 3 minutes a two-month gap is
# 30,000 empty buckets beside a few hundred real ones, and a window placed on the calendar span
# (the last quarter of it) would hold all the real traffic and leave the fit an hour of the old.
PERIOD_GAP = pd.Timedelta(days=1)


def latest_period(demand: pd.DataFrame, gap: pd.Timedelta = PERIOD_GAP) -> pd.DataFrame:
    """The rows from the first bucket after the last silence longer than `gap`; all of them when
    there is none. Nothing is deleted from the lake: the earlier periods stay there."""
    starts = demand["bucket_start"].drop_duplicates().sort_values()
    after_gap = starts[starts.diff() > gap]
    if after_gap.empty:
        return demand
    return demand[demand["bucket_start"] >= after_gap.iloc[-1]].reset_index(drop=True)


def require_demand(data_dir: Path, granularity: str) -> pd.DataFrame:
    """`read_demand` for a model that cannot train on nothing, cut to `latest_period`: a model
    learns from the lake's latest period only. `LookupError` saying what to run when the lake has
    no demand series of that granularity yet."""
    demand = read_demand(Path(data_dir) / "features", granularity)
    if demand.empty:
        raise LookupError(
            f"no {granularity} demand features under {data_dir}: "
            "run `preheat ingest` and `preheat features` first"
        )
    return latest_period(demand)
