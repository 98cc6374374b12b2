"""db/views.py on the fixture database (tests/dashboard_fixture.py): real H200 bundles, so the
numbers below are what the traces and manifests say, to the digits they carry."""

import pytest

from db import views
from db.series import stored_series
from db.store import open_db
from ingest.runs.track import list_tracked_series
from tests.dashboard_fixture import find_run_id

GLM5_GRAPH = "b0e35bdd9a"  # md5 prefix of the glm5 / batch 1 / context 2048 / CUDA graph workload key
SHAS = ["b9bba772b7f5530d251a50d52003c0b5bcbad300", "3bee539b905abefebebbe41c4dfb4946cf960b47",
        "3cf16716eab78d4cd9ea520cb840b647b37f02c8"]  # first-parent order (seq 3, 4, 6)


@pytest.fixture(scope="module")
def store(dashboard_db):
    with open_db(dashboard_db, read_only=True) as s:
        yield s


@pytest.fixture(scope="module")
def cast_run(dashboard_db):
    return find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")


@pytest.fixture(scope="module")
def fused_run(dashboard_db):
    return find_run_id(dashboard_db, "3bee539-glm5-fused-graph")


def test_counts(store):
    assert views.count_runs(store) == {"runs": 23, "runs_with_commit": 22, "jobs": 4}


def test_series_group_runs_by_workload_and_name_them_by_an_md5_prefix(store):
    series = views.list_series(store)
    assert len(series) == 5  # glm5 graph, glm5 eager, tiny graph, tiny eager; glm5 graph of the KV regression
    top = series.iloc[0]
    assert (top.repo, top.engine, top.device, top.batch_size, top.workload_id) == (
        "stepwatch", "reference", "NVIDIA H200", 1, GLM5_GRAPH)
    assert (top.runs, top.commits, list(top.variants)) == (9, 3, ["full-pool-cast", "fused", "gather-then-cast"])
    assert sorted(series["runs"]) == [2, 3, 4, 4, 9]


def test_trend_is_in_first_parent_order_with_the_untimed_spread(store):
    trend = views.get_trend(store, "stepwatch", "reference", "NVIDIA H200", GLM5_GRAPH)
    assert len(trend) == 9
    assert trend.drop_duplicates("sha")["sha"].tolist() == SHAS
    assert trend["commit_order"].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    row = trend[(trend["sha"] == SHAS[1]) & (trend["variant"] == "full-pool-cast")].iloc[0]
    assert row.tok_per_s == pytest.approx(13.493828549, rel=1e-9)
    assert row.step_ms == pytest.approx(74.107952118, rel=1e-9)  # the timing median, not the profiled step
    # tok/s at the p90 and p10 step times of the manifest's 20 timed steps
    assert (row.tok_per_s_low, row.tok_per_s_high) == (pytest.approx(13.477217963, rel=1e-9),
                                                       pytest.approx(13.503207486, rel=1e-9))
    assert row.copy_share == pytest.approx(0.905789504, rel=1e-8)
    assert row.author == "Seed a008d096 maintainers" and row.subject.startswith("kernels: whole-row gather-cast")


def test_trend_of_the_last_commits(store):
    trend = views.get_trend(store, "stepwatch", "reference", "NVIDIA H200", GLM5_GRAPH, last_commits=2)
    assert trend.drop_duplicates("sha")["sha"].tolist() == SHAS[1:]
    assert trend["commit_order"].tolist() == [2, 2, 2, 3, 3, 3]


def test_unknown_series_is_empty_not_an_error(store):
    assert views.get_trend(store, "stepwatch", "reference", "NVIDIA H200", "0000000000").empty


def test_runs_without_a_commit(store):
    loose = views.list_runs_without_commit(store)
    assert len(loose) == 1
    assert loose.iloc[0].source_path.endswith("cpu_small.trace.json") and bool(loose.iloc[0].kernels_from_cpu_ops)


