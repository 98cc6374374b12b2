"""The Run page (AppTest) on the fixture database: the glm5 full-pool-cast run's figures as the
H200 measured them, its kernels, its trace for Perfetto; a job's log; a CPU-only trace."""

import json
import math

import pytest

from ingest.cli import main
from tests.dashboard_fixture import find_run_id
from tests.helpers import DATA

pytestmark = pytest.mark.slow  # AppTest pages


def _metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def test_glm5_full_pool_cast_run(dashboard_db, open_page):
    run_id = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    at = open_page(dashboard_db, "run", run=str(run_id))
    assert not at.exception
    assert at.selectbox(key="url_run").value == str(run_id)
    assert _metrics(at) == {"Decode tok/s": "13.49", "Step ms, no profiler": "74.108", "Copy-kernel share": "90.6 %",
                            "GPU busy share": "98.9 %"}
    assert at.caption[0].value.startswith("stepwatch · 3bee539 kernels: whole-row gather-cast")
    assert "variant full-pool-cast · reference · NVIDIA H200 · glm5 · batch 1 · context 2048 · CUDA graph" \
        in at.caption[0].value
    # a bundle's steps timed without the profiler: the Step ms tile is theirs
    assert any(c.value.endswith("Profiled steps can run slower than the Step ms tile above, which was timed without "
                                "the profiler.") for c in at.caption)

    kernels = at.dataframe[0].value
    assert len(kernels) == 16
    assert list(at.dataframe[0].proto.column_order) == [  # the table's frame has more (tables.build_kernel_table)
        "short_name", "share", "ms_per_step", "calls_per_step", "mean_us", "tflops_shown", "tbps_shown",
        "compute_fraction_shown", "bw_fraction_shown", "bound", "category", "launcher", "source", "calls", "median_us",
        "p90_us", "bytes_per_call_shown", "name"]
    cast = kernels.iloc[0]
    assert cast["name"].startswith("void at::native::unrolled_elementwise_kernel")
    # the share in percent, as the table prints it ("90.4 %")
    assert (cast.calls_per_step, round(cast.ms_per_step, 3), round(cast.share, 2)) == (78.0, 67.518, 90.42)
    assert cast.launcher == "cudaGraphLaunch" and cast.source == "kernels/workload.py(238): run_step"

    step_chart, mean_chart = (json.loads(c.proto.spec) for c in at.get("vega_lite_chart"))
    assert step_chart["encoding"]["x"]["field"] == "step" and mean_chart["encoding"]["x"]["field"] == "ms_per_step"
    # replayed from a CUDA graph: no kernel has an op of its own, so no roofline, and the page says why
    assert any(c.value.startswith("No roofline: no kernel's op has a cost model") for c in at.caption)

    download = at.get("download_button")
    run_id = find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")
    assert [d.proto.label for d in download] == [f"Download run{run_id}-3bee539-full-pool-cast-trace.json.gz"]
    assert any("ui.perfetto.dev" in c.value for c in at.caption)
    assert not at.expander  # not made by a job: no log


def test_kernel_filter(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "3bee539-glm5-full-pool-cast-graph")))
    at.text_input[0].input("NVJET").run()
    shown = at.dataframe[0].value
    assert len(shown) == 3 and shown["name"].str.startswith("nvjet").all()
    assert any(c.value.startswith("3 of 16 kernels") for c in at.caption)


def test_a_run_made_by_a_job_shows_the_jobs_log(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "tiny-fused-graph-nostack")))
    assert not at.exception
    assert at.expander[0].label == "Log of job 1 (succeeded): reference tiny fused on local/cpu"
    assert "bundle written" in at.code[0].value


def test_cpu_only_trace_says_so(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "cpu_small.trace.json")))
    assert not at.exception
    assert at.info[0].value.startswith("This trace has no GPU kernels (a CPU-only run;")
    assert _metrics(at) == {"Decode tok/s": "—", "Step ms, profiled": "0.270", "Copy-kernel share": "46.6 %",
                            "GPU busy share": "—"}
    assert at.dataframe[0].value.iloc[0]["name"] == "aten::copy_"
    run_id = find_run_id(dashboard_db, "cpu_small.trace.json")
    assert [d.proto.label for d in at.get("download_button")] == [f"Download run{run_id}-cpu_small.trace.json"]


def _default_run(db) -> int:
    from db import views
    from db.store import open_db

    with open_db(db, read_only=True) as store:
        return views.find_default_run(store, 0.05)["run_id"]


