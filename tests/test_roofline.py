"""The roofline: each op's cost model on hand-computed shapes (ingest/traces/costs.py), how an op's
cost goes to its kernels and what bound a row gets (ingest/traces/roofline.py), and the figures
an import stores for real H200 captures, checked against arithmetic written here from the shapes
read straight out of the trace file (json, each kernel joined to its op by `External id`, not
the importer's correlation join)."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from db.store import open_db
from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.costs import model_op_cost, model_shape_cost
from ingest.traces.devices import find_device, find_peak_gbps
from ingest.traces.importer import ImportOptions, prepare_import
from ingest.traces.trace_read import read_trace
from ingest.traces.roofline import LATENCY_FRACTION, resolve_units, spread_op_costs, summarise_roofline
from tests.helpers import DATA

BF, F32, F8, I32 = "c10::BFloat16", "float", "c10::Float8_e4m3fn", "int"
H200_BF16_TFLOPS, H200_FP32_TFLOPS, H200_TBPS = 989.4, 66.9, 4.8  # NVIDIA's datasheet (devices.toml)


def cost(op, dims, types, concrete=None):
    c = model_op_cost(op, dims, types, concrete)
    return c.flops, c.bytes, c.kind, c.unit


# -- (a) each cost model, on shapes worked out by hand ---------------------------------------------
@pytest.mark.parametrize("op, dims, types, concrete, expected", [
    # GEMMs: 2*M*N*K; inputs read, the output written in the first input's dtype
    ("aten::mm", [[64, 128], [128, 256]], [BF, BF], None,
     (2 * 64 * 256 * 128, (8192 + 32768 + 16384) * 2, "gemm", "bf16")),
    ("aten::bmm", [[2, 4, 8], [2, 8, 16]], [F32, F32], None,
     (2 * 2 * 4 * 16 * 8, (64 + 256 + 128) * 4, "gemm", "fp32")),
    ("aten::addmm", [[16], [4, 8], [8, 16], [], []], [BF, BF, BF, "Scalar", "Scalar"], None,
     (2 * 4 * 16 * 8, (16 + 32 + 128 + 64) * 2, "gemm", "bf16")),
    ("aten::baddbmm", [[2, 4, 16], [2, 4, 8], [2, 8, 16], [], []], [BF, BF, BF, "Scalar", "Scalar"], None,
     (2 * 2 * 4 * 16 * 8, (128 + 64 + 256 + 128) * 2, "gemm", "bf16")),
    ("aten::linear", [[2, 3, 8], [16, 8], [16]], [BF, BF, BF], None,
     (2 * 6 * 16 * 8, (48 + 128 + 16 + 96) * 2, "gemm", "bf16")),
    ("aten::matmul", [[5, 4, 8], [8, 16]], [BF, BF], None, (2 * 20 * 16 * 8, (160 + 128 + 320) * 2, "gemm", "bf16")),
    ("aten::matmul", [[3, 1, 4, 8], [2, 8, 6]], [BF, BF], None,
     (2 * 6 * 4 * 6 * 8, (96 + 96 + 144) * 2, "gemm", "bf16")),
    ("aten::matmul", [[8], [8, 6]], [F32, F32], None, (2 * 6 * 8, (8 + 48 + 6) * 4, "gemm", "fp32")),
    # FP8 GEMM: scales read; out dtype from Concrete Inputs (6 = float), '' = the inputs' (FP8), BF16 unrecorded
    ("aten::_scaled_mm", [[16, 32], [32, 64], [], []], [F8, F8, F32, F32], None,
     (2 * 16 * 64 * 32, 512 + 2048 + 8 + 1024 * 2, "gemm", "fp8")),
    ("aten::_scaled_mm", [[16, 32], [32, 64], [], [], [], [], [], []], [F8, F8, F32, F32, "", "", "Scalar", "Scalar"],
     ["", "", "", "", "", "", "6", "False"], (2 * 16 * 64 * 32, 512 + 2048 + 8 + 1024 * 4, "gemm", "fp8")),
    ("aten::_scaled_mm", [[16, 32], [32, 64], [], [], [], [], [], []], [F8, F8, F32, F32, "", "", "", "Scalar"],
     ["", "", "", "", "", "", "", "False"], (2 * 16 * 64 * 32, 512 + 2048 + 8 + 1024, "gemm", "fp8")),
    # grouped GEMM and fused MoE (T=4 tokens, H=16, I=32, E=8 experts, k=2: min(E, T*k) = 8 experts read)
    ("aten::_grouped_mm", [[10, 8], [4, 8, 16], [4]], [BF, BF, I32], None,
     (2 * 10 * 8 * 16, (80 + 512) * 2 + 16 + 160 * 2, "gemm", "bf16")),
    ("sglang::inplace_fused_experts", [[4, 16], [8, 64, 16], [8, 16, 32], [4, 2], [4, 2]], [BF, F8, F8, F32, I32],
     None, (2 * 4 * 2 * 16 * 64 + 2 * 4 * 2 * 32 * 16, 2 * 128 + 8 * (1024 + 512) + 32 + 32, "moe", "fp8")),
    # attention: 2*B*H*pairs*(D + Dv); causal S x S keeps S(S+1)/2 pairs; one query (decode) sees every key
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 128, 64]] * 3 + [[]] * 4, [BF] * 3 + ["Scalar"] * 4,
     ["", "", "", "0.", "True", "False", "0.125"],
     (2 * 2 * 4 * (128 * 129 / 2) * 128, 4 * 65536 * 2, "attention", "bf16")),
    ("aten::_flash_attention_forward", [[1, 1, 8, 64], [1, 300, 8, 64], [1, 300, 8, 64]], [BF] * 3, None,
     (2 * 8 * 300 * 128, (512 + 2 * 153600 + 512) * 2, "attention", "bf16")),
    ("aten::_scaled_dot_product_efficient_attention", [[1, 2, 16, 32], [1, 2, 24, 32], [1, 2, 24, 16], [], [], [], []],
     [BF] * 3 + ["", "Scalar", "Scalar", "Scalar"], ["", "", "", "", "False", "0.", "False"],
     (2 * 2 * 16 * 24 * 48, (1024 + 1536 + 768 + 512) * 2, "attention", "bf16")),
    # elementwise (1 FLOP an output element; broadcast; in place reads and writes self), softmax, norms
    ("aten::add", [[4, 8], [8], []], [BF, BF, "Scalar"], None, (32, (32 + 8 + 32) * 2, "elementwise", "vector")),
    ("aten::add_", [[4, 8], [4, 8], []], [BF, BF, "Scalar"], None, (32, 96 * 2, "elementwise", "vector")),
    ("aten::silu", [[10]], [F32], None, (10, 80, "elementwise", "vector")),
    ("aten::_softmax", [[2, 10], [], []], [BF, "Scalar", "Scalar"], None, (5 * 20, 80, "softmax", "vector")),
    ("aten::_fused_rms_norm", [[3, 8], [], [8], []], [BF, "ScalarList", BF, "Scalar"], None,
     (4 * 24, 2 * 48 + 16 + 4 * 3, "norm", "vector")),
    ("aten::native_layer_norm", [[3, 8], [], [8], [8], []], [BF, "ScalarList", BF, BF, "Scalar"], None,
     (7 * 24, 2 * 48 + 32 + 2 * 4 * 3, "norm", "vector")),
    # casts and copies: no FLOPs; the source read, the destination written
    ("aten::copy_", [[10, 4], [10, 4], []], [BF, F8, "Scalar"], None, (0, 80 + 40, "cast", "")),
    ("aten::copy_", [[10, 4], [10, 4], []], [BF, BF, "Scalar"], None, (0, 160, "copy", "")),
    ("aten::_to_copy", [[10, 4], [], [], [], [], [], []], [F8, "Scalar", "", "", "", "Scalar", ""],
     ["", "15", "", "", "", "False", ""], (0, 40 + 80, "cast", "")),
    ("aten::clone", [[10, 4], []], [BF, "Scalar"], None, (0, 160, "copy", "")),
    ("_c10d_functional::all_reduce", [[1024], [], []], [BF, "", ""], None, (0, 2 * 2048, "communication", "")),
])
def test_each_cost_model_gives_the_hand_computed_flops_and_bytes(op, dims, types, concrete, expected):
    assert cost(op, dims, types, concrete) == expected


@pytest.mark.parametrize("op, dims, types, concrete, known_bytes", [
    ("aten::index", [[4096, 576], []], [BF, ""], None, False),  # touches part of its input: not modelled
    ("aten::my_op", [[4, 4]], [BF], None, False),
    ("aten::mm", [[2, 3], [4, 5]], [BF, BF], None, False),  # shapes no mm can have
    ("aten::mm", [[2, 3], [3, 5]], ["Scalar", BF], None, False),
    ("aten::_to_copy", [[10, 4], [], [], [], [], [], []], [F8, "Scalar", "", "", "", "Scalar", ""], None, False),
    # causal prefill attention without Concrete Inputs: which pairs count is unknown, its bytes are not
    ("aten::_flash_attention_forward", [[1, 141, 8, 64]] * 3, [BF] * 3, None, True),
    ("aten::_flash_attention_forward", [[300, 8, 64]] * 3 + [[2], [2]], [BF] * 3 + [I32, I32], None, False),
])
def test_an_op_without_a_model_or_with_shapes_it_cannot_use_is_unknown_never_a_guess(op, dims, types, concrete,
                                                                                     known_bytes):
    c = model_op_cost(op, dims, types, concrete)
    assert math.isnan(c.flops)
    assert math.isnan(c.bytes) != known_bytes


def test_the_profiler_s_json_text_is_parsed_and_bad_text_is_unknown():
    good = model_shape_cost("aten::mm", b"[[1,256],[256,2880]]", b'["c10::BFloat16","c10::BFloat16"]')
    assert (good.flops, good.bytes) == (2 * 256 * 2880, (256 + 256 * 2880 + 2880) * 2)
    for dims, types in ((b"[[1,2", b"[]"), (b"{}", b"[]"), (b"[[-1,4],[4,4]]", b'["float","float"]')):
        assert math.isnan(model_shape_cost("aten::mm", dims, types).flops)


# -- (b) an op's cost over its kernels, and the bound ----------------------------------------------
def test_an_op_s_cost_goes_to_its_kernels_in_proportion_to_their_time():
    """A split-K GEMM (30 us) and its reduction (10 us) share one op's 400 FLOPs 3:1; a kernel
    without an op is unknown; an op whose kernels lasted 0 us splits evenly."""
    op = np.array([7, 7, -1, 9, 9])
    dur = np.array([30.0, 10.0, 5.0, 0.0, 0.0])
    flops, nbytes = spread_op_costs(op, dur, np.array([400.0, 400, np.nan, 8, 8]), np.array([40.0, 40, np.nan, 2, 2]))
    assert flops[:2].tolist() == [300.0, 100.0] and nbytes[:2].tolist() == [30.0, 10.0]
    assert math.isnan(flops[2]) and flops[3:].tolist() == [4.0, 4.0]
    # each kernel then runs at its op's rate: 400 FLOPs in 40 us, whichever kernel is asked
    assert flops[0] / dur[0] == flops[1] / dur[1] == 400 / 40


def _row(flops_per_call, bytes_per_call, us, unit="bf16", kind="gemm", peaks=None, calls=2):
    out = summarise_roofline(np.zeros(calls, np.int64), 1, np.full(calls, us), np.full(calls, float(flops_per_call)),
                             np.full(calls, float(bytes_per_call)), np.array([unit] * calls, dtype=object),
                             np.array([kind] * calls, dtype=object), peaks)
    return out.to_dicts()[0]


H200 = find_device("NVIDIA H200").datasheet


def test_a_row_s_rates_fractions_and_bound_follow_the_stated_rule():
    # 8192^3 BF16 GEMM in 1.5 ms: 733 TFLOP/s, 74 % of 989.4; intensity 2731 FLOP/B: compute-bound
    big = _row(2 * 8192 ** 3, 3 * 8192 ** 2 * 2, 1500.0, peaks=H200)
    assert big["tflops"] == pytest.approx(2 * 8192 ** 3 / 1500e-6 / 1e12)
    assert big["compute_fraction"] == pytest.approx(big["tflops"] / 989.4)
    assert big["intensity"] == pytest.approx(8192 / 3) and big["bound"] == "compute"
    # the whole-pool cast: 857 MB in 840 us, 1.02 TB/s = 21 % of 4.8 TB/s: memory-bound, no FLOPs
    cast = _row(0, 857e6, 840.0, unit="", kind="cast", peaks=H200)
    assert (cast["tflops"], cast["compute_fraction"], cast["intensity"]) == (0, 0, 0)
    assert cast["bandwidth_fraction"] == pytest.approx(857e6 / 840e-6 / 4.8e12) and cast["bound"] == "memory"
    # a decode GEMV at 3 % of bandwidth and ~0 % of compute: under a tenth of both roofs
    small = _row(2 * 256 * 2880, 1.48e6, 10.0, peaks=H200)
    assert max(small["compute_fraction"], small["bandwidth_fraction"]) < LATENCY_FRACTION
    assert small["bound"] == "latency"
    # a collective: its link is not in the table, so no fraction; what bounds it is said
    comm = _row(0, 4096, 2.0, unit="", kind="communication", peaks=H200)
    assert comm["bound"] == "communication" and math.isnan(comm["bandwidth_fraction"]) and comm["tbps"] > 0
    # an unknown device: rates, no fractions, no bound
    blind = _row(2 * 8192 ** 3, 3 * 8192 ** 2 * 2, 1500.0, peaks=None)
    assert blind["tflops"] > 0 and math.isnan(blind["compute_fraction"]) and blind["bound"] is None


def test_a_row_with_a_call_of_unknown_cost_has_no_figures_and_mixed_units_are_weighed_per_call():
    mixed = summarise_roofline(np.zeros(2, np.int64), 1, np.array([10.0, 10.0]), np.array([1e9, np.nan]),
                               np.array([1e6, 1e6]), np.array(["bf16", "bf16"], dtype=object),
                               np.array(["gemm", "gemm"], dtype=object), H200).to_dicts()[0]
    assert math.isnan(mixed["flops_per_call"]) and math.isnan(mixed["tflops"]) and mixed["bound"] is None
    both = summarise_roofline(np.zeros(2, np.int64), 1, np.array([10.0, 10.0]), np.array([1e9, 1e9]),
                              np.array([1e6, 1e6]), np.array(["bf16", "fp32"], dtype=object),
                              np.array(["gemm", "gemm"], dtype=object), H200).to_dicts()[0]
    # each call's time at its own peak, over the row's time
    assert both["compute_fraction"] == pytest.approx((1e9 / 989.4e6 + 1e9 / 66.9e6) / 20)


def test_an_fp32_gemm_counts_against_tf32_only_when_its_kernel_says_so():
    units = resolve_units(np.array(["fp32", "fp32", "bf16"], dtype=object),
                          np.array(["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", "internal::gemvx::kernel<float>", "x"],
                                   dtype=object))
    assert units.tolist() == ["tf32", "fp32", "bf16"]


def test_one_table_gives_datasheet_and_measured_peaks_and_find_peak_gbps_still_answers():
    h200 = find_device("NVIDIA H200")
    assert h200.datasheet == {"hbm_gbps": 4800.0, "bf16_tflops": 989.4, "fp8_tflops": 1978.9, "tf32_tflops": 494.7,
                              "fp32_tflops": 66.9}
    measured = json.loads((Path(__file__).parent.parent / h200.measured["source"]).read_text())["best"]
    assert h200.measured["bf16_tflops"] == round(measured["bf16_tflops"], 1)
    assert h200.measured["hbm_gbps"] == round(measured["copy_tbps"] * 1000, 1)
    # what a card reaches stays under what its datasheet promises
    assert all(h200.measured[k] < v for k, v in h200.datasheet.items())
    assert (find_peak_gbps("NVIDIA H200"), find_peak_gbps("NVIDIA H100 80GB HBM3"), find_peak_gbps("Tesla T4")) == (
        4800.0, 3350.0, None)
    assert find_device("NVIDIA H200 NVL").name == "NVIDIA H200 NVL"
    assert find_device("AMD Instinct MI300X").measured is None


# -- (c) real H200 captures: what the import stored, against the shapes in the file -------------------
def _trace_file(path: Path) -> Path:
    return next(p for p in sorted(path.glob("*.json.gz")) if "key_averages" not in p.name) if path.is_dir() else path


def independent_costs(path: Path) -> dict[tuple[str, str], dict]:
    """Per (kernel name, op name): calls, summed us, summed FLOPs and bytes, worked out here from
    the trace JSON for mm, bmm and copy_ (the op found by `External id`, its cost spread over the
    op's kernels by time), with the formulas written out below."""
    size = {BF: 2, F8: 1, F32: 4}
    events = json.load(gzip.open(_trace_file(path)))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e["args"]}
    kernels = [e for e in events if e.get("cat") == "kernel" and e["args"].get("External id") in ops]
    op_us = defaultdict(float)
    for k in kernels:
        op_us[k["args"]["External id"]] += k["dur"]
    out = defaultdict(lambda: {"calls": 0, "us": 0.0, "flops": 0.0, "bytes": 0.0, "flops_per_call": []})
    for k in kernels:
        op = ops[k["args"]["External id"]]
        dims, types = op["args"]["Input Dims"], op["args"]["Input type"]
        if op["name"] == "aten::mm":
            (m, kk), (_, n) = dims[0], dims[1]
            flops, nbytes = 2 * m * n * kk, (m * kk + kk * n + m * n) * size[types[0]]
        elif op["name"] == "aten::bmm":
            (b, m, kk), (_, _, n) = dims[0], dims[1]
            flops, nbytes = 2 * b * m * n * kk, b * (m * kk + kk * n + m * n) * size[types[0]]
        elif op["name"] == "aten::copy_":
            flops, nbytes = 0, math.prod(dims[0]) * size[types[0]] + math.prod(dims[1]) * size[types[1]]
        else:
            continue
        part = k["dur"] / op_us[k["args"]["External id"]]
        row = out[(k["name"], op["name"])]
        row["calls"] += 1
        row["us"] += k["dur"]
        row["flops"] += flops * part
        row["bytes"] += nbytes * part
        row["flops_per_call"].append(flops * part)
    return dict(out)