def test_run_overview(store, cast_run):
    run = store.get_run(cast_run)
    assert run["tok_per_s"] == pytest.approx(13.49, abs=0.005)
    assert run["copy_share"] == pytest.approx(0.905789504, rel=1e-8)
    # a profiled step's time is its GPU time, first kernel start to last kernel end (75.47 ms; the
    # host-side ProfilerStep span, 78.05 ms, also held the launch and the final sync); the
    # unprofiled CUDA-event timing is 74.11 ms
    assert run["gpu_busy_share"] == pytest.approx(0.989388272, rel=1e-8)
    assert (run["step_ms"], run["step_ms_median"]) == (pytest.approx(74.107952118), pytest.approx(75.471389))
    assert (run["sha"], run["variant"], run["workload_id"], run["kernel_rows"]) == (SHAS[1], "full-pool-cast",
                                                                                     GLM5_GRAPH, 16)
    assert run["trace_files"] == ["trace.json.gz"] and run["workload"]["preset"] == "glm5"
    assert store.get_run(999_999) is None


def test_runs_are_read_alone_or_many_at_once_the_same(store, cast_run, fused_run, dashboard_db):
    runs = store.list_runs([fused_run, cast_run, 999_999])
    assert runs == {cast_run: store.get_run(cast_run), fused_run: store.get_run(fused_run)}
    assert store.list_ranks(cast_run) == [0] and store.get_run(None) is None
    plain = store.get_run(find_run_id(dashboard_db, "cpu_small.trace.json"))
    assert (plain["repo"], plain["engine"], plain["variant"], plain["sha"]) == ("", "", "", None)


def test_series_of_one_repository_and_the_variants_change_tracking_follows(store):
    every = views.list_series(store)
    repos = sorted(set(every["repo"]))
    assert repos == ["kv-regression-demo", "stepwatch"]
    assert sum(len(views.list_series(store, r)) for r in repos) == len(every)
    assert views.list_series(store, "no-such-repo").empty
    tracked = list_tracked_series(store)
    assert len(tracked) == sum(len(v) for v in every["variants"])  # one per variant of each series
    assert [stored_series(s) for s in tracked] == sorted(
        (stored_series(s) for s in tracked), key=lambda s: [(v is None, v or "") for v in s.values()])
    top = [s for s in tracked if s["workload_id"] == GLM5_GRAPH and s["repo"] == "stepwatch"]
    assert [s["variant"] for s in top] == ["full-pool-cast", "fused", "gather-then-cast"]


def test_kernel_table_puts_the_cast_first_at_78_calls_a_step(store, cast_run):
    kernels = store.list_kernels(cast_run)
    assert len(kernels) == 16
    cast = kernels.iloc[0]
    assert cast["name"].startswith("void at::native::unrolled_elementwise_kernel")
    assert (cast.category, cast.calls_per_step, cast.calls) == ("cast", 78.0, 156)
    assert cast.ms_per_step == pytest.approx(67.5183225, rel=1e-9)
    assert cast.share == pytest.approx(0.904216741, rel=1e-8)
    assert kernels["ms_per_step"].is_monotonic_decreasing


def test_step_breakdown_adds_up_to_each_steps_wall_time(store, cast_run):
    breakdown = views.get_step_breakdown(store, cast_run)
    per_step = breakdown.groupby("step")["ms"].sum()
    assert per_step.tolist() == [pytest.approx(75.478116, abs=1e-5), pytest.approx(75.464662, abs=1e-5)]
    means = views.get_category_means(store, cast_run)
    assert means["category"].tolist() == ["cast", "gemm", "elementwise", "idle", "norm", "attention"]
    assert means.iloc[0].ms_per_step == pytest.approx(67.6357615, rel=1e-9)


def test_cpu_only_trace_has_cpu_ops_for_kernels_and_no_gpu_busy(store, dashboard_db):
    run = store.get_run(find_run_id(dashboard_db, "cpu_small.trace.json"))
    assert run["kernels_from_cpu_ops"] and run["gpu_busy_share"] is None and run["tok_per_s"] is None
    assert run["trace_files"] is None and run["sha"] is None


def test_category_diff_walks_from_one_step_time_to_the_other(store, cast_run, fused_run):
    diff = views.get_category_diff(store, cast_run, fused_run)
    assert diff["category"].tolist() == ["cast", "gemm", "elementwise", "idle", "norm", "attention"]
    assert diff.iloc[0].delta_ms_per_step == pytest.approx(-67.227378, rel=1e-9)
    assert diff["a_ms_per_step"].sum() == pytest.approx(75.471389, abs=1e-5)  # mean GPU ms of the two steps
    assert diff["b_ms_per_step"].sum() == pytest.approx(7.543148, abs=1e-5)


