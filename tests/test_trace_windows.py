"""What a trace holds beyond its steps, on real traces of other projects (tests/data/wild, see its
SOURCES.md), each figure checked against a count taken straight from the JSON:

- kernels launched before the profiler's window opened (no launch in the file, a correlation id
  below every launch it holds) that still run while it is open: in the kernel table, in no step
  (an H100 inference trace from AMD TraceLens, a V100 DDP trace from Holistic Trace Analysis);
- `ingest report --rank N` of a multi-rank run: that rank's step time and copy share, not the
  first rank's (two ranks of HTA's trace_diff DDP job imported as one directory);
- a trace of SGLang's CUDA-graph capture (MI300X, TraceLens): said to be a capture;
- a GPU run profiled without its kernels (HTA's CUPTI range-profiler trace): said so, and no GB/s
  from a launching op's host time;
- the device of a Kineto file older than `deviceProperties` (`computeProperties`, the tb_plugin's
  own test input);
- who keeps whom waiting in the collectives of 8 Megatron TP ranks (ASTRA-sim's A100 traces): the
  rank that costs the others most, which is not the one most often last;
- an AMD graph trace (vLLM's full-graph decode on MI300X, TraceLens): its hipGraphLaunch calls are
  graph launches (the steps, and the launcher of the kernels they replay), and a launch-bound step
  counts only the kernels the host launched one by one (our own H200 graph captures: none);
- a file that is the events array itself (Chrome's JSON Array Format, as Kineto wrote its samples
  in December 2020): read as the same events in an object.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import re
import shutil

import pytest

from ingest.cli import main
from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import COPY_CATEGORIES, load_rule_chain
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA

WILD = DATA / "wild"
RULES = load_rule_chain()
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
KERNEL_LAUNCH = re.compile(r"\w*(LaunchKernel|LaunchCooperativeKernel|GraphLaunch)")


def _events(path) -> list[dict]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]


def _corr(e: dict):
    args = e.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def _window_reference(events: list[dict]) -> dict:
    """Straight from the JSON: the GPU activities launched before (or after) the window, and the
    one ProfilerStep's kernels -- those whose launch lies in its span -- as GPU time and kernel time;
    also what the step would hold if the early kernels were placed by their GPU start instead."""
    launches = {_corr(e): e["ts"] for e in events if e.get("cat") in LAUNCH_CATS and _corr(e) is not None}
    lo_corr, hi_corr = min(launches), max(launches)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    outside = [k for k in gpu if _corr(k) not in launches and _corr(k) and not lo_corr <= _corr(k) <= hi_corr]
    (step,) = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    lo, hi = step["ts"], step["ts"] + step["dur"]
    mine = [k for k in gpu if _corr(k) in launches and lo <= launches[_corr(k)] <= hi]
    early_in_span = [k for k in outside if lo <= k["ts"] <= hi]
    return {"gpu": len(gpu), "outside": len(outside), "outside_us": sum(k["dur"] for k in outside),
            "wall_us": max(k["ts"] + k["dur"] for k in mine) - min(k["ts"] for k in mine),
            "kernel_us": sum(k["dur"] for k in mine),
            "kernel_us_by_start": sum(k["dur"] for k in mine) + sum(k["dur"] for k in early_in_span)}


@pytest.mark.parametrize("name", ["tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                                  "hta__trace_diff__test.json.gz"])
def test_kernels_launched_before_the_window_are_in_the_table_but_in_no_step(name):
    path = WILD / name
    ref = _window_reference(_events(path))
    # real and large: hundreds of kernels, and placed by their start they would swell the step
    assert ref["outside"] > 400
    assert ref["kernel_us_by_start"] > 1.3 * ref["kernel_us"]
    f = analyse_trace(read_trace(str(path)), RULES)
    assert (f.step_method, f.steps) == ("profiler-step", 1)
    assert f.step_table["kernel_us"][0] == pytest.approx(ref["kernel_us"], rel=1e-9)
    assert f.step_table["wall_us"][0] == pytest.approx(ref["wall_us"], rel=1e-9)
    assert f.step_ms_median == pytest.approx(ref["wall_us"] / 1e3, rel=1e-9)
    assert f.gpu_busy_share <= 1.0
    # every kernel is still counted in the kernel table, as key_averages() counts it
    assert f.kernel_stats["calls"].sum() == ref["gpu"]
    assert f.kernel_us_total == pytest.approx(sum(e["dur"] for e in _events(path) if e.get("cat") in GPU_CATS))
    assert f.between_steps_kernels >= ref["outside"]
    note = f"{ref['outside']} kernels ({ref['outside_us'] / 1e3:.3f} ms) were launched outside the recorded window"
    assert any(n.startswith(note) for n in f.notes), f.notes


def _cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_report_of_a_rank_shows_that_ranks_step_and_copy_share(tmp_path):
    # two ranks of one DDP job (HTA's trace_diff: control is rank 3, test rank 1), one directory
    run_dir = tmp_path / "ddp"
    run_dir.mkdir()
    for name in ("hta__trace_diff__control.json.gz", "hta__trace_diff__test.json.gz"):
        shutil.copy(WILD / name, run_dir / name)
    db = str(tmp_path / "r.duckdb")
    assert _cli(["import", str(run_dir), "--db", db])[0] == 0
    code, out = _cli(["report", "1", "--db", db, "--json"])
    first = json.loads(out)
    per_rank = {r["rank"]: r for r in first["per_rank"]}
    assert first["run"]["rank"] == 1 and sorted(per_rank) == [1, 3]
    code, out = _cli(["report", "1", "--db", db, "--json", "--rank", "3"])
    assert code == 0
    third = json.loads(out)
    assert third["run"]["rank"] == 3
    assert third["run"]["step_ms_median"] == per_rank[3]["step_ms_median"] != per_rank[1]["step_ms_median"]
    assert third["run"]["steps"] == per_rank[3]["steps"]
    # the copy share of rank 3's own kernels (the run row holds rank 1's)
    total = sum(k["total_us"] for k in third["kernels"])
    copies = sum(k["total_us"] for k in third["kernels"] if k["category"] in COPY_CATEGORIES)
    assert third["copy_share"] == pytest.approx(copies / total, rel=1e-12)
    assert abs(third["copy_share"] - first["copy_share"]) > 0.03
    assert third["checked_rank"] == first["checked_rank"] == 1
    code, text = _cli(["report", "1", "--db", db, "--rank", "3"])
    assert f"step {per_rank[3]['step_ms_median']:.3f} ms (median)" in text
    assert f"copy share {100 * third['copy_share']:.1f} %" in text
    assert "checked at import on rank 1, the run's first, not on rank 3" in text
    assert "checked at import" not in _cli(["report", "1", "--db", db])[1]


def test_a_graph_capture_trace_says_it_is_one():
    path = WILD / "tracelens__sglang_decode__capture_traces__bs_32_rank0.json.gz"
    events = _events(path)
    captures = [e for e in events if e.get("cat") in LAUNCH_CATS and re.match(r"(cuda|hip|cu)StreamBeginCapture",
                                                                             e["name"])]
    ran = {_corr(e) for e in events if e.get("cat") in GPU_CATS}
    launches = [e for e in events if e.get("cat") in LAUNCH_CATS and KERNEL_LAUNCH.match(e["name"])]
    unrun = [e for e in launches if _corr(e) not in ran]
    assert len(captures) == 1 and len(unrun) > 30 and len(ran) < 5
    f = analyse_trace(read_trace(str(path)), RULES)
    (note,) = [n for n in f.notes if "stream capture" in n]
    assert note.startswith(f"the trace records 1 stream capture into a CUDA/HIP graph (cudaStreamBeginCapture, ...); "
                           f"{len(unrun)} kernel launches here have no kernel of theirs (captured, not run)")
    # an ordinary decode trace of the same project says nothing of the kind
    decode = analyse_trace(read_trace(str(WILD / "tracelens__sglang_decode__sglang_Qwen3-8B_decode.json.gz")), RULES)
    assert not any("capture" in n for n in decode.notes)


def test_a_gpu_run_profiled_without_its_kernels_says_so_and_gives_no_bandwidth():
    path = WILD / "hta__cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz"
    events = _events(path)
    launches = [e for e in events if e.get("cat") in LAUNCH_CATS and KERNEL_LAUNCH.match(e["name"])]
    assert launches and not any(e.get("cat") in GPU_CATS for e in events)
    f = analyse_trace(read_trace(str(path)), RULES)
    assert f.kernels_from_cpu_ops
    assert any(n.startswith(f"its {len(launches)} kernel launches (cudaLaunchKernel, hipLaunchKernel, ...) have no "
                            "GPU kernel in the trace") for n in f.notes), f.notes
    assert all(math.isnan(g) for g in f.kernel_stats["gbps"])
    # a CPU-only run (gloo, no GPU at all) is not told it lost kernels
    cpu = analyse_trace(read_trace(str(WILD / "hta__cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")), RULES)
    assert cpu.kernels_from_cpu_ops and not any("kernel launches" in n for n in cpu.notes)


def test_the_device_of_a_kineto_file_older_than_device_properties():
    path = WILD / "kineto__test__gpu_metrics_input.json.gz"
    header = json.loads(gzip.decompress(path.read_bytes()))
    assert "deviceProperties" not in header
    f = analyse_trace(read_trace(str(path)), RULES)
    assert f.device_name == header["computeProperties"][0]["name"] == "Tesla V100-DGXS-32GB"


def test_a_trace_that_is_the_events_array_reads_as_the_same_events_in_an_object(tmp_path):
    path = WILD / "kineto__2020__resnet50_num_workers_0__worker0.pt.trace.json.gz"
    text = gzip.decompress(path.read_bytes())
    assert text.lstrip().startswith(b"[")
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_bytes(b'{"traceEvents": ' + text + b"}")
    got, want = (analyse_trace(read_trace(str(p)), RULES) for p in (path, wrapped))
    assert (got.steps, got.step_method, got.step_ms_median) == (want.steps, want.step_method, want.step_ms_median)
    assert got.steps == 1 and got.step_ms_median > 50
    for column in ("name", "calls", "total_us", "launcher"):
        assert list(got.kernel_stats[column]) == list(want.kernel_stats[column])
    events = json.loads(text)
    assert got.kernel_stats["calls"].sum() == sum(1 for e in events if str(e.get("cat", "")).lower()
                                                   in ("kernel", "memcpy", "memset", "gpu_memcpy", "gpu_memset"))


def _waits_by_hand(paths) -> tuple[list[int], list[int], dict]:
    """Straight from the JSON, as written in ingest/traces/ranks.py's docstring: the NCCL kernels of
    each rank in time order, matched by position; each rank's clock offset the median of its end
    minus rank 0's; per collective the last arrival (latest aligned start) and each rank's wait.
    Returns (ranks, times each came last, {r: mean over the other ranks of their waits in the
    collectives r reached last, in ms}, rank 0's waits for each rank in ms) -- one profiled step,
    so its median is its sum."""
    ranks, starts, ends = [], [], []
    for p in paths:
        trace = json.loads(gzip.decompress(p.read_bytes()))
        nccl = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                      key=lambda e: e["ts"])
        ranks.append(trace["distributedInfo"]["rank"])
        starts.append([float(e["ts"]) for e in nccl])
        ends.append([float(e["ts"]) + float(e["dur"]) for e in nccl])
    n, m = len(ranks), len(starts[0])
    offset = [sorted(ends[q][i] - ends[0][i] for i in range(m))[m // 2] if m % 2 else
              sum(sorted(ends[q][i] - ends[0][i] for i in range(m))[m // 2 - 1: m // 2 + 1]) / 2 for q in range(n)]
    aligned = [[starts[q][i] - offset[q] for i in range(m)] for q in range(n)]
    last_count, waited = [0] * n, [[0.0] * n for _ in range(n)]  # waited[q][r]
    for i in range(m):
        column = [aligned[q][i] for q in range(n)]
        last = column.index(max(column))
        last_count[last] += 1
        for q in range(n):
            waited[q][last] += column[last] - column[q]
    kept = {ranks[r]: sum(waited[q][r] for q in range(n) if q != r) / (n - 1) / 1e3 for r in range(n)}
    return ranks, last_count, kept, [w / 1e3 for w in waited[0]]


def test_the_note_names_the_rank_that_keeps_the_others_waiting_longest(tmp_path):
    paths = sorted(WILD.glob("astrasim__megatron-tp8__megatron_kineto_*.json.gz"))
    assert len(paths) == 8
    ranks, last_count, kept, first_waits = _waits_by_hand(paths)
    worst = max(kept, key=kept.get)
    most_last = ranks[last_count.index(max(last_count))]
    assert most_last != worst  # the case the note once got wrong: the most often last is not the costliest
    run_dir = tmp_path / "tp8"
    run_dir.mkdir()
    for p in paths:
        shutil.copy(p, run_dir / p.name)
    db = str(tmp_path / "tp8.duckdb")
    assert _cli(["import", str(run_dir), "--db", db])[0] == 0
    report = json.loads(_cli(["report", "1", "--db", db, "--json"])[1])
    assert [r["last_arrivals"] for r in report["per_rank"]] == [last_count[ranks.index(r)] for r in range(8)]
    (note,) = [n for n in report["notes"] if "keeps the other ranks waiting longest" in n]
    assert note == (f"rank {worst} keeps the other ranks waiting longest: each waits {kept[worst]:.3f} ms per step "
                    f"for it (median over steps), in the {last_count[ranks.index(worst)]} of 84 collectives it "
                    f"reached last; rank {most_last} reached more of them last ({max(last_count)}) but keeps each "
                    f"waiting {kept[most_last]:.3f} ms per step")
    # the pattern's sentence: rank 0's own wait for the rank it waits for most
    (finding,) = [f for f in report["patterns"]["findings"] if f["pattern"] == "communication-not-overlapped"]
    waited_for = ranks[first_waits.index(max(first_waits))]
    wait_ms = max(first_waits)
    said = f"rank {ranks[0]} waits {wait_ms:.0f} ms a step in collectives that rank {waited_for} reaches last"
    assert said in finding["text"], finding["text"]


def test_hip_graph_launches_are_the_steps_of_an_amd_graph_trace():
    path = WILD / "tracelens__vllm_decode_full__graph_execution.json.gz"
    events = _events(path)
    launches = {_corr(e): e for e in events if e.get("cat") in LAUNCH_CATS and _corr(e) is not None}
    graph = sorted(e["ts"] for e in launches.values() if e["name"] == "hipGraphLaunch")
    assert len(graph) == 1 and not any(e["name"].startswith(("cudaGraphLaunch", "cuGraphLaunch"))
                                       for e in launches.values())
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    replayed = [k for k in gpu if _corr(k) in launches and launches[_corr(k)]["name"] == "hipGraphLaunch"]
    # one step per graph launch: the kernels launched from it on (by their launch, else their start)
    when = [launches[_corr(k)]["ts"] if _corr(k) in launches else k["ts"] for k in gpu]
    mine = [k for k, t in zip(gpu, when) if t >= graph[0]]
    wall = max(k["ts"] + k["dur"] for k in mine) - min(k["ts"] for k in mine)
    assert len(replayed) > 400 and len(mine) > len(replayed)
    f = analyse_trace(read_trace(str(path)), RULES)
    assert (f.step_method, f.steps) == ("graph-launch", 1)
    assert f.step_ms_median == pytest.approx(wall / 1e3, rel=1e-9)
    assert f.notes[0] == "no step annotations: each CUDA/HIP graph launch is taken as one step"
    table = f.kernel_stats
    from_graph = sum(c for c, launcher in zip(table["calls"], table["launcher"]) if launcher == "hipGraphLaunch")
    assert from_graph == len(replayed)
    # the host launched only the few kernels after the replay one by one
    assert f.timeline["kernels_per_step"] == len(mine)
    assert f.timeline["launched_per_step"] == len(mine) - len(replayed)


@pytest.mark.parametrize("path", ["h200/glm5-graph-pair/trace.json.gz",
                                  "h200/sglang-graph-decode/stepwatch_batch1_input2048_output2_decode.trace.json.gz"])
def test_kernels_replayed_from_a_graph_are_not_counted_as_host_launches(path):
    events = _events(DATA / path)
    graph_corr = {_corr(e) for e in events if e.get("cat") in LAUNCH_CATS and e["name"] == "cudaGraphLaunch"}
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    assert sum(_corr(k) in graph_corr for k in gpu) > 0.99 * len(gpu)
    f = analyse_trace(read_trace(str(DATA / path)), RULES)
    assert f.timeline["kernels_per_step"] >= 1000 and f.timeline["launched_per_step"] == 0


def test_a_memset_an_op_launches_beside_its_gemm_takes_none_of_the_gemms_flops():
    # the H100 Qwen trace's aten::mm / aten::addmm launch a memset (a split-K workspace) before the
    # GEMM: the op's modelled FLOPs are the GEMM's, not the memset's (which read ~600 TFLOP/s)
    path = WILD / "tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    f = analyse_trace(read_trace(str(path)), RULES)
    t = f.kernel_stats
    memsets = [i for i in range(len(t)) if t["name"][i] == "Memset (Device)" and t["launcher"][i] in ("aten::mm",
                                                                                                       "aten::addmm")]
    assert len(memsets) >= 2
    assert all(math.isnan(t["tflops"][i]) and math.isnan(t["tbps"][i]) for i in memsets)
    gemms = [i for i in range(len(t)) if t["launcher"][i] in ("aten::mm", "aten::addmm") and t["category"][i] == "gemm"]
    assert gemms and all(0 < t["tflops"][i] < 989.4 for i in gemms)  # under the H100's BF16 datasheet peak


def test_the_diagnosis_says_why_a_kernel_has_no_bytes_of_its_own_when_its_op_has_shapes(tmp_path):
    # the same GEMM: its op (aten::mm, shapes recorded) also launched a memset, so the op's bytes
    # are not the GEMM's alone -- not "the trace has no op shapes"
    from db.store import open_db

    db = str(tmp_path / "q.duckdb")
    assert _cli(["import", str(WILD / "tracelens__h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"), "--db", db])[0] == 0
    with open_db(db, read_only=True) as store:
        run = store.get_run(1)
    diagnosis = run["diagnosis"] if isinstance(run["diagnosis"], list) else json.loads(run["diagnosis"])
    (no_bytes,) = [f for f in diagnosis if f["kind"] == "no_bytes"]
    assert no_bytes["text"].startswith("Its own bytes per call are not known: its op launched other kernels beside it")
    assert "no op shapes" not in no_bytes["text"]


def test_a_copy_to_or_from_the_host_is_not_rated_against_the_gpus_memory_bandwidth():
    # HTA's V100 DDP trace: host-to-device copies (PCIe) beside device-to-device ones (HBM)
    f = analyse_trace(read_trace(str(WILD / "hta__trace_diff__test.json.gz")), RULES)
    t = f.kernel_stats
    (host,) = [i for i in range(len(t)) if t["name"][i] == "Memcpy HtoD (Pinned -> Device)"]
    assert t["gbps"][host] > 0 and math.isnan(t["peak_fraction"][host]) and math.isnan(t["bandwidth_fraction"][host])
    device = next(i for i in range(len(t)) if t["name"][i].startswith("Memcpy DtoD") and t["gbps"][i] > 0)
    assert t["peak_fraction"][device] > 0 and t["bandwidth_fraction"][device] > 0


def test_a_kernel_rows_gb_per_s_is_its_bytes_over_its_time_when_its_calls_differ_in_size():
    # HTA's V100 trace: 333 device-to-device copies launched by aten::copy_, of 74 sizes (4 B to MBs);
    # the row's GB/s is all their bytes over all their time (the median size over the mean time was
    # 50x lower than the roofline's TB/s of the same row)
    path = WILD / "hta__trace_diff__test.json.gz"
    events = _events(path)
    launches = {_corr(e): e for e in events if e.get("cat") in LAUNCH_CATS and _corr(e) is not None}
    copies = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::copy_"]

    def in_copy(launch) -> bool:
        return any(c["tid"] == launch["tid"] and c["ts"] <= launch["ts"] <= c["ts"] + c["dur"] for c in copies)

    dtod = [e for e in events if e.get("cat") == "gpu_memcpy" and e["name"].startswith("Memcpy DtoD")
            and _corr(e) in launches and in_copy(launches[_corr(e)])]
    assert len(dtod) == 333 and len({e["args"]["bytes"] for e in dtod}) > 50
    # (stepwatch counts a copy's bytes read and written, twice the payload CUPTI records)
    want_gbps = 2 * sum(e["args"]["bytes"] for e in dtod) / sum(e["dur"] for e in dtod) / 1e3
    f = analyse_trace(read_trace(str(path)), RULES)
    t = f.kernel_stats
    (row,) = [i for i in range(len(t)) if t["name"][i].startswith("Memcpy DtoD") and t["launcher"][i] == "aten::copy_"]
    assert t["calls"][row] == 333
    assert t["gbps"][row] == pytest.approx(want_gbps, rel=1e-9)
    assert t["gbps"][row] == pytest.approx(t["tbps"][row] * 1e3, rel=1e-9)