@pytest.fixture(scope="module")
def h200_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("roofline") / "roofline.duckdb"
    rules = load_rule_chain()
    with open_db(db) as store:
        for path in H200_CAPTURES:
            store.insert_run(prepare_import(path, rules, ImportOptions()))
    return db


H200_CAPTURES = [DATA / "bundles" / "tiny-full-pool-cast-eager-stack",
                 DATA / "bundles" / "tiny-full-pool-cast-eager-nostack",
                 DATA / "h200" / "fp32-logits", DATA / "bundles" / "tiny-full-pool-cast-graph-stack"]


def stored_rows(db: Path, path: Path) -> dict[tuple[str, str], dict]:
    """The import's kernel rows of one capture, summed over source lines by (name, launcher):
    FLOPs and bytes back from the stored rates (TFLOP/s x time), and the rows as stored."""
    with open_db(db, read_only=True) as store:
        run = store.con.execute("SELECT run_id FROM runs WHERE source_path = ?", [str(path.resolve())]).fetchone()[0]
        rows = store.list_kernels(run, records=True)
    out = defaultdict(lambda: {"calls": 0, "us": 0.0, "flops": 0.0, "bytes": 0.0, "rows": []})
    for r in rows:
        s = out[(r["name"], r["launcher"])]
        s["calls"] += r["calls"]
        s["us"] += r["total_us"]
        s["flops"] += (r["tflops"] or 0) * r["total_us"] * 1e6
        s["bytes"] += (r["tbps"] or 0) * r["total_us"] * 1e6
        s["rows"].append(r)
    return dict(out)


