"""The Run page (AppTest) shows what the import checked: a warning under the KPIs when a run's
figures disagree (ingest/regress/consistency.py), and the pattern catalog's findings under the
diagnosis, on the fixture database's real H200 sample runs."""

import pytest

from db.store import open_db
from tests.dashboard_fixture import find_run_id

pytestmark = pytest.mark.slow  # AppTest pages


def _top_level(at) -> list[str]:
    """The page's elements in order (a row of KPI tiles is one flex container)."""
    return [child.type for child in at.main.children.values()]


def _stored(db, run_id) -> dict:
    with open_db(db, read_only=True) as store:
        return store.get_run(run_id)


def test_a_run_the_profiler_slowed_has_a_warning_under_its_kpis_and_its_pattern(dashboard_db, open_page):
    run_id = find_run_id(dashboard_db, "3cf1671-glm5-fused-eager")
    run = _stored(dashboard_db, run_id)
    at = open_page(dashboard_db, "run", run=str(run_id))
    assert not at.exception
    marked = [c for c in run["consistency"]["checks"] if c["status"] == "marked"]
    assert [c["check"] for c in marked] == ["step_vs_measured"]
    (warning,) = at.warning
    assert warning.value.startswith("**These figures disagree.** The profiled step takes 47.2 ms (it implies 21.2 "
                                    "tok/s against 35.8), 1.69x the 27.9 ms step that the measured 35.8 tok/s at "
                                    "batch 1 implies, beyond the 25 % allowed: the profiler slowed the run")
    elements = _top_level(at)
    assert elements[elements.index("warning") - 1] == "flex_container"  # right under the KPI tiles

    assert [s.value for s in at.subheader][:2] == ["Diagnosis", "Patterns"]
    (launch_bound,) = run["patterns"]["findings"]
    patterns = at.markdown[1].value
    assert patterns.startswith(f"- **launch-bound** · {launch_bound['ms_per_step']:.3f} ms per step at stake: Steps "
                               "are launch-bound: the GPU works 6.66 ms of each 27.9 ms step (23.9 %)")
    assert any(c.value.startswith("Not evaluated: copy-beyond-live-data: 1 kernel meets its other conditions")
               for c in at.caption)


def test_a_whole_pool_cast_run_whose_figures_agree_shows_its_pattern_and_no_warning(dashboard_db, open_page):
    run_id = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    at = open_page(dashboard_db, "run", run=str(run_id))
    assert not at.exception
    assert not at.warning
    assert "Patterns" in [s.value for s in at.subheader]
    (line,) = at.markdown[1].value.splitlines()
    assert line.startswith("- **cast-per-layer** · 67.518 ms per step at stake: The cast kernel "
                           "`unrolled_elementwise_kernel<direct_copy_kernel_cuda>` runs 78 times per step, once per "
                           "layer (78 layers), and takes 90.4 % of all kernel time (67.5 ms per step)")


def test_a_multi_stream_note_is_a_caption_not_a_warning(tmp_path, open_page):
    # rank 3 of an 8-GPU training run (HTA's test data): kernels on four streams overlap
    from ingest.cli import main
    from tests.helpers import DATA

    db = tmp_path / "streams.duckdb"
    assert main(["import", str(DATA / "wild" / "hta__trace_diff__control.json.gz"), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1")
    assert not at.exception and not at.warning
    assert any(c.value.startswith("Kernels overlap on 4 streams: 39.7 ms of kernel time in a 36.5 ms step (1.09x")
               for c in at.caption)
    assert any(line.startswith("- **communication-not-overlapped** · 9.715 ms per step at stake")
               for line in at.markdown[1].value.splitlines())
