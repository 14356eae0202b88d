"""`TemplateTable`: the mined prompt templates of each tenant, and its Parquet file.

Written by the `mine-templates` flow, read by the next mining (to keep ids stable), by feature
building (demand per template) and by `assign` on the ingest path (the constant text with its
`<*>` slots is all the matcher needs). Like the demand features it is derived and replaced whole,
one file for all tenants, atomically (write, fsync, rename); rejected alternative: a lake table
(append-only and deduplicated by row key, while a re-mining must replace a tenant's templates,
drop the ones that vanished, and update volumes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pandera.pandas as pa
import pyarrow
import pyarrow.parquet as pq
from pandera.typing import Series

from data_contracts.derived import write_parquet_atomically
from data_contracts.dtypes import STRING_KW, UTC_KW

TEMPLATES_FILE = "templates.parquet"

ARROW_SCHEMA = pyarrow.schema(
    [
        ("template_id", pyarrow.string()),
        ("tenant", pyarrow.string()),
        ("constant_text", pyarrow.string()),
        ("slots", pyarrow.int64()),
        ("volume", pyarrow.int64()),
        ("representative", pyarrow.string()),
        ("mined_at", pyarrow.timestamp("ns", tz="UTC")),
    ]
)


class TemplateTable(pa.DataFrameModel):
    """One mined template of one tenant.

    `constant_text` is the template as users wrote it with each slot as `<*>`; `slots` counts
    them. `volume` is requests assigned in the mined window; `representative` is one of them.
    """

    template_id: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 64}
    )
    tenant: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1, "max_value": 64}
    )
    constant_text: Series[pd.ArrowDtype] = pa.Field(
        dtype_kwargs=STRING_KW, str_length={"min_value": 1}
    )
    slots: Series[int] = pa.Field(ge=0)
    volume: Series[int] = pa.Field(ge=1)
    representative: Series[pd.ArrowDtype] = pa.Field(dtype_kwargs=STRING_KW)
    mined_at: Series[pd.DatetimeTZDtype] = pa.Field(dtype_kwargs=UTC_KW)

    @pa.dataframe_check(name="slots_match_constant_text")
    def _slots(cls, df: pd.DataFrame) -> Series[bool]:
        return df["constant_text"].str.count(r"<\*>").astype("int64") == df["slots"]

    @pa.dataframe_check(name="one_row_per_tenant_template")
    def _unique(cls, df: pd.DataFrame) -> Series[bool]:
        return ~df.duplicated(subset=["tenant", "template_id"])

    class Config:
        coerce = True
        strict = True
        ordered = True


def template_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """Rows (dicts with the contract's columns) as a validated `TemplateTable` frame."""
    frame = pd.DataFrame(list(rows), columns=ARROW_SCHEMA.names)
    if frame.empty:
        return empty_templates()
    return TemplateTable.validate(frame, lazy=True)


def empty_templates() -> pd.DataFrame:
    table = ARROW_SCHEMA.empty_table()
    return TemplateTable.validate(table.to_pandas(types_mapper=_arrow_types))


def _arrow_types(arrow_type: pyarrow.DataType) -> pd.ArrowDtype | None:
    return pd.ArrowDtype(arrow_type) if pyarrow.types.is_string(arrow_type) else None


def templates_path(features_dir: Path) -> Path:
    return Path(features_dir) / TEMPLATES_FILE


def write_templates(features_dir: Path, frame: pd.DataFrame) -> Path:
    """Validate `frame` against `TemplateTable` and atomically replace the templates file."""
    frame = TemplateTable.validate(frame, lazy=True)
    return write_parquet_atomically(templates_path(features_dir), frame, ARROW_SCHEMA)


def read_templates(features_dir: Path) -> pd.DataFrame:
    """All tenants' templates, validated; an empty frame if none were mined yet."""
    path = templates_path(features_dir)
    if not path.is_file():
        return empty_templates()
    table = pq.read_table(path, schema=ARROW_SCHEMA)
    return TemplateTable.validate(table.to_pandas(types_mapper=_arrow_types), lazy=True)