@pytest.mark.parametrize("capture", H200_CAPTURES[:3], ids=lambda p: p.name)
def test_the_top_gemms_and_the_cast_of_h200_captures_agree_with_arithmetic_on_their_shapes(h200_db, capture):
    expected, stored = independent_costs(capture), stored_rows(h200_db, capture)
    gemms = sorted((k for k in expected if k[1] in ("aten::mm", "aten::bmm")), key=lambda k: -expected[k]["us"])[:3]
    casts = [k for k in expected if k[1] == "aten::copy_"]
    assert len(gemms) == 3 and casts
    for key in gemms + casts:
        want, got = expected[key], stored[key]
        assert (got["calls"], got["us"]) == (want["calls"], pytest.approx(want["us"]))
        assert got["flops"] == pytest.approx(want["flops"], rel=1e-9)
        assert got["bytes"] == pytest.approx(want["bytes"], rel=1e-9)
        tflops, tbps = want["flops"] / want["us"] / 1e6, want["bytes"] / want["us"] / 1e6
        for r in got["rows"]:  # every source line of the kernel runs at its op's rate
            peak = H200_FP32_TFLOPS if "float32" == r["input_dtypes"] else H200_BF16_TFLOPS
            assert r["tflops"] == pytest.approx(tflops, rel=1e-9) and r["tbps"] == pytest.approx(tbps, rel=1e-9)
            assert r["compute_fraction"] == pytest.approx(tflops / peak, rel=1e-9, abs=1e-15)
            assert r["bandwidth_fraction"] == pytest.approx(tbps / H200_TBPS, rel=1e-9)
            assert r["intensity"] == pytest.approx(want["flops"] / want["bytes"], rel=1e-9)
            top = max(r["compute_fraction"], r["bandwidth_fraction"])
            ahead = r["compute_fraction"] > r["bandwidth_fraction"]
            assert r["bound"] == ("latency" if top < 0.1 else "compute" if ahead else "memory")
        if len(got["rows"]) == 1:
            assert got["rows"][0]["flops_per_call"] == pytest.approx(float(np.median(want["flops_per_call"])))


