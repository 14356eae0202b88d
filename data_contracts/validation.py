"""Row-level validation: split a frame into the rows a contract accepts and the rows it rejects.

pandera validates whole frames; ingestion needs to know *which* rows failed and *why*, so that
good rows land and bad rows are quarantined with a reason. Rejected alternative: validating row
by row, which is two orders of magnitude slower than one lazy, vectorised pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors


@dataclass(frozen=True, slots=True)
class RowFailure:
    """Why one row (by its index label in the frame given to `failures_by_row`) was rejected."""

    index: object
    reason: str


def validate(model: type[pa.DataFrameModel], frame: pd.DataFrame) -> pd.DataFrame:
    """Validate a whole frame; raise `SchemaErrors` listing every failure (column, check, row)."""
    return model.validate(frame, lazy=True)


def _describe(case: pd.Series) -> str:
    """One phrase per failure: the column, the check and the offending value."""
    check = str(case["check"])
    if case["schema_context"] == "DataFrameSchema":
        return f"row failed {check}"  # a frame-wide check: every column is reported, name it once
    if check.startswith("dtype("):
        check = f"coerce_{check}"  # pandera reports a failed coercion as coerce_dtype and dtype
    failure = case["failure_case"]
    shown = repr(failure[:80] if isinstance(failure, str) else failure)
    return f"{case['column']}: failed {check} (value {shown})"


def failures_by_row(
    model: type[pa.DataFrameModel], frame: pd.DataFrame, max_rounds: int = 3
) -> tuple[pd.DataFrame, list[RowFailure]]:
    """Return (validated good rows, one failure per bad row).

    Several rounds are needed because a coercion failure stops pandera from running the value
    checks of that column: after dropping the rows that failed to coerce, the rest are checked
    again. A failure that names no row (a missing or extra column) is a bug in the caller, not
    bad input, so it is raised.
    """
    failures: dict[object, list[str]] = {}
    remaining = frame
    for _ in range(max_rounds):
        try:
            good = model.validate(remaining, lazy=True)
            break
        except SchemaErrors as err:
            cases = err.failure_cases
            unlocated = cases[cases["index"].isna()]
            # pandera reports a coercion failure twice: once per row (located) and once for the
            # column dtype (unlocated); only the unlocated ones with no located twin are fatal.
            located_columns = set(cases.loc[cases["index"].notna(), "column"])
            fatal = unlocated[~unlocated["column"].isin(located_columns)]
            if not fatal.empty:
                raise
            located = cases[cases["index"].notna()]
            for _, case in located.iterrows():
                failures.setdefault(case["index"], []).append(_describe(case))
            remaining = remaining.drop(index=list(set(located["index"])), errors="ignore")
    else:
        good = model.validate(remaining, lazy=True)
    rows = [RowFailure(index=i, reason="; ".join(dict.fromkeys(r))) for i, r in failures.items()]
    return good, rows