def test_without_a_run_in_the_url_the_newest_run_with_rates_is_shown(dashboard_db, open_page):
    at = open_page(dashboard_db, "run")
    shown = int(at.query_params["run"])
    assert shown == _default_run(dashboard_db) != find_run_id(dashboard_db, "cpu_small.trace.json")  # not the newest
    assert at.dataframe[0].value["tbps"].gt(0).any()


def test_an_unknown_run_is_a_sentence(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run="999999")
    assert not at.exception
    assert at.warning[0].value == "There is no run 999999 in this database."


def test_the_diagnosis_of_the_eager_full_pool_cast_run(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "3cf1671-glm5-full-pool-cast-eager")))
    assert not at.exception
    assert at.subheader[0].value == "Diagnosis"
    lines = at.markdown[0].value.splitlines()
    assert lines[0].startswith("- The cast kernel `unrolled_elementwise_kernel<direct_copy_kernel_cuda>` "
                               "(aten\\:\\:\u2060copy\\_) takes 90.6 % of all kernel time: 67.7 ms of each 77.8 ms "
                               "profiled step")  # aten::copy_; the share the kernel table and the tile print
    assert lines[1] == "  - It runs 78 times per step: once per layer (78 layers)."  # nested under its kernel
    assert lines[2] == "  - It moves 855 MB per call at 985 GB/s: 20.5 % of the NVIDIA H200's 4,800 GB/s peak."
    assert lines[3].startswith("  - 855 MB per call is the whole 495,000 x 576 FP8 KV pool of a layer")
    # the timed 75.1 ms less the kernel's part of the profiled step (67.7 of 77.8 ms)
    assert lines[5].startswith("  - If this kernel went away and nothing else changed, a step would take 9.75 ms "
                               "instead of 75.1 ms: 103 tok/s instead of 13.3 (7.7x)")


def test_a_finding_worded_the_same_for_every_kernel_is_said_once(dashboard_db, open_page):
    # the CUDA-graph fused run: three gemm kernels, none with op shapes (a graph replay)
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "3bee539-glm5-fused-graph")))
    assert not at.exception
    lines = at.markdown[0].value.splitlines()
    assert [line[:22] for line in lines if not line.startswith("  ")] == ["- The gemm kernel `nvj"] * 3 + [
        "- Its bytes per call a"]
    assert lines[-1].endswith("(The same for all 3 kernels above.)")
    assert sum("bytes per call are unknown" in line for line in lines) == 1
    assert sum(line.startswith("  - It runs ") for line in lines) == 3  # each kernel's own count stays with it