def test_the_whole_pool_cast_moves_its_pool_read_and_written_and_is_memory_bound(h200_db):
    """tiny's cast: a 4096 x 576 FP8 pool read, the same in BF16 written, 7,077,888 bytes a call."""
    rows = stored_rows(h200_db, H200_CAPTURES[0])
    (cast,) = [r for (name, op), s in rows.items() for r in s["rows"]
               if op == "aten::copy_" and "float8_e4m3fn" in r["input_dtypes"] and "direct_copy" in name]
    assert cast["model_bytes_per_call"] == 4096 * 576 * (1 + 2) and cast["flops_per_call"] == 0
    assert cast["tbps"] == pytest.approx(4096 * 576 * 3 / cast["mean_us"] / 1e6)
    assert cast["bound"] == "memory" and cast["tflops"] == 0


def test_the_split_k_gemm_gives_its_reduction_a_share_of_the_op_by_time(h200_db):
    """fp32-logits' [1, 4096] x [4096, 16384] GEMM runs a split-K kernel and cuBLASLt's reduction:
    their FLOPs per call add up to the op's 2*4096*16384, shared as their time."""
    rows = stored_rows(h200_db, H200_CAPTURES[2])
    split = next(s for (name, _), s in rows.items() if "splitK_NNT" in name)["rows"][0]
    reduce = next(s for (name, _), s in rows.items() if "splitKreduce" in name)["rows"][0]
    assert split["flops_per_call"] + reduce["flops_per_call"] == pytest.approx(2 * 4096 * 16384, rel=0.02)
    assert split["flops_per_call"] / reduce["flops_per_call"] == pytest.approx(split["mean_us"] / reduce["mean_us"],
                                                                               rel=0.15)
    assert split["tflops"] == pytest.approx(reduce["tflops"], rel=0.1)  # the op's one rate


