"""A small columnar table: named NumPy columns of one length, in order. What the analysis hands on
(a rank's kernel statistics, steps and step categories; a run's rows of every rank) without
pandas, whose import alone took ~0.3-0.45 s of every `ingest import` (ingest/BENCHMARKS.md).

It does what the import needs and no more: a column by name (`table["ms_per_step"]`, a NumPy
array), rows by a boolean mask or positions (`table[table["category"] == "cast"]`, a new table),
columns added or replaced (`with_columns`), tables stacked (`Table.concat`), the rows as dicts
(`to_dicts`, as polars names it: pandas' `to_records` means a NumPy record array) and, for a
caller that wants a frame (a test, a study), `to_pandas`, which imports pandas then.
Text columns are object arrays of str (None where a value is missing); tables are not changed
in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def _array(values: Any) -> np.ndarray:
    """A column: text as an object array of str (NumPy's fixed-width str would truncate a longer value set later)."""
    a = np.asarray(values)
    return a.astype(object) if a.dtype.kind == "U" else a


class Table:
    """Named columns (NumPy arrays) of one length, in order."""

    __slots__ = ("_columns", "_rows")

    def __init__(self, columns: Mapping[str, Any]):
        arrays = {str(name): _array(values) for name, values in columns.items()}
        lengths = {name: len(a) for name, a in arrays.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")
        self._columns = arrays
        self._rows = next(iter(lengths.values()), 0)

    @property
    def columns(self) -> list[str]:
        return list(self._columns)

    def __len__(self) -> int:
        return self._rows

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __getitem__(self, key):
        """A column by name; or, for a boolean mask or an array of positions, a table of those rows."""
        if isinstance(key, str):
            return self._columns[key]
        return Table({name: a[key] for name, a in self._columns.items()})

    def __repr__(self) -> str:
        return f"Table({self._rows} rows: {', '.join(self._columns)})"

    def with_columns(self, **columns: Any) -> Table:
        """This table with columns added (at the end) or replaced (in place); a scalar fills the column."""
        out = dict(self._columns)
        for name, values in columns.items():
            out[name] = np.full(self._rows, values, dtype=object if isinstance(values, str) or values is None
                                else None) if np.ndim(values) == 0 else values
        return Table(out)

    def drop(self, *names: str) -> Table:
        return Table({name: a for name, a in self._columns.items() if name not in names})

    @staticmethod
    def concat(tables: Iterable[Table]) -> Table:
        """The tables' rows one after another; they must have the same columns in the same order."""
        tables = list(tables)
        if not tables:
            return Table({})
        names = tables[0].columns
        for t in tables[1:]:
            if t.columns != names:
                raise ValueError(f"tables with different columns: {names} and {t.columns}")
        return Table({name: np.concatenate([t[name] for t in tables]) for name in names})

    def to_dicts(self) -> list[dict[str, Any]]:
        """One dict per row, values as Python scalars (float NaN stays NaN, None stays None)."""
        names = list(self._columns)
        values = [a.tolist() for a in self._columns.values()]
        return [dict(zip(names, row)) for row in zip(*values)]

    def to_pandas(self):
        """The table as a pandas DataFrame (imports pandas: for tests, studies and pages, not the import)."""
        import pandas as pd

        return pd.DataFrame({name: a for name, a in self._columns.items()})


def number_groups(*codes: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's group (rows alike in every one of `codes`, non-negative integer arrays of one
    length), numbered in the order groups first appear (as pandas' groupby(sort=False) numbers
    them), and the number of groups."""
    n = len(codes[0]) if codes else 0
    key, radix = np.zeros(n, np.int64), 1
    for code in codes:
        size = int(code.max()) + 1 if n else 1
        if radix * size >= 1 << 62:  # the combined key would overflow: renumber what is combined so far
            _, key = np.unique(key, return_inverse=True)
            key, radix = key.reshape(-1).astype(np.int64), int(key.max()) + 1
        key, radix = key * size + code.astype(np.int64), radix * size
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inverse.reshape(-1)], len(first)


class Groups:
    """Rows in groups 0..n_groups-1 (`group`: each row's) and per-group figures computed as pandas'
    groupby computes them: counts, sums, means, medians, linear quantiles, minimums, maximums.
    Sums add in row order (np.bincount); pandas adds with a compensated (Kahan) sum, so a sum
    or mean may differ from pandas' in its last bits. Medians, quantiles, minimums and maximums
    are exact: the values of each group are sorted, and the figure read from them."""

    def __init__(self, group: np.ndarray, n_groups: int):
        self.group = np.asarray(group, np.int64)
        self.n_groups = n_groups
        self.counts = np.bincount(self.group, minlength=n_groups)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)
        self._last_sorted: tuple[np.ndarray, np.ndarray] | None = None  # (values, sorted within groups)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Per group, the sum of its values (0 for an empty group; NaN where a value is NaN)."""
        return np.bincount(self.group, weights=np.asarray(values, float), minlength=self.n_groups)

    def count_known(self, values: np.ndarray) -> np.ndarray:
        """Per group, how many of its values are not NaN."""
        return np.bincount(self.group[~np.isnan(values)], minlength=self.n_groups)

    def any(self, mask: np.ndarray) -> np.ndarray:
        return np.bincount(self.group[np.asarray(mask, bool)], minlength=self.n_groups) > 0

    def _sorted(self, values: np.ndarray) -> np.ndarray:
        """The values sorted within each group, groups one after another (NaN last in its group).
        The last array sorted is kept: an import asks for the median, minimum, maximum and p90
        of the same durations (one sort instead of four: ~0.06 s of a 537 MB trace's analysis); an
        array must not be changed in place between two calls."""
        if self._last_sorted is not None and self._last_sorted[0] is values:
            return self._last_sorted[1]
        array = np.asarray(values, float)
        ordered = array[np.lexsort((array, self.group))]
        self._last_sorted = (values, ordered)
        return ordered

    def _at(self, ordered: np.ndarray, index: np.ndarray) -> np.ndarray:
        """ordered[index] where the group is not empty, NaN where it is."""
        out = np.full(self.n_groups, np.nan)
        some = self.counts > 0
        out[some] = ordered[index[some]]
        return out

    def min(self, values: np.ndarray) -> np.ndarray:
        return self._at(self._sorted(values), self.starts)

    def max(self, values: np.ndarray) -> np.ndarray:
        return self._at(self._sorted(values), self.starts + self.counts - 1)

    def median(self, values: np.ndarray) -> np.ndarray:
        """Per group, the median of its values: the middle one, or the mean of the middle two.
        Meant for groups without NaN (a group with one gives a meaningless figure: mask it)."""
        ordered = self._sorted(values)
        low = self._at(ordered, self.starts + (self.counts - 1) // 2)
        high = self._at(ordered, self.starts + self.counts // 2)
        return np.where(self.counts % 2 == 1, low, (low + high) / 2)

    def quantile(self, values: np.ndarray, q: float) -> np.ndarray:
        """Per group, the q-quantile of its values by linear interpolation, computed as pandas'
        group_quantile does (value at floor(q (n - 1)) plus the fraction of the step to the next).
        For groups without NaN."""
        ordered = self._sorted(values)
        position = q * (np.maximum(self.counts, 1) - 1)
        below = np.floor(position).astype(np.int64)
        frac = position % 1
        low = self._at(ordered, self.starts + below)
        high = self._at(ordered, self.starts + np.minimum(below + 1, np.maximum(self.counts - 1, 0)))
        with np.errstate(invalid="ignore"):
            return np.where(frac == 0.0, low, low + (high - low) * frac)