def test_kernel_diff_finds_the_cast_removed_and_the_fused_kernel_added(store, cast_run, fused_run):
    diff = views.get_kernel_diff(store, cast_run, fused_run)
    first, second = diff.iloc[0], diff.iloc[1]
    assert (first.change, first.a_calls_per_step, first.delta_ms_per_step) == (
        "removed", 78.0, pytest.approx(-67.5183225, rel=1e-9))
    assert (second.change, second["name"], second.b_calls_per_step) == ("added", "_gather_cast_kernel", 78.0)
    assert second.b_ms_per_step == pytest.approx(0.2906895, rel=1e-9)
    assert diff["change"].value_counts().to_dict() == {"both": 14, "removed": 2, "added": 1}
    assert diff["delta_ms_per_step"].abs().is_monotonic_decreasing


def test_variant_matrix_shows_every_variant_at_both_commits(store, dashboard_db):
    fused_before = find_run_id(dashboard_db, "b9bba77-glm5-fused-graph")
    fused_after = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    matrix = views.get_variant_matrix(store, fused_before, fused_after)
    assert matrix["variant"].tolist() == ["full-pool-cast", "fused", "gather-then-cast"]
    fused = matrix.iloc[1]
    assert (fused.a_run_id, fused.b_run_id) == (fused_before, fused_after)
    assert (fused.a_tok_per_s, fused.b_tok_per_s) == (pytest.approx(129.937088861), pytest.approx(129.535826537))
    assert matrix.iloc[0].b_run_id == find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    no_commit = find_run_id(dashboard_db, "cpu_small.trace.json")
    assert views.get_variant_matrix(store, no_commit, fused_after).empty


def test_trend_of_a_run_and_the_run_a_commit_shows(store, dashboard_db):
    fused_after = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    assert views.get_series_of_run(store, fused_after) == {
        "repo": "stepwatch", "engine": "reference", "device": "NVIDIA H200", "workload_id": GLM5_GRAPH,
        "workload_key": views.list_series(store).iloc[0].workload_key, "variant": "fused"}
    trend = views.get_trend_of_run(store, fused_after)
    assert len(trend) == 9 and views.pick_run_at(trend, SHAS[1], "fused") == fused_after
    assert views.pick_run_at(trend, SHAS[1], "no-such-variant") is None
    assert views.get_trend_of_run(store, find_run_id(dashboard_db, "cpu_small.trace.json")) is None


def test_default_comparison_is_the_last_two_commits_of_the_biggest_series(store, dashboard_db):
    assert views.find_default_comparison(store) == {
        "by": "commits", "a": find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph"),
        "b": find_run_id(dashboard_db, "3cf1671-glm5-full-pool-cast-graph")}


def test_comparison_holds_what_the_compare_page_shows(store, cast_run, fused_run, dashboard_db):
    both = views.get_comparison(store, cast_run, fused_run)
    assert (both["run_a"], both["run_b"], both["by"]) == (cast_run, fused_run, None)
    assert (both["a"]["variant"], both["b"]["variant"]) == ("full-pool-cast", "fused")
    assert both["kernels"].iloc[0].change == "removed" and len(both["trend"]) == 9 and len(both["series"]) == 5
    assert both["matrix"]["a_run_id"].tolist() == both["matrix"]["b_run_id"].tolist()  # one commit: A = B
    default = views.get_comparison(store, None, cast_run)
    assert (default["run_a"], default["by"]) == (cast_run, "commits")
    assert default["b"]["sha"] == SHAS[2]
    assert views.get_comparison(store, cast_run, 999_999)["b"] is None


def test_run_detail_holds_what_the_run_page_shows(store, cast_run):
    detail = views.get_run_detail(store, cast_run)
    assert detail["run"]["run_id"] == cast_run and detail["ranks"] == [0] and detail["job"] is None
    assert len(detail["kernels"]) == 16 and len(detail["breakdown"]) == 12 and len(detail["means"]) == 6
    assert views.get_run_detail(store, None) is None and views.get_run_detail(store, 999_999) is None