def test_ops_without_a_model_and_graph_replays_are_stored_as_null(h200_db):
    eager = stored_rows(h200_db, H200_CAPTURES[0])
    index = [r for (_, op), s in eager.items() for r in s["rows"] if op in ("aten::index", "aten::_index_put_impl_")]
    graph = [r for s in stored_rows(h200_db, H200_CAPTURES[3]).values() for r in s["rows"]]
    assert index and graph
    for r in index + [r for r in graph if r["launcher"].startswith("cudaGraphLaunch")]:
        assert all(r[c] is None for c in ("flops_per_call", "model_bytes_per_call", "tflops", "tbps",
                                          "compute_fraction", "bandwidth_fraction", "bound")), r["name"]


def test_graph_kernels_are_priced_by_their_mapping_twins_as_arithmetic_on_the_twins_shapes():
    """The glm5 graph-mode step has no launching ops, so no shapes: with its graph-off mapping
    trace, each replayed kernel takes its twin's part of the twin's op cost. Summed per (kernel,
    attributed op), the FLOPs and bytes are those worked out from the mapping trace's own shapes
    (the twins' parts are by the eager kernels' time), and the rates are over the graph kernels'
    own time."""
    pair = DATA / "h200" / "glm5-graph-pair"
    graph, mapping = pair / "trace.json.gz", pair / "mapping.trace.json.gz"
    fig = analyse_trace(read_trace(graph), load_rule_chain(), None, read_trace(mapping))
    expected = independent_costs(mapping)
    stats = fig.kernel_stats.to_pandas()
    rows = stats[stats["graph_op"] != ""]
    got = defaultdict(lambda: {"calls": 0, "us": 0.0, "flops": 0.0, "bytes": 0.0})
    for r in rows.itertuples():
        g = got[(r.name, r.graph_op)]
        g["calls"] += r.calls
        g["us"] += r.total_us
        g["flops"] += 0.0 if math.isnan(r.tflops) else r.tflops * r.total_us * 1e6
        g["bytes"] += 0.0 if math.isnan(r.tbps) else r.tbps * r.total_us * 1e6
    gemms = sorted((k for k in expected if k[1] in ("aten::mm", "aten::bmm")), key=lambda k: -expected[k]["us"])[:3]
    (cast,) = [k for k in expected if k[1] == "aten::copy_" and "direct_copy" in k[0]]
    for key in gemms + [cast]:
        assert got[key]["calls"] == expected[key]["calls"]
        assert got[key]["flops"] == pytest.approx(expected[key]["flops"], rel=1e-9)
        assert got[key]["bytes"] == pytest.approx(expected[key]["bytes"], rel=1e-9)
    (cast_row,) = rows[rows["name"] == cast[0]].itertuples()
    assert cast_row.launcher == "cudaGraphLaunch" and cast_row.bound == "memory" and cast_row.flops_per_call == 0
    assert cast_row.model_bytes_per_call == pytest.approx(expected[cast]["bytes"] / 78, rel=1e-9)
    assert cast_row.tbps == pytest.approx(expected[cast]["bytes"] / cast_row.total_us / 1e6, rel=1e-9)
    assert cast_row.bandwidth_fraction == pytest.approx(cast_row.tbps / H200_TBPS, rel=1e-9)
    summary = fig.graph_attribution
    assert 0 < summary["priced"] < summary["matched"] == 1638  # aten::index and a few others have no model


