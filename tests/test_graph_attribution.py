"""Graph-kernel attribution (ingest/traces/graph_attribution.py): kernels replayed from a CUDA graph
given the op, Python line and layer of their twins in a graph-off mapping trace of the same workload.

On real H200 pairs: the tiny preset's graph and eager bundles (tests/data/bundles, 3 steps each,
with and without with_stack) and the glm5 pair the reference engine made in one job
(tests/data/h200/glm5-graph-pair: 78 layers, one step each). The Python lines are read from
kernels/workload.py as it was at the commit each capture names (git show), not written here."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from db.store import open_db
from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.graph_attribution import KernelSequence, align_names, align_steps, find_layers, summarise_layers
from ingest.traces.trace_read import read_trace
from kernels.bundle import BundleError, read_bundle
from tests.helpers import DATA, ROOT, file_digest, run_cli

BUNDLES = DATA / "bundles"
PAIR = DATA / "h200" / "glm5-graph-pair"
CAST = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda"


def workload_line(commit: str, definition: str) -> str:
    """`kernels/workload.py(N): name` for `def name(` as kernels/workload.py had it at `commit`:
    torch names a Python frame by its function's first line."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:kernels/workload.py"], check=True,
                          capture_output=True, text=True).stdout
    line = next(i for i, t in enumerate(text.splitlines(), 1) if re.match(rf"\s*def {definition}\(", t))
    return f"kernels/workload.py({line}): {definition}"


def analyse_pair(graph: Path, mapping: Path):
    return analyse_trace(read_trace(graph), load_rule_chain(), None, read_trace(mapping))


# -- the pure stages, on sequences made here ---------------------------------------------------
def test_alignment_skips_kernels_that_only_one_mode_ran():
    a = np.array([1, 2, 3, 9, 1, 2, 3])  # the graph ran 9 where eager did not, eager ran 7 twice
    b = np.array([1, 7, 2, 3, 1, 2, 3, 7])
    ia, ib = align_names(a, b)
    assert ia.tolist() == [0, 1, 2, 4, 5, 6] and ib.tolist() == [0, 2, 3, 4, 5, 6]


def _seq(names, steps, streams=None):
    names = np.asarray(names)
    return KernelSequence(names, np.zeros(len(names), np.int64) if streams is None else np.asarray(streams),
                          np.asarray(steps), np.arange(len(names), dtype=float))


def test_streams_pair_by_content_not_by_id():
    graph = _seq([5, 6, 5, 6, 1, 2, 3], [0] * 7, streams=[40, 40, 40, 40, 41, 41, 41])
    eager = _seq([1, 2, 3, 5, 6, 5, 6], [0] * 7, streams=[7, 7, 7, 9, 9, 9, 9])
    twin = align_steps(graph, eager).twin
    assert twin.tolist() == [3, 4, 5, 6, 0, 1, 2]


def test_a_step_that_shares_few_kernels_is_refused_whole():
    small = _seq([1, 2, 3, 4] * 2, [0] * 8)
    large = _seq([1, 2, 3, 4] * 20, [0] * 80)  # the small one is a subsequence: never attribute it
    aligned = align_steps(small, large)
    assert (aligned.twin == -1).all() and aligned.steps_aligned == 0
    assert aligned.refused == ["step 0: 8 of 8 graph kernels align with the 80 of mapping step 0"]


def test_layers_are_calls_of_the_outermost_function_called_twice_a_step():
    # frames: 0 forward (once a step), 1-3 layer (three calls), 4 a helper inside layer 2
    name = np.array([10, 11, 11, 11, 12])
    parent = np.array([-1, 0, 0, 0, 3])
    depth = np.array([1, 2, 2, 2, 3])
    start = np.array([0.0, 1, 5, 9, 10])
    user = np.ones(5, bool)
    kernel_frame = np.array([1, 2, 4, 0, -1])
    layer, frame = find_layers(name, parent, depth, user, start, 1, kernel_frame, np.zeros(5, np.int64))
    assert layer.tolist() == [0, 1, 2, -1, -1] and frame.tolist() == [11, 11, 11, -1, -1]
    assert summarise_layers(np.array([0, 1, 2, 5, 7, 8, -1])) == "0-2, 5, 7-8"


