"""Traces captured on the lent H200s in the shapes users bring (tests/data/h200/README.md): a TP=2
decode run over NCCL with per-rank files named as SGLang's server names them, and a CUDA-graph
decode profiled as SGLang 0.5.23's one-batch benchmark profiles it (step[DECODE bs=N] spans
around the graph replay). Each is checked against torch's own key_averages() of the same profile."""

import contextlib
import io
import json

import pytest

from ingest.cli import main
from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA, assert_matches_torch, torch_kernel_rows

H200 = DATA / "h200"
RULES = load_rule_chain()
GRAPH = H200 / "sglang-graph-decode"
GRAPH_TRACE = GRAPH / "stepwatch_batch1_input2048_output2_decode.trace.json.gz"


def test_graph_mode_sglang_step_is_its_gpu_time():
    f = analyse_trace(read_trace(GRAPH_TRACE), RULES)
    assert_matches_torch(f.kernel_stats, torch_kernel_rows(GRAPH / "key_averages.json", GRAPH_TRACE))
    assert (f.step_method, f.steps) == ("span", 2)
    # torch's own key_averages gives the span's GPU copy (gpu_user_annotation) its device time:
    # the two steps' GPU time; the host span only launched the replay
    span = next(r for r in json.loads((GRAPH / "key_averages.json").read_text())
                if r["name"] == "step[DECODE bs=1]" and r["self_device_time_total_us"] > 0)
    assert f.step_table["wall_us"].sum() == pytest.approx(span["self_device_time_total_us"], rel=1e-3)
    assert 74.0 < f.step_ms_median < 77.0
    assert 0.95 < f.gpu_busy_share <= 1.0
    # the prepare (positions += 1) and sample (logits, argmax) kernels run outside the span: kept
    assert f.between_steps_kernels == 6
    cast = f.kernel_stats.to_dicts()[0]
    assert (cast["category"], cast["calls_per_step"], cast["launcher"]) == ("cast", 78.0, "cudaGraphLaunch")
    assert cast["ms_per_step"] / f.step_ms_median > 0.85  # the seeds' story, under CUDA graphs


@pytest.fixture(scope="module")
def tp2_report(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("tp2") / "tp2.duckdb")
    out = {}
    for name in ("tp2", "tp2-straggler"):
        assert main(["import", str(H200 / name), "--db", db]) == 0
        out[name] = db
    return out


def _report(db, run_id, *extra):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["report", str(run_id), "--db", db, "--json", *extra]) == 0
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("rank", [0, 1])
def test_tp2_each_rank_matches_torch(rank):
    trace = H200 / "tp2" / f"stepwatch-tp2-TP-{rank}-DECODE.trace.json.gz"
    f = analyse_trace(read_trace(trace), RULES)
    assert f.rank == rank  # from distributedInfo, not the GPU index
    assert_matches_torch(f.kernel_stats, torch_kernel_rows(H200 / "tp2" / f"key_averages-TP-{rank}.json", trace))
    assert (f.step_method, f.steps) == ("span", 3)


def test_tp2_run_shows_per_rank_figures_and_the_rank_the_other_waits_for(tp2_report):
    report = _report(tp2_report["tp2"], 1)
    assert report["run"]["ranks"] == 2
    ranks = {r["rank"]: r for r in report["per_rank"]}
    assert set(ranks) == {0, 1} and all(r["collectives"] == 48 for r in ranks.values())  # 16 layers x 3 steps
    # rank 1 reaches the all-reduces last; rank 0 spends most of its GPU time waiting in them
    assert ranks[1]["last_arrivals"] >= 30
    assert ranks[0]["comm_ms_median"] > 0.5 * ranks[0]["busy_ms_median"]
    assert ranks[1]["comm_ms_median"] < 0.2 * ranks[1]["busy_ms_median"]
    assert ranks[0]["wait_ms_median"] > 0.9 * ranks[0]["comm_ms_median"] and ranks[1]["wait_ms_median"] < 0.05
    # two ranks: rank 0's every wait is for rank 1, so the note's figure is rank 0's median wait
    assert (f"rank 1 keeps the other ranks waiting longest: each waits {ranks[0]['wait_ms_median']:.3f} ms per step "
            f"for it (median over steps), in the {ranks[1]['last_arrivals']} of 48 collectives it reached last"
            in report["notes"])
    assert any("not named *.trace.json" in n for n in report["notes"])  # capture.json etc. beside them
    rank1 = _report(tp2_report["tp2"], 1, "--rank", "1")
    assert rank1["run"]["rank"] == 1 and len(rank1["kernels"]) == 7  # all-reduce, 4 GEMM kernels, norm, silu


def test_tp2_with_an_injected_straggler(tp2_report):
    report = _report(tp2_report["tp2-straggler"], 2)
    ranks = {r["rank"]: r for r in report["per_rank"]}
    # ~100 us of extra work per layer on rank 1, 16 layers: rank 0 waits well over a millisecond a step
    assert ranks[1]["last_arrivals"] >= 30 and ranks[0]["wait_ms_median"] > 1.6


def test_single_file_of_rank_1_shows_its_kernels(tmp_path, capsys):
    db = str(tmp_path / "one.duckdb")
    assert main(["import", str(H200 / "tp2" / "stepwatch-tp2-TP-1-DECODE.trace.json.gz"), "--db", db]) == 0
    capsys.readouterr()
    report = _report(db, 1)
    assert report["run"]["rank"] == 1 and report["run"]["ranks"] == 1
    assert {c["category"] for c in report["categories"]} >= {"communication", "gemm"}
    assert report["per_rank"] == []