# -- (d) other projects' traces: sane, never above a peak ---------------------------------------------
@pytest.mark.parametrize("name, device", [("tracelens__h100__gaunernst_bert-small-uncased__1016001.json.gz",
                                           "NVIDIA H100 SXM"),
                                          ("tracelens__mi300__gaunernst_bert-small-uncased__1016001.json.gz",
                                           "AMD Instinct MI300X")])
def test_wild_bert_traces_get_rates_under_their_device_s_peaks(name, device):
    record = prepare_import(DATA / "wild" / name, load_rule_chain(), ImportOptions())
    assert record.roofline["device"] == device
    k = record.kernel_stats.to_pandas()
    gemms = k[k["launcher"] == "aten::addmm"]
    assert len(gemms) and gemms["tflops"].notna().all() and (gemms["bound"].notna()).all()
    assert (k.loc[k["launcher"] == "aten::_flash_attention_forward", "tbps"] > 0).all()
    for column in ("compute_fraction", "bandwidth_fraction"):
        assert k[column].dropna().between(0, 1.0).all(), k.loc[k[column] > 1, ["name", "launcher", column]]
    assert k["tflops"].notna().sum() >= 5


# -- (e) the Run page's chart, through its spec ---------------------------------------------------------
def test_the_roofline_chart_places_gemms_by_intensity_under_the_roofs_and_the_cast_by_bandwidth(h200_db):
    from app import charts, roofline

    with open_db(h200_db, read_only=True) as store:
        run_id = store.con.execute("SELECT run_id FROM runs WHERE source_path = ?",
                                   [str(H200_CAPTURES[0].resolve())]).fetchone()[0]
        kernels, run = store.list_kernels(run_id), store.get_run(run_id)
    assert roofline.explain_missing(kernels, run["roofline"]) is None
    points = roofline.roofline_points(kernels)
    roofs = roofline.roof_lines(run["roofline"], points)
    spec = charts.roofline_chart(points, roofs, roofline.bandwidth_roofs(run["roofline"])).to_dict()
    top, flat = spec["vconcat"]
    layers = {layer["mark"]["type"]: layer for layer in top["layer"]}
    placed = spec["datasets"][layers["circle"]["data"]["name"]]
    assert {p["launcher"] for p in placed} == {"aten::mm", "aten::bmm", "aten::_fused_rms_norm", "aten::add",
                                                "aten::silu", "aten::_softmax", "aten::mul"}
    assert layers["circle"]["encoding"]["size"]["field"] == "share"
    # the roofs: BF16 and FP32 (no FP8 input among the kernels placed), datasheet and measured;
    # each bends at its ridge point, peak / bandwidth (989.4 / 4.8 = 206 FLOP per byte for BF16)
    lines = spec["datasets"][layers["line"]["data"]["name"]]
    assert {r["roof"] for r in lines} == {"BF16 datasheet", "FP32 datasheet", "BF16 measured on the card",
                                          "FP32 measured on the card"}
    bf16 = [r for r in lines if r["roof"] == "BF16 datasheet"]
    assert [round(r["intensity"], 1) for r in bf16][1] == round(989.4 / 4.8, 1)
    assert max(r["tflops"] for r in bf16) == 989.4
    for p in placed:  # every kernel under every roof drawn
        assert p["tflops"] <= min(989.4, p["intensity"] * 4.8) * (1 + 1e-9)
    bars = spec["datasets"][flat["layer"][0]["data"]["name"]]
    assert {b["launcher"] for b in bars} == {"aten::copy_"} and bars[0]["bar_label"].endswith("of peak")
    hbm = spec["datasets"][flat["layer"][1]["data"]["name"]]
    assert [r["tbps"] for r in hbm] == [4.8, 4.2382]
    labelled = [p for p in placed if p["label"]]
    assert len(labelled) == min(roofline.LABELLED, len(placed))


