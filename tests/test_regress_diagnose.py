"""Explanation and diagnosis on real H200 captures of the reference workload's glm5 preset (78
layers, 495,000-token FP8 KV pool, batch 1): the eager full-pool-cast and fused runs in
app/sample_data (record_shapes, so bytes per call are known) and the CUDA-graph pair in
tests/data/bundles (no op shapes under graph replay, so no bytes). Expected figures are
computed from the imported rows, not copied from a run."""

from __future__ import annotations

import dataclasses
import json
import math

import pandas as pd
import pytest
from helpers import DATA, ROOT

from ingest.regress import RegressError
from ingest.regress.diagnose import (
    MAX_SHORT_NAME_CHARS,
    RunFacts,
    diagnose_change,
    diagnose_kernel,
    diagnose_patch,
    diagnose_run,
    facts_from_record,
    format_markdown,
    list_known_tensors,
    shorten_kernel_name,
)
from ingest.regress.explain import KERNEL_COLUMNS, explain_change
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import

SAMPLES = ROOT / "app" / "sample_data"
CAST = "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"


def _load(path) -> RunFacts:
    """The run's facts with its kernel rows as a DataFrame (as the pages and change tracking read
    them from the database); test_an_import_s_table_and_its_frame_give_the_same_findings checks
    that the import's own table gives the same findings."""
    facts = facts_from_record(prepare_import(path, load_rule_chain(), ImportOptions()))
    return dataclasses.replace(facts, kernels=facts.kernels.to_pandas())


def test_an_import_s_table_and_its_frame_give_the_same_findings():
    record = prepare_import(SAMPLES / "3cf1671-glm5-full-pool-cast-eager", load_rule_chain(), ImportOptions())
    table = facts_from_record(record)
    assert hasattr(table.kernels, "to_dicts")  # the import's columnar table: no pandas on the import's path
    frame = dataclasses.replace(table, kernels=table.kernels.to_pandas())
    findings = diagnose_run(table)
    assert findings == diagnose_run(frame) and [f.kind for f in findings][:2] == ["summary", "per_layer"]
    assert record.diagnosis == [dataclasses.asdict(f) for f in findings]


@pytest.fixture(scope="module")
def full_eager() -> RunFacts:
    return _load(SAMPLES / "3cf1671-glm5-full-pool-cast-eager")


@pytest.fixture(scope="module")
def fused_eager() -> RunFacts:
    return _load(SAMPLES / "3cf1671-glm5-fused-eager")


@pytest.fixture(scope="module")
def full_graph() -> RunFacts:
    return _load(DATA / "bundles" / "glm5-full-pool-cast-graph")


@pytest.fixture(scope="module")
def fused_graph() -> RunFacts:
    return _load(DATA / "bundles" / "glm5-fused-graph")


def _cast_row(facts: RunFacts) -> pd.Series:
    rows = facts.kernels[facts.kernels["name"].map(shorten_kernel_name) == CAST]
    assert len(rows) == 1
    return rows.iloc[0]


def _by_kind(findings, kind):
    return [f for f in findings if f.kind == kind]


# ---------------------------------------------------------------------------------------------
# facts


def test_facts_use_the_clean_timing_and_one_rank(full_eager, fused_eager):
    assert full_eager.step_ms == pytest.approx(75.06, abs=0.01)  # manifest timing median, not the profiled steps
    assert fused_eager.step_ms == pytest.approx(27.91, abs=0.01)
    assert (full_eager.layers, full_eager.batch_size, full_eager.peak_gbps) == (78, 1, 4800.0)
    assert full_eager.device_name == "NVIDIA H200"
    assert full_eager.workload["pool_tokens"] == 495_000 and full_eager.workload["kv_dim"] == 576
    assert full_eager.kernels["rank"].nunique() == 1


