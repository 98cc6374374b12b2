"""ingest/traces/table.py: the import's columnar table and its group-by, against pandas' figures
on seeded random groupings (ties included): group numbers, counts, medians, linear p90, minimums
and maximums equal; sums equal to within their last bits (pandas adds with Kahan compensation)."""

import numpy as np
import pandas as pd
import pytest

from ingest.traces.table import Groups, Table, number_groups


@pytest.mark.parametrize("seed", range(40))
def test_group_figures_are_pandas_groupby_s(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 2000))
    a, b = rng.integers(0, int(rng.integers(1, 50)), n), rng.integers(0, 4, n)
    values = [rng.random(n) * 100, np.round(rng.random(n) * 10, 1), rng.exponential(5, n)][seed % 3]
    group, n_groups = number_groups(a, b)
    by = pd.DataFrame({"a": a, "b": b, "v": values}).groupby(["a", "b"], sort=False)
    assert np.array_equal(group, by.ngroup().to_numpy()) and n_groups == by.ngroups
    groups, v = Groups(group, n_groups), by["v"]
    assert np.array_equal(groups.counts, v.count().to_numpy())
    for mine, theirs in ((groups.median(values), v.median()), (groups.quantile(values, 0.9), v.quantile(0.9)),
                         (groups.min(values), v.min()), (groups.max(values), v.max())):
        assert np.array_equal(mine, theirs.to_numpy())
    np.testing.assert_allclose(groups.sum(values), v.sum().to_numpy(), rtol=1e-13)


def test_a_table_selects_rows_adds_columns_and_stacks():
    t = Table({"name": np.array(["a", "b", "c"], dtype=object), "ms": np.array([1.0, np.nan, 3.0])})
    assert len(t) == 3 and t.columns == ["name", "ms"] and "ms" in t
    picked = t[t["ms"] > 1]
    assert picked.to_dicts() == [{"name": "c", "ms": 3.0}]
    both = Table.concat([t.with_columns(rank=0), t.with_columns(rank=1)])
    assert list(both["rank"]) == [0, 0, 0, 1, 1, 1] and both["name"].dtype == object
    assert both.to_pandas().groupby("rank")["ms"].sum().tolist() == [4.0, 4.0]
    with pytest.raises(ValueError, match="different lengths"):
        Table({"x": [1, 2], "y": [1]})