def test_jobs_newest_first_with_log_tail_and_the_runs_figures(store, dashboard_db):
    jobs = views.list_jobs(store)
    assert [(j["job_id"], j["status"]) for j in jobs] == [(4, "queued"), (3, "running"), (2, "failed"),
                                                          (1, "succeeded")]
    running, failed, done = jobs[1], jobs[2], jobs[3]
    assert (running["steps_done"], running["steps_planned"]) == (5, 23)
    assert running["log_tail"].endswith("progress: timing 5/20\n") and running["heartbeat_s"] >= 0
    assert (failed["error_kind"], failed["error"]) == ("engine-error", "kernels.bench exited with status 1")
    assert done["run_id"] == find_run_id(dashboard_db, "tiny-fused-graph-nostack")
    assert done["tok_per_s"] == pytest.approx(5229.250448947)
    assert views.list_jobs(store, limit=1, log_tail_chars=10)[0]["log_tail"] == ""
    assert "RuntimeError: out of memory" in views.get_job(store, 2)["log"]


def test_changes_hold_what_the_regressions_page_shows(store, dashboard_db):
    changes = views.list_changes(store)
    # one commit: the newest change id first; the cast kernel added and the gather-cast kernel removed
    # there (counts: exact from one run a side) beside tok/s and step ms (suspected: no run-to-run spread)
    assert [m.split(":")[0] + ":" + m.split(":")[1] if m.startswith("kernel:") else m for m in changes["metric"]] == [
        "kernel:calls_per_step", "kernel:calls_per_step", "tok_per_s", "step_ms"]
    assert changes["direction"].tolist() == ["added", "removed", "regression", "regression"]
    assert changes["status"].tolist() == ["confirmed", "confirmed", "suspected", "suspected"]
    tok = changes[changes["metric"] == "tok_per_s"].iloc[0]
    assert (tok.repo, tok.variant, tok.direction, tok.first_bad_short_sha, tok.last_good_sha[:7]) == (
        "kv-regression-demo", "main", "regression", "9f8e7d6", "1a2b3c4")
    assert (round(tok.before_value, 2), round(tok.after_value, 2), round(tok.rel_change, 4)) == (135.44, 13.62, -0.8994)
    assert (tok.commits_between, tok.bisect_runs, tok.first_bad_subject) == (
        2, 0, "decode: switch the KV strategy back to full-pool-cast")
    assert (tok.last_good_run_id, tok.first_bad_run_id) == tuple(
        find_run_id(dashboard_db, name) for name in ("fe3ea75-glm5-fused-graph", "fe3ea75-glm5-full-pool-cast-graph"))
    assert [f["kind"] for f in tok.diagnosis] == ["change", "change_kernel"]
    assert tok.workload_id == GLM5_GRAPH and changes["series_id"].nunique() == 1

    marked = views.list_series_changes(store, "kv-regression-demo", "reference", "NVIDIA H200", GLM5_GRAPH)
    assert sorted(marked["metric"]) == ["step_ms", "tok_per_s"]
    assert views.list_series_changes(store, "stepwatch", "reference", "NVIDIA H200", GLM5_GRAPH).empty
    at_bad = views.list_changes_at_commit_of_run(store, int(tok.first_bad_run_id))
    assert len(at_bad) == 4 and views.list_changes_at_commit_of_run(store, int(tok.last_good_run_id)).empty


def test_each_runs_kernel_rows_are_its_rows_of_every_rank(store):
    ids = views.list_recent_runs(store)["run_id"].tolist()
    every = {r: sum(len(store.list_kernels(r, rank)) for rank in store.list_ranks(r)) for r in ids}
    assert len(ids) >= 10 and sum(every.values()) > 0
    assert {r: store.get_run(r)["kernel_rows"] for r in ids} == every
    assert {r: run["kernel_rows"] for r, run in store.list_runs([*ids, 999_999]).items()} == every


def test_a_runs_diagnosis_is_part_of_its_overview(store, dashboard_db):
    run = store.get_run(find_run_id(dashboard_db, "3cf1671-glm5-full-pool-cast-eager"))
    assert [f["kind"] for f in run["diagnosis"]][:3] == ["summary", "per_layer", "bandwidth"]
    assert run["diagnosis"][1]["numbers"] == {"calls_per_step": 78.0, "layers": 78, "times_per_layer": 1}
    assert isinstance(store.get_run(find_run_id(dashboard_db, "cpu_small.trace.json"))["diagnosis"],
                      list)