def test_shorten_kernel_name():
    assert shorten_kernel_name(_long_cast_name()) == CAST
    assert shorten_kernel_name("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    assert shorten_kernel_name("void at::native::vectorized_gather_kernel<16, long>(char*, char*)") == \
        "vectorized_gather_kernel"
    assert shorten_kernel_name("_gather_cast_kernel") == "_gather_cast_kernel"
    # torch's RMS norm on the H200 (tests/data/h200/glm5-graph-pair): a namespace in parentheses
    assert shorten_kernel_name("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, "
                               "float, true>(int, float, c10::BFloat16 const*)") == \
        "vectorized_layer_norm_kernel<BFloat16>"
    # cuBLAS's float32 gemv on the H200 (tests/data/h200/fp32-logits): a return type first, a kernel named `kernel`
    assert shorten_kernel_name("std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, "
                               "float, float, false, true, false, false, 9, false, cublasGemvParamsEx<int, "
                               "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
                               "const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx<int, "
                               "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float "
                               "const>, cublasGemvTensorStridedBatched<float>, float>)") == "gemvx::kernel"


def _long_cast_name() -> str:
    return ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
            "::{lambda()#3}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4>(int)")


# ---------------------------------------------------------------------------------------------
# diagnosis of one run


def test_eager_full_pool_cast_run_names_the_per_layer_cast_its_bytes_bandwidth_and_the_rate_without_it(full_eager):
    findings = diagnose_run(full_eager)
    cast = _cast_row(full_eager)
    about_cast = [f for f in findings if f.kernel == cast["name"]]
    assert about_cast and findings[0].kernel == cast["name"]  # the largest kernel comes first
    assert {f.kind for f in about_cast} == {"summary", "per_layer", "bandwidth", "kv_pool", "static_cast",
                                            "without_kernel"}

    [summary] = _by_kind(about_cast, "summary")
    # one basis: the share the kernel table prints (of all kernel time), the ms of the profiled step
    assert summary.numbers["share_of_kernel_time"] == pytest.approx(cast["share"])
    assert summary.numbers["profiled_step_ms"] == full_eager.profiled_step_ms > full_eager.step_ms
    assert f"{100 * cast['share']:.1f} % of all kernel time" in summary.text
    assert f"of each {full_eager.profiled_step_ms:.1f} ms profiled step" in summary.text
    assert "`kernels/workload.py(194): _fetch_kv`" in summary.text and "(aten::copy_)" in summary.text

    [per_layer] = _by_kind(about_cast, "per_layer")
    assert per_layer.numbers == {"calls_per_step": 78.0, "layers": 78, "times_per_layer": 1}
    assert "once per layer" in per_layer.text

    [bandwidth] = _by_kind(about_cast, "bandwidth")
    assert bandwidth.numbers["bytes_per_call"] == 855_360_000 == 495_000 * 576 * (1 + 2)
    assert bandwidth.numbers["gbps"] == pytest.approx(cast["gbps"])
    assert bandwidth.numbers["peak_fraction"] == pytest.approx(cast["gbps"] / 4800)
    assert 0.15 < bandwidth.numbers["peak_fraction"] < 0.30  # ~1 TB/s of the H200's 4.8 TB/s
    assert "855 MB per call" in bandwidth.text
    assert f"{100 * cast['gbps'] / 4800:.1f} % of the NVIDIA H200's 4,800 GB/s peak" in bandwidth.text

    [pool] = _by_kind(about_cast, "kv_pool")
    assert "the whole 495,000 x 576 FP8 KV pool of a layer, read as FP8 and written as BF16" in pool.text
    assert pool.numbers["tensor_bytes"] == 855_360_000

    [static] = _by_kind(about_cast, "static_cast")
    assert "does not change between steps" in static.text
    assert static.numbers["rows_written_per_step"] == 1 and static.numbers["active_rows"] == 2049
    assert static.numbers["needed_bytes_per_call"] == 2049 * 576 * 3

    [without] = _by_kind(about_cast, "without_kernel")
    # the timed step less the kernel's part of the profiled step (never timed less profiled ms)
    remaining_ms = full_eager.step_ms * (1 - cast["ms_per_step"] / full_eager.profiled_step_ms)
    assert without.numbers["step_ms_without"] == pytest.approx(remaining_ms)
    assert without.numbers["tok_per_s_without"] == pytest.approx(1 * 1000 / remaining_ms)
    assert 100 < without.numbers["tok_per_s_without"] < 160
    assert f"{1000 / remaining_ms:,.0f} tok/s instead of 13.3" in without.text