def test_a_tp2_run_shows_its_ranks_and_the_rank_the_other_waits_for(tmp_path, open_page):
    # the real TP=2 capture from the H200s (tests/data/h200/tp2), imported as a user would
    db = tmp_path / "tp2.duckdb"
    assert main(["import", str(DATA / "h200" / "tp2"), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1")
    assert not at.exception
    assert any(c.value.startswith("The checks and the diagnosis are rank 0's") for c in at.caption)
    # traces imported on their own have no timing without the profiler: Step ms is the profiled median
    assert any(c.value.endswith("The Step ms tile above is these profiled steps' median: the run has no timing "
                                "without the profiler.") for c in at.caption)
    assert "GPU not named" not in at.caption[0].value and "NVIDIA H200" in at.caption[0].value
    # (rank 0 spends most of its step in all-reduces that nothing overlaps: a pattern under the diagnosis)
    assert [s.value for s in at.subheader][:4] == ["Diagnosis", "Patterns", "Ranks", "Where the step time goes"]
    ranks = at.dataframe[0].value
    assert ranks["rank"].tolist() == [0, 1] and ranks["last_arrivals"].tolist()[1] >= 30
    assert any(c.value.startswith("Rank 1 reaches") and "keeps the others waiting longest" in c.value
               for c in at.caption)
    assert any(c.value.startswith("Note: rank 1 keeps the other ranks waiting longest") for c in at.caption)
    parts = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert parts["encoding"]["y"]["field"] == "rank"
    assert at.selectbox(key="url_rank").value == "0"
    at.selectbox(key="url_rank").set_value("1").run()
    assert not at.exception and at.query_params["rank"] in ("1", ["1"])
    assert any(c.value.startswith("Note: rank 1 keeps the other ranks waiting longest") for c in at.caption)


def test_a_single_trace_of_rank_1_shows_its_kernels(tmp_path, open_page):
    db = tmp_path / "r1.duckdb"
    assert main(["import", str(DATA / "wild" / "hta__trace_compare__base.json.gz"), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1")
    assert not at.exception
    kernels = at.dataframe[0].value  # rank 1's kernels: the only rank there is, no rank selector
    assert len(kernels) == 7 and kernels["name"].str.contains("Memcpy|kernel", case=False).any()
    assert not [s for s in at.selectbox if s.key == "url_rank"]
    assert any(c.value.startswith("The trace of rank 1 (of a multi-GPU job") for c in at.caption)


def test_a_run_id_that_is_not_a_number_is_ignored_with_a_notice(dashboard_db, open_page):
    newest = str(_default_run(dashboard_db))
    for bad in ("abc", "1;DROP TABLE runs", "-3", "0", "１２"):
        at = open_page(dashboard_db, "run", run=bad)
        assert not at.exception
        notice = f"`?run={bad}` is not a run id (a positive whole number): ignored."
        # first, once; the default run's own warnings (its figures' consistency) may follow
        assert at.warning[0].value == notice and [w.value for w in at.warning].count(notice) == 1
        assert at.query_params["run"] == newest  # the default run is shown, and the URL says which


def test_a_rank_the_run_does_not_have_is_a_notice(dashboard_db, open_page):
    at = open_page(dashboard_db, "run", run=str(find_run_id(dashboard_db, "cpu_small.trace.json")), rank="7")
    assert not at.exception
    assert [w.value for w in at.warning] == ["`?rank=7`: this run has one rank, 0, shown below."]
    assert "rank" not in at.query_params


def test_download_names_say_whose_trace_it_is():
    from app.traces import DOWNLOAD_NAME_CHARS, download_name

    assert download_name(12, "3bee539b905a", "full-pool-cast", "trace.json.gz") == \
        "run12-3bee539-full-pool-cast-trace.json.gz"
    assert download_name(3, None, None, "cpu_small.trace.json") == "run3-cpu_small.trace.json"
    hostile = download_name(4, "abc", "x/../$(rm -rf ~)", "node-TP-0-DECODE.trace.json.gz")
    assert not {"/", "$", " ", "~"} & set(hostile) and hostile.endswith("-node-TP-0-DECODE.trace.json.gz")
    long = download_name(5, "a" * 40, "v" * 300, "t.json")
    assert len(long) == DOWNLOAD_NAME_CHARS and long.startswith("run5-aaaaaaa-vvv") and long.endswith("-t.json")


def test_the_eager_run_shows_its_roofline_and_the_table_its_rates(dashboard_db, open_page):
    """The eager glm5 whole-pool-cast run (recorded with shapes): the roofline's two panels, the
    GEMMs placed by intensity under the H200's roofs, the cast by its TB/s against HBM's, and the
    kernel table's TFLOP/s, TB/s, fractions and bound as the import stored them."""
    run_id = find_run_id(dashboard_db, "3cf1671-glm5-full-pool-cast-eager")
    at = open_page(dashboard_db, "run", run=str(run_id))
    assert not at.exception
    kernels = at.dataframe[0].value
    cast = kernels.iloc[0]
    assert cast["launcher"] == "aten::copy_" and cast["bound"] == "memory" and cast["tflops"] == 0
    assert math.isnan(cast["tflops_shown"])  # a cast has no FLOPs: blank, not "0.000"
    # 495,000 x 576 FP8 read and the same in BF16 written (the table prints fractions in percent)
    assert cast["tbps"] == pytest.approx(495_000 * 576 * 3 / cast["mean_us"] / 1e6)
    assert cast["bandwidth_fraction"] == pytest.approx(100 * cast["tbps"] / 4.8)
    gemms = kernels[kernels["launcher"] == "aten::mm"]
    assert len(gemms) >= 3 and gemms["tflops"].gt(0).all() and gemms["compute_fraction"].lt(100).all()
    (roof,) = [json.loads(c.proto.spec) for c in at.get("vega_lite_chart") if "vconcat" in json.loads(c.proto.spec)]
    top, flat = roof["vconcat"]
    assert top["title"] == "kernels with FLOPs" and flat["title"].startswith("kernels without FLOPs")
    dots = next(layer for layer in top["layer"] if layer["mark"]["type"] == "circle")
    assert (dots["encoding"]["x"]["field"], dots["encoding"]["y"]["field"]) == ("intensity", "tflops")
    assert dots["encoding"]["x"]["scale"]["type"] == dots["encoding"]["y"]["scale"]["type"] == "log"
    assert flat["layer"][0]["encoding"]["x"]["field"] == "tbps"  # (the points themselves: tests/test_roofline.py)
    assert any("NVIDIA H200 SXM datasheet" in c.value and "measured on the card" in c.value for c in at.caption)