# -- real H200 pairs -------------------------------------------------------------------------------
@pytest.mark.parametrize("kv,kernels", [("fused", 192), ("full-pool-cast", 204)])
def test_tiny_graph_kernels_are_attributed_to_workload_lines_and_layers(kv, kernels):
    graph, eager = BUNDLES / f"tiny-{kv}-graph-stack", BUNDLES / f"tiny-{kv}-eager-stack"
    fig = analyse_pair(graph / "trace.json.gz", eager / "trace.json.gz")
    commit = read_bundle(eager).commit
    summary = fig.graph_attribution
    assert (summary["kernels"], summary["matched"], summary["unmatched"]) == (kernels, kernels, 0)
    assert summary["time_share"] == 1.0 and (summary["steps_aligned"], summary["steps_refused"]) == (3, 0)
    assert summary["layer_frame"] == workload_line(commit, "_run_layer")
    stats = fig.kernel_stats.to_pandas()
    assert (stats["launcher"] == "cudaGraphLaunch").all()  # what the trace says stays as it says it
    assert (stats["source"] == workload_line(commit, "run_step")).all()
    assert (stats["graph_layers"] == "0-3").all()
    rms = stats[stats["name"].str.contains("vectorized_layer_norm_kernel")].iloc[0]
    assert (rms.graph_op, rms.graph_source, rms.calls) == ("aten::_fused_rms_norm", workload_line(commit, "_run_layer"),
                                                           24)
    if kv == "full-pool-cast":
        cast = stats[stats["name"].str.startswith(CAST)].iloc[0]
        assert (cast.graph_op, cast.graph_source, cast.calls) == ("aten::copy_", workload_line(commit, "_fetch_kv"), 12)
    else:  # the Triton kernel has no op around its launch, eager or not: its launch call is its launcher
        gather = stats[stats["name"] == "_gather_cast_kernel"].iloc[0]
        assert gather.graph_op == "cuLaunchKernelEx" and gather.graph_source.startswith("kernels/kv_cast.py(")


def test_without_stack_the_ops_are_attributed_but_no_line_or_layer():
    fig = analyse_pair(BUNDLES / "tiny-full-pool-cast-graph-nostack" / "trace.json.gz",
                       BUNDLES / "tiny-full-pool-cast-eager-nostack" / "trace.json.gz")
    assert (fig.graph_attribution["matched"], fig.graph_attribution["layer_frame"]) == (204, None)
    stats = fig.kernel_stats
    assert set(stats["graph_op"]) >= {"aten::copy_", "aten::mm", "aten::bmm"} and "" not in set(stats["graph_op"])
    assert (stats["graph_source"] == "").all() and (stats["graph_layers"] == "").all()


def test_glm5_graph_kernels_are_attributed_to_their_workload_lines():
    fig = analyse_pair(PAIR / "trace.json.gz", PAIR / "mapping.trace.json.gz")
    commit = read_bundle(PAIR).commit
    summary = fig.graph_attribution
    assert (summary["kernels"], summary["matched"], summary["unmatched"], summary["time_share"]) == (1638, 1638, 0, 1.0)
    assert summary["method"] == "mapping trace" and summary["layer_frame"] == workload_line(commit, "_run_layer")
    stats = fig.kernel_stats.to_pandas().set_index("name")
    cast = stats.loc[[n for n in stats.index if n.startswith(CAST)][0]]
    assert (cast.graph_op, cast.graph_source, cast.graph_layers, cast.calls) == (
        "aten::copy_", workload_line(commit, "_fetch_kv"), "0-77", 78)
    gather = stats.loc[[n for n in stats.index if "vectorized_gather_kernel" in n][0]]
    assert (gather.graph_op, gather.graph_source) == ("aten::index", workload_line(commit, "_fetch_kv"))
    # every GEMM of every layer: the projections' aten::mm, the attention's aten::bmm (ten kernels a
    # layer: four projections and two bmm, some split-K with a reduction kernel)
    gemm = fig.kernel_stats[fig.kernel_stats["category"] == "gemm"]
    assert set(gemm["graph_op"]) == {"aten::mm", "aten::bmm"} and set(gemm["graph_layers"]) == {"0-77"}
    assert gemm["calls"].sum() == 78 * 10