def test_weight_matrices_are_recognised(full_eager):
    by_bytes = {row["bytes_per_call"]: row.to_dict() for _, row in full_eager.kernels.iterrows()
                if row["category"] == "gemm" and row["bytes_per_call"] > 1e6}
    gate_up = _by_kind(diagnose_kernel(by_bytes[33_558_528], full_eager), "weight_matrix")
    assert len(gate_up) == 1
    assert "2,048 x 8,192 BF16 weight matrix (o projection or gate_up projection)" in gate_up[0].text
    qkv = _by_kind(diagnose_kernel(by_bytes[40_112_128], full_eager), "weight_matrix")
    assert len(qkv) == 1 and "9,792 x 2,048 BF16 weight matrix (q + latent KV projection)" in qkv[0].text


def test_known_tensors_of_a_workload():
    tensors = {t.nbytes: t.text for t in list_known_tensors({"pool_tokens": 10, "kv_dim": 4, "batch_size": 2,
                                                             "context": 3})}
    assert tensors == {120: "the whole 10 x 4 FP8 KV pool of a layer, read as FP8 and written as BF16",
                       40: "the whole 10 x 4 FP8 KV pool of a layer", 80: "the whole 10 x 4 KV pool of a layer in BF16",
                       96: "the batch's 8 KV rows of 4 dims, read as FP8 and written as BF16"}
    assert list_known_tensors(None) == [] and list_known_tensors({"preset": "x"}) == []


def test_graph_run_has_no_bytes_but_still_calls_per_layer(full_graph):
    findings = diagnose_run(full_graph)
    cast = _cast_row(full_graph)
    kinds = [f.kind for f in findings if f.kernel == cast["name"]]
    assert kinds == ["summary", "per_layer", "no_bytes", "without_kernel"]


def test_times_per_layer_and_the_largest_kernels_only(fused_graph):
    findings = diagnose_run(fused_graph)
    per_layer = {f.kernel: f for f in _by_kind(findings, "per_layer")}
    top = fused_graph.kernels.sort_values("ms_per_step", ascending=False).iloc[0]
    assert top["calls_per_step"] == 156
    assert "twice per layer" in per_layer[top["name"]].text
    summaries = _by_kind(findings, "summary")
    assert 1 <= len(summaries) <= 3
    assert all(f.numbers["ms_per_step"] >= 0.10 * f.numbers["profiled_step_ms"] for f in summaries)


def test_three_times_per_layer_and_not_a_multiple():
    kernels = pd.DataFrame({"name": ["a", "b"], "category": ["gemm", "gemm"], "launcher": ["aten::mm"] * 2,
                            "source": ["", ""], "calls_per_step": [234.0, 100.0], "ms_per_step": [5.0, 4.0],
                            "bytes_per_call": [math.nan, math.nan]})
    facts = RunFacts(step_ms=10.0, kernels=kernels, batch_size=4, layers=78)
    per_layer = {f.kernel: f.text for f in diagnose_run(facts) if f.kind == "per_layer"}
    assert per_layer == {"a": "It runs 234 times per step: 3 times per layer (78 layers)."}
    [without_a, without_b] = [f for f in diagnose_run(facts) if f.kind == "without_kernel"]
    assert without_a.numbers["tok_per_s_without"] == pytest.approx(4 * 1000 / 5.0)


def test_bad_facts_are_refused(full_eager):
    with pytest.raises(RegressError, match="step_ms"):
        diagnose_run(RunFacts(step_ms=0.0, kernels=full_eager.kernels))
    with pytest.raises(RegressError, match="ms_per_step"):
        diagnose_run(RunFacts(step_ms=1.0, kernels=full_eager.kernels.drop(columns=["ms_per_step"])))
    two_ranks = pd.concat([full_eager.kernels, full_eager.kernels.assign(rank=1)])
    with pytest.raises(RegressError, match="2 ranks"):
        diagnose_run(RunFacts(step_ms=1.0, kernels=two_ranks))


