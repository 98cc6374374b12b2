"""Which kernels explain a step-time change between two runs (the last good and the first bad).

Input: the two runs' per-kernel tables as stepwatch stores them (one row per kernel, keyed by
name + launcher + source) and their step times. Output: a diff table sorted by |delta ms per
step|, each row's share of the step-time change, and the same by category. Pure: the input
frames are not modified.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from . import RegressError

if TYPE_CHECKING:
    import pandas as pd

KEY_COLUMNS = ("name", "launcher", "source")
NEEDED_COLUMNS = ("name", "category", "launcher", "source", "calls_per_step", "ms_per_step", "bytes_per_call")
# carried to the diff table with _before / _after suffixes when the input has them
CARRIED_COLUMNS = ("calls_per_step", "ms_per_step", "share", "bytes_per_call", "gbps", "peak_fraction")

KERNEL_COLUMNS = [
    "name", "launcher", "source", "category", "status",
    "calls_per_step_before", "calls_per_step_after", "delta_calls_per_step",
    "ms_per_step_before", "ms_per_step_after", "delta_ms_per_step", "fraction_of_change",
    "share_before", "share_after", "bytes_per_call_before", "bytes_per_call_after",
    "gbps_before", "gbps_after", "peak_fraction_before", "peak_fraction_after",
]
CATEGORY_COLUMNS = ["category", "status", "calls_per_step_before", "calls_per_step_after", "delta_calls_per_step",
                    "ms_per_step_before", "ms_per_step_after", "delta_ms_per_step", "fraction_of_change"]


@dataclass(frozen=True, eq=False)
class Explanation:
    """The kernel-by-kernel diff of two runs.

    `kernels` (columns KERNEL_COLUMNS) and `categories` (CATEGORY_COLUMNS) are sorted by
    |delta_ms_per_step|, largest first. `status` is "added" (absent before), "removed" (absent
    after) or "changed" (in both; possibly by very little). `fraction_of_change` is the row's
    delta ms per step over the step-time change (NaN when the step time did not change). The
    kernels' deltas need not add up to the step-time change: `unexplained_ms` is what they
    leave (CPU-side time, idle gaps, overlap)."""

    step_ms_before: float
    step_ms_after: float
    kernels: pd.DataFrame
    categories: pd.DataFrame

    @property
    def delta_step_ms(self) -> float:
        return self.step_ms_after - self.step_ms_before

    @property
    def kernel_delta_ms(self) -> float:
        return float(self.kernels["delta_ms_per_step"].sum())

    @property
    def unexplained_ms(self) -> float:
        return self.delta_step_ms - self.kernel_delta_ms


def _as_frame(table: Any) -> Any:
    """A kernel table as a DataFrame: an import's columnar table (ingest/traces/table.py) converted."""
    to_pandas = getattr(table, "to_pandas", None)
    return to_pandas() if callable(to_pandas) and not hasattr(table, "iloc") else table


def _check_table(frame: pd.DataFrame, side: str, key: tuple[str, ...]) -> None:
    import pandas as pd

    if not isinstance(frame, pd.DataFrame):
        raise RegressError(f"{side} kernels: expected a DataFrame, got {type(frame).__name__}")
    missing = [c for c in (*NEEDED_COLUMNS, *key) if c not in frame.columns]
    if missing:
        raise RegressError(f"{side} kernels: missing column(s) {', '.join(dict.fromkeys(missing))}")
    if "rank" in frame.columns and frame["rank"].nunique() > 1:
        raise RegressError(f"{side} kernels: rows of {frame['rank'].nunique()} ranks; pass one rank's rows")


