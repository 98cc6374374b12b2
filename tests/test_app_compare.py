"""The Compare page (AppTest) on the fixture database: two commits of the glm5 series with
every KV strategy at both, and two runs (full-pool-cast against fused) with the cast kernel
removed and the fused gather-cast kernel added. The two runs live in the URL."""

import contextlib
import io
import json

import pytest

from tests.dashboard_fixture import find_run_id

pytestmark = pytest.mark.slow  # AppTest pages


def test_two_commits_show_every_variant_at_both(dashboard_db, open_page):
    a = find_run_id(dashboard_db, "b9bba77-glm5-fused-graph")
    b = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    at = open_page(dashboard_db, "compare", a=str(a), b=str(b))
    assert not at.exception
    assert at.radio(key="compare_by").value == "two commits"
    assert at.selectbox(key="compare_sha_a").value.startswith("b9bba77")
    assert at.selectbox(key="compare_sha_b").value.startswith("3bee539")
    assert at.selectbox(key="compare_variant").value == "fused"
    assert (at.query_params["a"], at.query_params["b"], at.query_params["by"]) == (str(a), str(b), "commits")

    matrix = at.dataframe[0].value
    assert matrix["variant"].tolist() == ["full-pool-cast", "fused", "gather-then-cast"]
    assert matrix["b_tok_per_s"].round(2).tolist() == [13.49, 129.54, 122.69]
    assert matrix["change"].tolist() == ["-2.0 %", "-0.3 %", "-0.6 %"]
    # each variant judged as the headline is: one run a commit and a 3-commit history give no
    # run-to-run spread, so no verdict (was "within noise", judged on the steps of one run a side)
    assert matrix["verdict"].tolist() == ["not enough data"] * 3
    assert matrix["a_copy_share"].round(1).tolist() == [90.5, 6.1, 7.9]  # percent, one decimal, as the tiles

    tiles = [(m.label, m.value, m.delta) for m in at.metric]
    assert tiles[0] == ("Decode tok/s", "129.94", "")  # A
    assert tiles[4] == ("Decode tok/s", "129.54", "-0.3 % · not enough data")  # B against A, not coloured
    assert tiles[5] == ("Step ms", "7.720", "+0.3 % · not enough data")
    verdict = [m.value for m in at.markdown if m.value.startswith("**Not enough data**")]
    assert verdict == ["**Not enough data**: step time +0.3 %, 1 and 1 run; run-to-run spread unknown: no commit was "
                       "measured twice and the series' history is too short; run each commit 2 times (or let "
                       "stepwatch re-run it) to know whether it changed. tok/s -0.3 %."]
    assert ('The step-time verdict is "not enough data": what follows explains the differences there are, not a '
            "change." in [c.value for c in at.caption])
    assert tiles[6] == ("Copy-kernel share", "6.0 %", "-0.0 pp")
    # one share, one number: A's tile and the table's fused row print the same percent
    assert tiles[2][1] == f"{matrix['a_copy_share'].iloc[1]:.1f} %" == "6.1 %"