# ---------------------------------------------------------------------------------------------
# explanation of a change


def test_explain_puts_the_cast_first_with_its_share_of_the_change(fused_eager, full_eager):
    before_copy = fused_eager.kernels.copy()
    e = explain_change(fused_eager.kernels, full_eager.kernels, fused_eager.step_ms, full_eager.step_ms)
    pd.testing.assert_frame_equal(fused_eager.kernels, before_copy)  # inputs untouched
    assert list(e.kernels.columns) == KERNEL_COLUMNS
    first = e.kernels.iloc[0]
    cast = _cast_row(full_eager)
    assert shorten_kernel_name(first["name"]) == CAST and first["status"] == "added"
    assert (first["calls_per_step_before"], first["calls_per_step_after"], first["delta_calls_per_step"]) == (0, 78, 78)
    assert first["delta_ms_per_step"] == pytest.approx(cast["ms_per_step"])
    step_change_ms = full_eager.step_ms - fused_eager.step_ms
    assert first["fraction_of_change"] == pytest.approx(cast["ms_per_step"] / step_change_ms)
    assert first["bytes_per_call_after"] == 855_360_000 and math.isnan(first["bytes_per_call_before"])
    assert list(e.kernels["delta_ms_per_step"].abs()) == sorted(e.kernels["delta_ms_per_step"].abs(), reverse=True)
    statuses = dict(zip(e.kernels["name"].map(shorten_kernel_name), e.kernels["status"]))
    assert statuses["_gather_cast_kernel"] == "removed"
    assert e.categories.iloc[0]["category"] == "cast"
    assert e.categories["delta_ms_per_step"].sum() == pytest.approx(e.kernel_delta_ms)
    assert e.unexplained_ms == pytest.approx(e.delta_step_ms - e.kernel_delta_ms)


def _table(rows):
    cols = ["name", "category", "launcher", "source", "calls_per_step", "ms_per_step", "bytes_per_call"]
    return pd.DataFrame(rows, columns=cols)


def test_explain_on_small_tables():
    before = _table([("k1", "gemm", "aten::mm", "a.py(1): f", 10, 2.0, 100.0),
                     ("k2", "cast", "aten::copy_", "a.py(2): g", 5, 1.0, math.nan)])
    after = _table([("k1", "gemm", "aten::mm", "a.py(1): f", 10, 2.5, 100.0),
                    ("k3", "cast", "cuLaunchKernel", "", 5, 0.1, math.nan)])
    e = explain_change(before, after, 10.0, 9.6)
    rows = {r["name"]: r for _, r in e.kernels.iterrows()}
    assert {n: r["status"] for n, r in rows.items()} == {"k1": "changed", "k2": "removed", "k3": "added"}
    assert rows["k2"]["delta_ms_per_step"] == -1.0 and rows["k2"]["fraction_of_change"] == pytest.approx(-1.0 / -0.4)
    assert list(e.kernels["name"]) == ["k2", "k1", "k3"]
    cats = {r["category"]: r for _, r in e.categories.iterrows()}
    assert cats["cast"]["delta_ms_per_step"] == pytest.approx(-0.9) and cats["gemm"]["delta_ms_per_step"] == 0.5
    # no step-time change: fractions are undefined, not infinite
    assert explain_change(before, after, 10.0, 10.0).kernels["fraction_of_change"].isna().all()