def test_the_roofline_is_not_drawn_without_a_device_or_without_shapes_and_says_why(h200_db):
    from app import roofline

    with open_db(h200_db, read_only=True) as store:
        graph = store.con.execute("SELECT run_id FROM runs WHERE source_path = ?",
                                  [str(H200_CAPTURES[3].resolve())]).fetchone()[0]
        kernels, run = store.list_kernels(graph), store.get_run(graph)
    assert roofline.explain_missing(kernels, run["roofline"]).startswith("No roofline: no kernel's op")
    assert roofline.explain_missing(kernels, None).startswith("No roofline: the run's GPU is not in")


def _h100_roofline(tmp_path):
    """The H100 Qwen trace of TraceLens imported on its own: (its roofline points, roofs, chart spec)."""
    from app import charts, roofline
    from ingest.cli import main

    db = tmp_path / "q.duckdb"
    assert main(["import", str(DATA / "wild" / "tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"),
                 "--db", str(db)]) == 0
    with open_db(db, read_only=True) as store:
        kernels, run = store.list_kernels(1), store.get_run(1)
    points = roofline.roofline_points(kernels)
    roofs = roofline.roof_lines(run["roofline"], points)
    return points, roofs, charts.roofline_chart(points, roofs, roofline.bandwidth_roofs(run["roofline"])).to_dict()


def test_bars_of_kernels_that_share_a_short_name_are_drawn_apart(tmp_path):
    # torch's unrolled elementwise copy kernel, launched by several ops, moves bytes at different
    # rates: one bar per kernel row, named by its op where they share a name
    points, _, spec = _h100_roofline(tmp_path)
    flat = points[points["flat"]]
    assert flat["short_name"].duplicated().any()  # the case: rows that a bar chart would draw as one
    assert not flat["row_name"].duplicated().any()
    bars_layer = spec["vconcat"][1]["layer"][0]
    assert bars_layer["encoding"]["y"]["field"] == "row_name"
    assert len({b["row_name"] for b in spec["datasets"][bars_layer["data"]["name"]]}) == len(flat)


def test_the_roofs_legend_names_only_the_roofs_drawn(tmp_path):
    # an H100: its datasheet's ceilings, none measured on the card
    _, roofs, spec = _h100_roofline(tmp_path)
    assert set(roofs["basis"]) == {"datasheet"}
    line = next(layer for layer in spec["vconcat"][0]["layer"] if layer["mark"]["type"] == "line")
    assert line["encoding"]["strokeDash"]["scale"]["domain"] == ["datasheet"]