def test_the_glm5_bundle_carries_its_mapping_and_is_imported_attributed(tmp_path):
    db = tmp_path / "g.duckdb"
    result = run_cli("ingest", "import", str(PAIR), "--db", str(db))
    assert result.returncode == 0, result.stderr
    report = run_cli("ingest", "report", result.stdout.strip(), "--db", str(db), "--json")
    body = json.loads(report.stdout)
    assert {k: body["graph_attribution"][k] for k in ("method", "kernels", "matched", "unmatched")} == {
        "method": "mapping trace", "kernels": 1638, "matched": 1638, "unmatched": 0}
    cast = body["kernels"][0]
    assert cast["launcher"] == "cudaGraphLaunch" and cast["graph_op"] == "aten::copy_"
    text = run_cli("ingest", "report", result.stdout.strip(), "--db", str(db)).stdout
    assert "graph kernels: 1,638 of 1,638 attributed by mapping trace (100.0 % of their time), 0 unmatched" in text
    assert "via mapping trace: aten::copy_ at kernels/workload.py(" in text
    with open_db(db, read_only=True) as store:
        run = store.get_run(int(result.stdout))
    fetch = workload_line(read_bundle(PAIR).commit, "_fetch_kv")
    assert "(aten::copy_, by the mapping trace)" in run["diagnosis"][0]["text"]
    assert f"`{fetch}` (by the mapping trace)" in run["diagnosis"][0]["text"]


def test_a_trace_with_mapping_given_on_the_command_line(tmp_path):
    db = tmp_path / "t.duckdb"
    graph = BUNDLES / "tiny-full-pool-cast-graph-stack" / "trace.json.gz"
    result = run_cli("ingest", "import", str(graph), "--db", str(db), "--mapping",
                     str(BUNDLES / "tiny-full-pool-cast-eager-stack" / "trace.json.gz"))
    assert result.returncode == 0, result.stderr
    plain = run_cli("ingest", "import", str(graph), "--db", str(db))  # the same trace unattributed: its own run
    assert plain.returncode == 0 and plain.stdout != result.stdout
    with open_db(db, read_only=True) as store:
        attributed, unattributed = store.get_run(int(result.stdout)), store.get_run(int(plain.stdout))
        assert attributed["graph_attribution"]["matched"] == 204 and unattributed["graph_attribution"] is None
        assert set(store.list_kernels(int(plain.stdout))["graph_op"]) == {""}