def test_explain_by_name_only_matches_across_launchers():
    eager = _table([("k", "gemm", "aten::mm", "a.py(1): f", 10, 2.0, 100.0),
                    ("k", "gemm", "aten::addmm", "a.py(3): h", 10, 1.0, 300.0)])
    graph = _table([("k", "gemm", "cudaGraphLaunch", "a.py(9): run", 20, 2.7, math.nan)])
    e = explain_change(eager, graph, 5.0, 4.0, key=("name",))
    [row] = e.kernels.to_dict("records")
    assert (row["calls_per_step_before"], row["ms_per_step_before"], row["bytes_per_call_before"]) == (20, 3.0, 200.0)
    assert row["status"] == "changed" and row["delta_ms_per_step"] == pytest.approx(-0.3)


def test_explain_refuses_bad_tables():
    t = _table([("k", "gemm", "aten::mm", "", 1, 1.0, 1.0)])
    with pytest.raises(RegressError, match="before kernels: missing column"):
        explain_change(t.drop(columns=["launcher"]), t, 1.0, 1.0)
    with pytest.raises(RegressError, match="2 ranks"):
        explain_change(t, pd.concat([t.assign(rank=0), t.assign(rank=1)]), 1.0, 1.0)
    with pytest.raises(RegressError, match="step_ms_after"):
        explain_change(t, t, 1.0, math.nan)


# ---------------------------------------------------------------------------------------------
# diagnosis of a change and of a patch


def test_change_names_the_commit_the_kernel_its_calls_bytes_bandwidth_and_source(fused_eager, full_eager):
    findings = diagnose_change(fused_eager, full_eager, commit="3cf16716eab78d4cd9ea520cb840b647b37f02c8")
    head = findings[0]
    drop = 1 - full_eager.tok_per_s / fused_eager.tok_per_s
    assert head.kind == "change" and head.numbers["direction"] == "regression"
    assert head.text.startswith(f"tok/s fell {100 * drop:.1f} % at commit 3cf1671")
    [kernel] = _by_kind(findings, "change_kernel")
    assert kernel.kernel == _cast_row(full_eager)["name"]
    assert "went from 0 to 78 calls per step there (once per layer)" in kernel.text
    peak_pct = 100 * _cast_row(full_eager)["gbps"] / 4800
    assert (f"it moves 855 MB per call at {peak_pct:.1f} % of peak bandwidth, "
            "from `kernels/workload.py(194): _fetch_kv`") in kernel.text
    assert _by_kind(findings, "kv_pool") and _by_kind(findings, "static_cast")
    # the fused eager run is CPU-bound: the kernels changed more than the step, and the sentence
    # says so instead of a share of the change over 100 %
    assert "more than the whole change (1.4x it: other time moved the other way)" in kernel.text
    assert kernel.numbers["fraction_of_change"] == pytest.approx(1.44, abs=0.01)
    [unexplained] = _by_kind(findings, "unexplained")
    assert unexplained.numbers["kernel_delta_ms"] > unexplained.numbers["delta_step_ms"]


def test_change_in_the_other_direction_is_an_improvement(full_graph, fused_graph):
    findings = diagnose_change(full_graph, fused_graph)
    assert findings[0].numbers["direction"] == "improvement" and "tok/s rose" in findings[0].text
    [kernel] = _by_kind(findings, "change_kernel")
    assert "went from 78 to 0 calls per step" in kernel.text


def test_patch_pair_says_what_the_patch_changes_and_that_it_helps(full_eager, fused_eager):
    findings = diagnose_patch(full_eager, fused_eager)
    head = findings[0]
    assert head.kind == "patch" and head.numbers["helps"] is True
    assert head.numbers["speedup"] == pytest.approx(full_eager.step_ms / fused_eager.step_ms - 1)
    assert "(fused against full-pool-cast)" in head.text and "still helps" in head.text
    texts = [f.text for f in findings[1:]]
    assert any(t.startswith(f"It removes the cast kernel `{CAST}` (aten::copy_): 78 calls") for t in texts)
    assert any(t.startswith("It adds the cast kernel `_gather_cast_kernel`: 78 calls") for t in texts)