def _collapse(frame: pd.DataFrame, key: tuple[str, ...]) -> pd.DataFrame:
    """One row per key: sums of calls and ms per step; bytes per call and GB/s over all calls
    (NaN unless every row has bytes); a category, or "mixed"."""
    f = frame.copy()
    for col in CARRIED_COLUMNS:
        if col not in f.columns:
            f[col] = np.nan
    for col in key:
        f[col] = f[col].fillna("").astype(str)
    f["_bytes_per_step"] = f["bytes_per_call"] * f["calls_per_step"]
    grouped = f.groupby(list(key), sort=False, dropna=False)
    out = grouped.agg(
        category=("category", lambda s: s.iloc[0] if s.nunique(dropna=False) == 1 else "mixed"),
        calls_per_step=("calls_per_step", "sum"), ms_per_step=("ms_per_step", "sum"),
        share=("share", lambda s: s.sum(min_count=1)),
        bytes_per_step=("_bytes_per_step", lambda s: s.sum() if s.notna().all() else np.nan),
        gbps=("gbps", "first"), peak_fraction=("peak_fraction", "first"), rows=("ms_per_step", "size"),
    ).reset_index()
    out["bytes_per_call"] = out["bytes_per_step"] / out["calls_per_step"].where(out["calls_per_step"] > 0)
    merged = out["rows"] > 1
    if merged.any():  # GB/s and peak fraction of merged rows: all their bytes over all their time
        ratio = out["bytes_per_step"] / (out["ms_per_step"] * 1e6)
        first_fraction = out["peak_fraction"] / out["gbps"]
        out.loc[merged, "gbps"] = ratio[merged]
        out.loc[merged, "peak_fraction"] = (ratio * first_fraction)[merged]
    return out.drop(columns=["bytes_per_step", "rows"])


def _fractions(delta: pd.Series, delta_step_ms: float) -> pd.Series:
    import pandas as pd

    if not math.isfinite(delta_step_ms) or delta_step_ms == 0:
        return pd.Series(np.nan, index=delta.index)
    return delta / delta_step_ms


def _sort_by_size(frame: pd.DataFrame) -> pd.DataFrame:
    order = frame["delta_ms_per_step"].abs().sort_values(ascending=False, kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def explain_change(before: pd.DataFrame, after: pd.DataFrame, step_ms_before: float, step_ms_after: float,
                   key: tuple[str, ...] = KEY_COLUMNS) -> Explanation:
    """Diff two runs' kernel tables (last good, first bad) against their step times in ms.

    `key` says which columns identify a kernel across the runs; ("name",) matches a kernel
    whatever launched it (say, an eager run against a CUDA-graph run)."""
    key = tuple(key)
    before, after = _as_frame(before), _as_frame(after)
    for side, frame in (("before", before), ("after", after)):
        _check_table(frame, side, key)
    for side, value in (("step_ms_before", step_ms_before), ("step_ms_after", step_ms_after)):
        if not (isinstance(value, numbers.Real) and math.isfinite(value) and value > 0):
            raise RegressError(f"{side} {value!r}: must be a positive number of milliseconds")
    b, a = _collapse(before, key), _collapse(after, key)
    diff = b.merge(a, on=list(key), how="outer", suffixes=("_before", "_after"), indicator=True)
    diff["status"] = diff["_merge"].map({"left_only": "removed", "right_only": "added", "both": "changed"}).astype(str)
    diff["category"] = diff["category_after"].where(diff["category_after"].notna(), diff["category_before"])
    for col in ("calls_per_step", "ms_per_step"):
        diff[f"{col}_before"] = diff[f"{col}_before"].fillna(0.0)
        diff[f"{col}_after"] = diff[f"{col}_after"].fillna(0.0)
    diff["delta_calls_per_step"] = diff["calls_per_step_after"] - diff["calls_per_step_before"]
    diff["delta_ms_per_step"] = diff["ms_per_step_after"] - diff["ms_per_step_before"]
    delta_step = float(step_ms_after) - float(step_ms_before)
    diff["fraction_of_change"] = _fractions(diff["delta_ms_per_step"], delta_step)
    for col in ("name", "launcher", "source"):
        if col not in diff.columns:
            diff[col] = ""
    kernels = _sort_by_size(diff[KERNEL_COLUMNS])

    cats = (diff.groupby("category", dropna=False)
            .agg(calls_per_step_before=("calls_per_step_before", "sum"),
                 calls_per_step_after=("calls_per_step_after", "sum"),
                 ms_per_step_before=("ms_per_step_before", "sum"), ms_per_step_after=("ms_per_step_after", "sum"))
            .reset_index())
    cats["status"] = np.select([cats["calls_per_step_before"] == 0, cats["calls_per_step_after"] == 0],
                               ["added", "removed"], "changed")
    cats["delta_calls_per_step"] = cats["calls_per_step_after"] - cats["calls_per_step_before"]
    cats["delta_ms_per_step"] = cats["ms_per_step_after"] - cats["ms_per_step_before"]
    cats["fraction_of_change"] = _fractions(cats["delta_ms_per_step"], delta_step)
    categories = _sort_by_size(cats[CATEGORY_COLUMNS])
    return Explanation(float(step_ms_before), float(step_ms_after), kernels, categories)