# -- refused: one line naming the file, exit 2, the database unchanged ---------------------------
TINY_GRAPH = BUNDLES / "tiny-full-pool-cast-graph-stack" / "trace.json.gz"
REFUSED = {
    "another workload (glm5 eager for a tiny graph run)": (
        TINY_GRAPH, PAIR / "mapping.trace.json.gz",
        "is not of the graph run's workload: step 0: 40 of 68 graph kernels align with the 1,638 of mapping step 0"),
    "another workload (tiny eager for the glm5 graph run)": (
        PAIR / "trace.json.gz", BUNDLES / "tiny-full-pool-cast-eager-stack" / "trace.json.gz",
        "is not of the graph run's workload"),
    "mapping missing": (TINY_GRAPH, DATA / "no-such-mapping.json.gz", "no such file or directory (--mapping)"),
    "mapping not a trace": (TINY_GRAPH, DATA / "wild" / "tracelens__sglang_decode__capture_traces__"
                            "execution_details.json",
                            "execution_details.json"),
    "mapping not graph-off": (TINY_GRAPH, BUNDLES / "tiny-fused-graph-stack" / "trace.json.gz",
                              "is not graph-off: 192 of its 192 kernels were replayed from a CUDA graph"),
    "run without graph kernels": (BUNDLES / "tiny-full-pool-cast-eager-stack" / "trace.json.gz",
                                  BUNDLES / "tiny-full-pool-cast-eager-nostack" / "trace.json.gz",
                                  "has no kernels replayed from a CUDA graph"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_mapping_that_cannot_attribute_is_refused(case, tmp_path):
    graph, mapping, expected = REFUSED[case]
    db = tmp_path / "used.duckdb"
    assert run_cli("ingest", "import", str(BUNDLES / "tiny-fused-eager-stack"), "--db", str(db)).returncode == 0
    before = file_digest(db)
    result = run_cli("ingest", "import", str(graph), "--db", str(db), "--mapping", str(mapping))
    assert result.returncode == 2, (case, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], (case, lines)
    named = graph if case == "run without graph kernels" else mapping
    assert named.name in lines[0] and result.stdout == ""
    assert file_digest(db) == before


def test_bundles_of_version_1_are_read_without_mapping_and_a_bad_mapping_list_is_refused(tmp_path):
    assert read_bundle(BUNDLES / "tiny-fused-graph-stack").mapping_traces == []  # version 1
    bundle = tmp_path / "b"
    bundle.mkdir()
    for f in PAIR.iterdir():
        if f.name != "capture_phase.py":
            (bundle / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps({**manifest, "mapping_traces": ["a.json.gz", "b.json.gz"]}))
    with pytest.raises(BundleError, match="'mapping_traces' names 2 trace"):
        read_bundle(bundle)


def test_the_reference_engine_asks_for_the_mapping_and_refuses_it_without_graphs():
    """The pair job itself runs on a GPU only (DecodeWorkload captures CUDA graphs on cuda
    alone); here: the spec field, the bench flag, and the refusals."""
    from ingest.runs.engines.reference import build_bench_argv
    from ingest.runs.errors import SpecError
    from ingest.runs.spec import parse_spec

    spec = parse_spec({"engine": "reference", "device": "cuda",
                       "workload": {"preset": "glm5", "cuda_graph": True, "graph_mapping": True}})
    argv = build_bench_argv("python", spec, "/tmp/out", sha=None, repo="stepwatch")
    assert "--cuda-graph" in argv and "--graph-mapping" in argv
    with pytest.raises(SpecError, match="graph_mapping.*needs cuda_graph true"):
        parse_spec({"engine": "reference", "workload": {"preset": "tiny", "graph_mapping": True}})
    bench = run_cli("kernels.bench", "--preset", "tiny", "--kv", "fused", "--device", "cpu", "--graph-mapping",
                    "--out", "/tmp/never-made")
    assert bench.returncode == 2 and "--graph-mapping: needs --cuda-graph" in bench.stderr


@pytest.mark.slow  # an AppTest page
def test_the_run_page_shows_the_attribution_and_how_many_stayed_unmatched(tmp_path, open_page):
    db = tmp_path / "page.duckdb"
    result = run_cli("ingest", "import", str(PAIR), "--db", str(db))
    assert result.returncode == 0, result.stderr
    at = open_page(db, "run", run=result.stdout.strip())
    assert not at.exception
    commit = read_bundle(PAIR).commit
    info = [i.value for i in at.info]
    assert any("1,638 of 1,638 were given the op, line and layer of their twin in a mapping trace" in v
               and "100.0 % of their time" in v and "0 stayed unmatched" in v
               and f"`{workload_line(commit, '_run_layer')}`" in v for v in info), info
    table = at.dataframe[0]
    order = list(table.proto.column_order)
    assert order[order.index("share") + 1:order.index("share") + 4] == ["graph_op", "graph_source", "graph_layers"]
    cast = table.value.iloc[0]
    assert (cast.launcher, cast.graph_op, cast.graph_source, cast.graph_layers) == (
        "cudaGraphLaunch", "aten::copy_", workload_line(commit, "_fetch_kv"), "0-77")
    at.text_input[0].input("_fetch_kv").run()  # the filter finds the attributed line too
    assert len(at.dataframe[0].value) == 2