def test_two_runs_full_pool_cast_against_fused(dashboard_db, open_page):
    a = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    b = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    at = open_page(dashboard_db, "compare", a=str(a), b=str(b), by="runs")
    assert not at.exception
    assert (at.selectbox(key="compare_run_a").value, at.selectbox(key="compare_run_b").value) == (a, b)
    assert not at.warning  # the same workload: no warning
    tiles = {(i // 4, m.label): (m.value, m.delta) for i, m in enumerate(at.metric)}
    assert tiles[(0, "Decode tok/s")] == ("13.49", "")
    # a factor, not "+860.0 %"; one run a side and no repeats of this workload: no run-to-run
    # spread, so not a verdict of "changed" (the old one rested on the 20 steps of one run a side)
    assert tiles[(1, "Decode tok/s")] == ("129.54", "9.6x · not enough data")
    verdict = [m.value for m in at.markdown if m.value.startswith("**Not enough data**")]
    assert len(verdict) == 1 and verdict[0].startswith("**Not enough data**: step time -89.6 %, 1 and 1 run;")
    assert tiles[(1, "Copy-kernel share")] == ("6.0 %", "-84.5 pp")

    change = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert change["layer"][0]["encoding"]["y"]["sort"] == ["step", "cast", "gemm", "elementwise", "idle", "norm",
                                                           "attention"]

    kernels = at.dataframe[0].value
    # added and removed as they are; the rest cannot be judged: the workload has no run-to-run
    # spread (one run a commit), and the two profiled steps of one run are no evidence of a change
    # between runs (the three gemm kernels once read "changed" at -15.9 % on those steps alone)
    assert kernels["change"].tolist() == ["removed", "added", "removed"]
    shown = [c.value for c in at.caption if "launcher op) shown" in c.value]
    assert shown and shown[0].startswith("3 of 17 kernels (matched by name and launcher op) shown")
    assert "1 added, 2 removed, 0 changed beyond their noise, 0 within noise, 14 not enough data" in shown[0]
    assert kernels.iloc[0]["name"].startswith("void at::native::unrolled_elementwise_kernel")
    assert (kernels.iloc[0].a_calls_per_step, round(kernels.iloc[0].delta_ms_per_step, 3)) == (78.0, -67.518)
    assert (kernels.iloc[1]["name"], kernels.iloc[1].b_calls_per_step) == ("_gather_cast_kernel", 78.0)
    short, pct = kernels.iloc[0].short_name, kernels.iloc[0].delta_pct
    assert (short, pct) == ("unrolled_elementwise_kernel<direct_copy_kernel_cuda>", -100.0)
    assert list(at.dataframe[0].proto.column_order)[:5] == ["change", "delta_ms_per_step", "delta_pct", "interval",
                                                            "short_name"]

    at.multiselect[0].set_value(["added"]).run()
    assert at.dataframe[0].value["name"].tolist() == ["_gather_cast_kernel"]


def test_runs_of_different_workloads_are_compared_with_a_warning(dashboard_db, open_page):
    a = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    b = find_run_id(dashboard_db, "tiny-fused-graph-nostack")
    at = open_page(dashboard_db, "compare", a=str(a), b=str(b), by="runs")
    assert not at.exception
    assert at.warning[0].value.startswith("Runs A and B measured different workloads")


def test_default_comparison_is_the_last_two_commits(dashboard_db, open_page):
    at = open_page(dashboard_db, "compare")
    assert not at.exception
    assert at.selectbox(key="compare_sha_a").value.startswith("3bee539")
    assert at.selectbox(key="compare_sha_b").value.startswith("3cf1671")
    assert at.query_params["a"] == str(find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph"))


def test_picking_another_commit_rewrites_the_url(dashboard_db, open_page):
    at = open_page(dashboard_db, "compare", a=str(find_run_id(dashboard_db, "b9bba77-glm5-fused-graph")),
                   b=str(find_run_id(dashboard_db, "3bee539-glm5-fused-graph")))
    at.selectbox(key="compare_sha_b").select("3cf16716eab78d4cd9ea520cb840b647b37f02c8").run()
    assert not at.exception
    assert at.query_params["b"] == str(find_run_id(dashboard_db, "3cf1671-glm5-fused-graph"))
    assert at.markdown[1].value.startswith(f"**B** · [run {at.query_params['b']} · 3cf1671 · fused")
    at.selectbox(key="compare_variant").select("gather-then-cast").run()
    assert (at.query_params["a"], at.query_params["b"]) == (
        str(find_run_id(dashboard_db, "b9bba77-glm5-gather-then-cast-graph")),
        str(find_run_id(dashboard_db, "3cf1671-glm5-gather-then-cast-graph")))


def test_a_patched_pair_at_one_commit_is_diagnosed_as_a_patch(dashboard_db, open_page):
    a = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    b = find_run_id(dashboard_db, "3bee539-glm5-fused-graph")
    at = open_page(dashboard_db, "compare", a=str(a), b=str(b), by="runs")
    lines = at.markdown[3].value.splitlines()
    assert lines[0] == ("- At commit 3bee539 the patch (fused against full-pool-cast) takes a step from 74.1 ms to "
                        "7.72 ms (13.5 -> 130 tok/s): 9.60x as fast, so it still helps (at least 3 % needed).")
    assert lines[1] == ("- It removes the cast kernel `unrolled_elementwise_kernel<direct_copy_kernel_cuda>`: 78 calls "
                        "and 67.5 ms per step, replayed from a CUDA graph.")  # (every replayed kernel has the replay's line)
    assert any(c.value.startswith("B is A patched") for c in at.caption)


def test_two_commits_show_the_change_diagnosis_and_the_changes_confirmed_there(dashboard_db, open_page):
    a = find_run_id(dashboard_db, "fe3ea75-glm5-fused-graph")  # the KV regression's last good and first bad runs
    b = find_run_id(dashboard_db, "fe3ea75-glm5-full-pool-cast-graph")
    at = open_page(dashboard_db, "compare", a=str(a), b=str(b), by="runs")
    assert not at.exception
    lines = at.markdown[3].value.splitlines()
    assert lines[0] == "- tok/s fell 89.9 % at commit 9f8e7d6 (135 tok/s -> 13.6 tok/s; step time 7.38 ms -> 73.4 ms)."
    assert "went from 0 to 78 calls per step there (once per layer)" in lines[1]
    # one change point, one line: one run a commit, no history, so tok/s and step ms are suspected (it read
    # "Confirmed ..., p = 6.8e-08" on the steps of one run a side); the kernels' counts are exact from one
    # run a side: added and removed inside the same line (they were a line each, beside one a metric)
    events = [m.value for m in at.markdown if m.value.startswith(("Confirmed at", "Suspected at"))]
    assert events == ["Suspected at 9f8e7d6 in kv-regression-demo (main): **tok/s -89.9 % (135.44 tok/s -> 13.62 "
                      "tok/s)**; also step ms 9.9x (suspected, not enough data: 1 and 1 run, no run-to-run spread: "
                      "run each commit 2 times); kernels added `unrolled_elementwise_kernel<direct_copy_kernel_cuda>`, "
                      "removed `_gather_cast_kernel` (exact: 1 and 1 run) · [all changes](regressions)"]


def test_one_run_in_the_url_or_the_same_run_twice_is_a_notice(dashboard_db, open_page):
    a = str(find_run_id(dashboard_db, "b9bba77-glm5-fused-graph"))
    at = open_page(dashboard_db, "compare", a=a)
    assert not at.exception
    assert at.warning[0].value.startswith("Comparing needs two runs, `?a=` and `?b=`; only `?a=` was given: showing "
                                          "the default comparison")
    same = open_page(dashboard_db, "compare", a=a, b=a)
    assert not same.exception
    assert same.warning[0].value == (f"A and B are the same run ({a}): every difference below is zero. "
                                     "Pick another run for B.")
    bad = open_page(dashboard_db, "compare", a="x", b=a)
    assert bad.warning[0].value == "`?a=x` is not a run id (a positive whole number): ignored."


def test_two_imported_traces_one_without_a_commit_and_of_rank_1(tmp_path, open_page):
    # real traces of other projects imported on their own (no workload recorded): run A with a commit,
    # run B a single trace of rank 1 (HTA's trace_diff test, distributedInfo.rank 1) and no commit
    from ingest.cli import main
    from tests.helpers import DATA

    db = tmp_path / "two.duckdb"
    wild = DATA / "wild"
    assert main(["import", str(wild / "tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"), "--db", str(db),
                 "--repo", "demo", "--commit", "c0ffee1"]) == 0
    assert main(["import", str(wild / "hta__trace_diff__test.json.gz"), "--db", str(db)]) == 0
    at = open_page(db, "compare", a="1", b="2", by="runs")
    assert not at.exception  # run B's missing commit once raised on `b["sha"][:7]`
    assert at.warning[0].value.startswith("Run A or run B has no workload recorded")
    assert not any(s.value == "Every variant at both commits" for s in at.subheader)
    # run B's categories are its own rank's (rank 1), not an empty rank 0's
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", "2", "--db", str(db), "--json"]) == 0
    b_kernels = json.loads(out.getvalue())["kernels"]
    assert b_kernels and sum(k["ms_per_step"] for k in b_kernels) > 50
    frames = [d.value for d in at.dataframe]
    kernel_diff = next(f for f in frames if "change" in f and "name" in f)
    assert (kernel_diff["change"] == "added").sum() > 10  # B's kernels are there (none of A's names)


def test_a_same_sha_pair_reads_as_a_repeat_and_two_commits_pool_their_runs(tmp_path, open_page):
    # the glm5-serving-demo sample bundles of its first two commits: two real H200 runs each (fused at both)
    import shutil

    from db.store import open_db
    from ingest.traces.categories import load_rule_chain
    from ingest.traces.samples import SAMPLE_DIR, load_samples

    only = tmp_path / "samples"
    only.mkdir()
    for name in ("demo-9317abc-1-glm5-graph", "demo-9317abc-2-glm5-graph", "demo-05a3934-1-glm5-graph",
                 "demo-05a3934-2-glm5-graph"):
        (only / name).symlink_to(SAMPLE_DIR / name)
    shutil.copy(SAMPLE_DIR / "commits.json", only / "commits.json")
    db = tmp_path / "demo.duckdb"
    assert load_samples(str(db), load_rule_chain(), only) == 4
    with open_db(db, read_only=True) as store:
        ids = {sha: [r for (r,) in store.con.execute(
            "SELECT r.run_id FROM runs r JOIN commits c USING (commit_id) WHERE starts_with(c.sha, ?)"
            " ORDER BY r.run_id", [sha]).fetchall()] for sha in ("9317abc", "05a3934")}
    first, second = ids["9317abc"]
    at = open_page(db, "compare", a=str(first), b=str(second), by="runs")
    assert not at.exception
    verdict = [m.value for m in at.markdown if m.value.startswith("**Repeat, within noise**")]
    assert len(verdict) == 1 and "the same commit measured twice" in verdict[0]
    assert [m.delta for m in at.metric][5].endswith("· repeat, within noise")  # the step tile, not coloured
    at = open_page(db, "compare", a=str(first), b=str(ids["05a3934"][0]), by="commits")
    assert not at.exception
    pooled = [m.value for m in at.markdown if "2 and 2 runs" in m.value]
    # each commit's two runs pooled, the spread theirs: 2.8 % on 2 degrees of freedom is too noisy for 10 %
    assert pooled and pooled[0].startswith("**Too noisy to judge changes under"), [m.value for m in at.markdown]
    assert "from 2 repeated runs (pooled within commits)" in pooled[0]