def test_patch_that_no_longer_helps(full_graph):
    same = diagnose_patch(full_graph, full_graph)
    assert same[0].numbers["helps"] is False and "no longer helps" in same[0].text
    slower = dataclasses.replace(full_graph, step_ms=full_graph.step_ms * 1.1, tok_per_s=None)
    worse = diagnose_patch(full_graph, slower)
    assert worse[0].numbers["helps"] is False and "slower" in worse[0].text


def test_markdown_has_one_bullet_per_finding(full_eager):
    findings = diagnose_run(full_eager)
    lines = format_markdown(findings).splitlines()
    assert len(lines) == len(findings) and all(line.startswith("- ") for line in lines)


def test_findings_are_plain_values_that_serialise(full_eager, fused_eager):
    findings = (diagnose_run(full_eager) + diagnose_change(fused_eager, full_eager)
                + diagnose_patch(full_eager, fused_eager))
    for f in findings:
        assert all(type(v) in (int, float, str, bool) for v in f.numbers.values()), f
        json.loads(json.dumps(dataclasses.asdict(f)))


# -- #34 item 4: what the run's diagnosis says about traces from elsewhere ---------------------------

def _wild_findings(name: str):
    from ingest.traces.categories import load_rule_chain
    from ingest.traces.importer import ImportOptions, prepare_import
    from tests.helpers import DATA

    record = prepare_import(str(DATA / "wild" / name), load_rule_chain(), ImportOptions())
    return diagnose_run(facts_from_record(record))


def test_a_step_whose_gpu_is_nearly_idle_is_said_to_wait_on_the_host():
    """HTA's trace_compare base: 5 kernels of 0.825 ms in a 165 ms step. The headline was 'Memcpy HtoD
    takes 72.4 % of all kernel time' and '165 ms instead of 165 ms (1.0x)'."""
    findings = _wild_findings("hta__trace_compare__base.json.gz")
    assert findings[0].kind == "host_bound"
    assert findings[0].text.startswith("The GPU is busy at most 0.5 % of each 165 ms profiled step: its 5 kernels a "
                                       "step take 0.825 ms, so the step waits on the host")
    (without,) = [f for f in findings if f.kind == "without_kernel"]
    assert without.text == ("If this kernel went away and nothing else changed, a step would be 0.37 % shorter "
                            "(165 ms): it does not set the step's pace.")


def test_a_busy_gpu_gets_no_host_bound_finding_and_a_graph_replay_no_replay_line():
    """TraceLens' SGLang Qwen3-8B decode on an MI300X (HIP graphs): kernels fill 93.5 % of the step. Every
    replayed kernel's source is the replay's own line (cuda_graph_runner.py(1333): replay), which said
    nothing of the kernel; and the Tensile GEMM's 600-character name was printed whole."""
    findings = _wild_findings("tracelens__sglang_decode__sglang_Qwen3-8B_decode.json.gz")
    assert "host_bound" not in [f.kind for f in findings]
    summary = findings[0]
    assert summary.text.startswith("The gemm kernel `Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT256x32x64_MI…` "
                                   "takes 24.7 % of all kernel time")
    assert summary.text.endswith(", replayed from a CUDA graph.") and "cuda_graph_runner" not in summary.text
    assert len(shorten_kernel_name(summary.kernel)) == MAX_SHORT_NAME_CHARS < len(summary.kernel) / 5


def test_a_slow_rate_is_printed_with_its_digits_not_as_zero():
    """#34 item 1: 'It moves 789 kB per call at 0 GB/s' (a rate under 0.5 GB/s rounded to 0)."""
    from ingest.regress.diagnose import _bandwidth_findings

    row = {"name": "k", "category": "memcpy", "launcher": "aten::copy_", "source": "", "calls_per_step": 1.0,
           "ms_per_step": 1.9, "bytes_per_call": 789_000.0, "gbps": 0.415, "peak_fraction": 0.415 / 4800}
    facts = RunFacts(step_ms=10.0, kernels=[row], peak_gbps=4800.0, device_name="NVIDIA H200")
    (finding,) = _bandwidth_findings(row, facts)
    assert finding.text.startswith("It moves 789 kB per call at 0.41 GB/s"), finding.text
