"""Row-level validation: split a frame into the rows a contract accepts and the rows it rejects.

pandera validates whole frames; ingestion needs to know *which* rows failed and *why*, so that
good rows land and bad rows are quarantined with a reason. Rejected alternative: validating row
by row, which is two orders of magnitude slower than one lazy, vectorised pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pandas as pd
import pandera.pandas as pa
from pandera.errors import SchemaErrors


@dataclass(frozen=True, slots=True)
class RowFailure:
    """Why one row (by its index label in the frame given to `failures_by_row`) was rejected."""

    index: object
    reason: str


UNIQUENESS_CHECKS = frozenset({"request_id_unique_per_tenant", "one_row_per_bucket"})


def row_schema(model: type[pa.DataFrameModel]) -> pa.DataFrameSchema:
    """The contract without its uniqueness checks: what each row must satisfy on its own.

    Ingestion validates rows with this first and removes repeated keys among the *valid* rows
    afterwards — the other order would let an invalid first copy of a row hide a valid second
    copy, which would then be counted as a duplicate of nothing and lost.
    """
    schema = copy.deepcopy(model.to_schema())
    schema.checks = [c for c in schema.checks if c.name not in UNIQUENESS_CHECKS]
    return schema


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


Validator = type[pa.DataFrameModel] | pa.DataFrameSchema


def failures_by_row(
    model: Validator, frame: pd.DataFrame, max_rounds: int = 3
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
                if (fatal["schema_context"] != "Column").any() or len(remaining) == 0:
                    raise  # the frame's shape is wrong (missing or extra column): a caller bug
                # A column check that could not say which rows failed: split until it can.
                return _bisect(model, remaining, failures)
            located = cases[cases["index"].notna()]
            for _, case in located.iterrows():
                failures.setdefault(case["index"], []).append(_describe(case))
            remaining = remaining.drop(index=list(set(located["index"])), errors="ignore")
    else:
        good = model.validate(remaining, lazy=True)
    return good, _as_failures(failures)


def _as_failures(failures: dict[object, list[str]]) -> list[RowFailure]:
    return [RowFailure(index=i, reason="; ".join(dict.fromkeys(r))) for i, r in failures.items()]


def _bisect(
    model: Validator, frame: pd.DataFrame, failures: dict[object, list[str]]
) -> tuple[pd.DataFrame, list[RowFailure]]:
    """Validate halves separately; a single row that still fails unlocated gets the message."""
    if len(frame) == 1:
        try:
            good = model.validate(frame, lazy=True)
        except SchemaErrors as err:
            checks = ", ".join(sorted(set(err.failure_cases["check"].astype(str))))
            failures.setdefault(frame.index[0], []).append(f"row failed {checks}")
            good = frame.iloc[0:0]
        return good, _as_failures(failures)
    middle = len(frame) // 2
    goods = []
    for half in (frame.iloc[:middle], frame.iloc[middle:]):
        good, half_failures = failures_by_row(model, half)
        goods.append(good)
        for failure in half_failures:
            failures.setdefault(failure.index, []).append(failure.reason)
    return pd.concat(goods), _as_failures(failures)
