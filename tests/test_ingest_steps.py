"""How steps are found and timed on traces we did not make, and what a reader of the figures is
told: SGLang's `step[...]` spans (a real MI300X SGLang decode trace from AMD TraceLens' test data),
traces without step markers, names torch wrote with raw control characters or invalid UTF-8,
Python frames of files without a .py suffix (a real torch 2.13 trace of a script run as
`python bench`), and the report's rank for a single trace of any rank."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from ingest.cli import main
from ingest.traces.analyse import analyse_trace
from ingest.traces.categories import load_rule_chain
from ingest.traces.ranks import find_waits, waits_for
from ingest.traces.trace_read import read_trace
from tests.helpers import DATA

WILD = DATA / "wild"
RULES = load_rule_chain()
SGLANG_DECODE = WILD / "tracelens__sglang_decode__sglang_Qwen3-8B_decode.json.gz"
SGLANG_PREFILL = WILD / "tracelens__sglang_prefilldecode__sglang_Qwen3-8B_prefilldecode.json.gz"


def _events(path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]


def _gpu_extent_of_span(events, span_name):
    """Straight from the JSON: the GPU time of the kernels launched inside the named span (first
    start to last end), the span's own (host) duration, and the kernels launched outside it."""
    span = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == span_name)
    lo, hi = span["ts"], span["ts"] + span["dur"]
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    inside = [k for k in kernels if lo <= launch_ts.get(k["args"].get("correlation"), k["ts"]) <= hi]
    first, last = min(k["ts"] for k in inside), max(k["ts"] + k["dur"] for k in inside)
    return last - first, span["dur"], len(kernels) - len(inside)


def test_sglang_decode_step_is_its_gpu_time_not_the_host_span():
    # SGLang wraps each forward in record_function("step[DECODE bs=32]"); under CUDA (HIP) graphs
    # that host span also holds a 463 ms wait before the replay is launched
    events = _events(SGLANG_DECODE)
    gpu_us, host_us, outside = _gpu_extent_of_span(events, "step[DECODE bs=32]")
    assert host_us > 400_000 and gpu_us < 11_000
    f = analyse_trace(read_trace(SGLANG_DECODE), RULES)
    assert (f.step_method, f.steps) == ("span", 1)
    assert f.step_ms_median == pytest.approx(gpu_us / 1e3, rel=1e-9)
    assert 0.5 < f.gpu_busy_share <= 1.0
    # the kernels before the span (prepare-for-decode work) are kept, reported as between steps
    assert (f.between_steps_kernels, outside) == (7, 7)
    activities = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert f.kernel_stats["calls"].sum() == len(activities) == 558  # every kernel is in the table
    assert any("between steps" in n for n in f.notes)


def test_sglang_prefill_spans_are_the_steps_when_there_is_no_decode():
    f = analyse_trace(read_trace(SGLANG_PREFILL), RULES)
    assert (f.step_method, f.steps) == ("span", 1)
    assert f.step_table["wall_us"][0] >= f.step_table["gpu_busy_us"][0] > 0


def test_decode_spans_only_when_prefill_spans_are_there_too(tmp_path):
    # the real decode trace with one of its kernels' launches wrapped in a step[EXTEND ...] span
    # of its own, as a server trace has them: the EXTEND span is not a step, its kernel is between
    events = _events(SGLANG_DECODE)
    launch = next(e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "hipLaunchKernel")
    body = {"traceEvents": events + [{"ph": "X", "cat": "user_annotation", "name": "step[EXTEND bs=1 toks=64]",
                                      "pid": launch["pid"], "tid": launch["tid"], "ts": launch["ts"] - 1,
                                      "dur": launch["dur"] + 2}]}
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(body))
    f = analyse_trace(read_trace(path), RULES)
    assert (f.step_method, f.steps) == ("span", 1)
    assert any("1 decode steps; 1 other forward spans" in n for n in f.notes)


def test_speculative_iteration_is_its_draft_verify_and_draft_extend(tmp_path):
    # The real decode trace shaped as a speculative decoding iteration of sglang 0.5.23
    # (eagle_worker_v2.py:1444-1510): its forward span renamed step[VERIFY bs=32]
    # (profile_utils.py:487-488), the 3 launches before it inside a `draft` stage span and the 2
    # after it inside a `draft_extend` one (spec_utils.py:852), as the draft model's graph replays
    # are (they bypass ModelRunner.forward, so no step span of their own). One step: the GPU time of
    # the kernels launched from the draft's start to the draft-extend's end; main read the verify
    # forward alone (the draft kernels between steps).
    events = _events(SGLANG_DECODE)
    span = next(e for e in events if e.get("cat") == "user_annotation" and e["name"] == "step[DECODE bs=32]")
    lo, hi = span["ts"], span["ts"] + span["dur"]
    launches = sorted((e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "hipLaunchKernel"),
                      key=lambda e: e["ts"])
    before, after = [e for e in launches if e["ts"] < lo], [e for e in launches if e["ts"] > hi]
    assert (len(before), len(after)) == (3, 2)
    draft = {"ph": "X", "cat": "user_annotation", "name": "draft", "pid": span["pid"], "tid": span["tid"],
             "ts": before[0]["ts"] - 1, "dur": lo - 0.5 - (before[0]["ts"] - 1)}
    extend_end = after[-1]["ts"] + after[-1]["dur"] + 1
    draft_extend = {**draft, "name": "draft_extend", "ts": hi + 0.5, "dur": extend_end - (hi + 0.5)}
    body = {"traceEvents": [{**e, "name": "step[VERIFY bs=32]"} if e is span else e for e in events]
            + [draft, draft_extend]}
    path = tmp_path / "speculative.json"
    path.write_text(json.dumps(body))
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    inside = [k for k in kernels if draft["ts"] <= launch_ts.get(k["args"].get("correlation"), k["ts"]) <= extend_end]
    gpu_us = max(k["ts"] + k["dur"] for k in inside) - min(k["ts"] for k in inside)
    verify_gpu_us = _gpu_extent_of_span(events, "step[DECODE bs=32]")[0]
    assert gpu_us > verify_gpu_us
    f = analyse_trace(read_trace(path), RULES)
    assert (f.step_method, f.steps) == ("span", 1)
    assert f.step_ms_median == pytest.approx(gpu_us / 1e3, rel=1e-9)
    assert f.between_steps_kernels == len(kernels) - len(inside) == 0  # the verify span alone: 7
    assert any(n.startswith("SGLang speculative decoding: 1 decode iterations") for n in f.notes)


def test_a_trace_without_step_markers_is_one_step_of_its_gpu_time():
    path = WILD / "tracelens__mi210__gpu_only_trace.json.gz"  # kernels and launches, no CPU ops
    events = _events(path)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    f = analyse_trace(read_trace(path), RULES)
    assert (f.step_method, f.steps, f.between_steps_kernels) == ("whole-trace", 1, 0)
    extent = max(k["ts"] + k["dur"] for k in kernels) - min(k["ts"] for k in kernels)
    assert f.step_table["wall_us"][0] == pytest.approx(extent, rel=1e-9)
    assert f.kernel_stats["calls_per_step"].sum() == len(kernels)
    assert any("whole profiled window is read as one step" in n for n in f.notes)
    # and --steps N still splits it into N equal runs of kernels
    g = analyse_trace(read_trace(path), RULES, given_steps=4)
    assert (g.step_method, g.steps) == ("given", 4)
    assert g.kernel_stats["calls"].sum() == len(kernels)


@pytest.mark.parametrize("bad", [b"\x01", b"\x1b[31m", b"\xff\xfe", b"\xc3"])
def test_names_with_control_characters_or_invalid_utf8_are_read(tmp_path, bad):
    # torch has written such names (Perfetto refuses those traces): json.load refuses them too,
    # so stepwatch reads them with the bytes replaced, and says so
    raw = gzip.decompress((WILD / "hta__triton_example.json.gz").read_bytes())
    assert raw.count(b'"name": "triton_') >= 1
    text = raw.replace(b'"name": "triton_', b'"name": "triton_' + bad, 1)
    with pytest.raises(ValueError):
        json.loads(text)
    path = tmp_path / "bad_name.json"
    path.write_bytes(text)
    trace = read_trace(path)
    assert trace.repaired_bytes == (1 if bad != b"\xff\xfe" else 2)
    f = analyse_trace(trace, RULES)
    names = list(f.kernel_stats["name"])
    assert len(names) == 1 and names[0].startswith("triton_")
    assert any("control characters or invalid UTF-8" in n for n in f.notes)


def test_a_control_character_split_across_reads_still_reads(tmp_path):
    # a piece boundary must never meet a repair: at 2 KB pieces the bad name falls mid-file
    raw = gzip.decompress((WILD / "hta__critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz")
                          .read_bytes())
    at = raw.index(b'"name": "', len(raw) // 2) + len(b'"name": "')
    path = tmp_path / "mid.json"
    path.write_bytes(raw[:at] + b"\x07" + raw[at:])
    from ingest.traces.trace_read import read_trace as read  # the module's reader, with tiny pieces

    trace = read(path, split=False, chunk_bytes=2048)
    clean = read(WILD / "hta__critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz")
    assert trace.repaired_bytes == 1 and len(trace) == len(clean)


SCRIPT = """
import torch
from torch.profiler import profile, ProfilerActivity

def layer(x, w):
    return torch.nn.functional.gelu(x @ w)

x, w = torch.randn(64, 64), torch.randn(64, 64)
with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
    for _ in range(3):
        layer(x, w)
prof.export_chrome_trace(OUT)
"""


@pytest.mark.slow
def test_python_source_of_a_script_without_py_suffix(tmp_path):
    # a real torch trace of a script run as `python bench`: torch names its frames `bench(N): layer`
    script = tmp_path / "bench"
    out = tmp_path / "bench.trace.json"
    script.write_text(f"OUT = {str(out)!r}\n" + SCRIPT)
    subprocess.run([sys.executable, str(script)], check=True, cwd=tmp_path, timeout=300)
    f = analyse_trace(read_trace(out), RULES)
    line = next(i for i, t in enumerate(script.read_text().splitlines(), 1) if t.startswith("def layer"))
    sources = set(f.kernel_stats[f.kernel_stats["name"] == "aten::mm"]["source"])
    assert sources == {f"bench({line}): layer"}


def test_report_shows_the_only_rank_of_a_single_trace_and_refuses_others(tmp_path, capsys):
    db = str(tmp_path / "r.duckdb")
    trace = WILD / "hta__trace_compare__base.json.gz"  # distributedInfo.rank 1, kernels on GPU 1
    assert main(["import", str(trace), "--db", db]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["report", run_id, "--db", db, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["rank"] == 1 and len(report["kernels"]) >= 5
    assert main(["report", run_id, "--db", db, "--rank", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"stepwatch: error: run {run_id} has no rank 0 (its ranks: 1)"]


def test_report_escapes_control_characters_for_the_terminal(tmp_path, capsys):
    raw = gzip.decompress((WILD / "hta__triton_example.json.gz").read_bytes())
    path = tmp_path / "esc.json"
    path.write_bytes(raw.replace(b'"name": "triton_', b'"name": "triton_\\u001b[2J\\u0007', 1))
    db = str(tmp_path / "e.duckdb")
    assert main(["import", str(path), "--db", db]) == 0
    run_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(["report", run_id, "--db", db]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "triton_\\x1b[2J\\x07" in out


def test_waits_find_the_rank_that_arrives_last():
    # three ranks, five collectives; rank 2 arrives last at four of them; rank 1's clock runs
    # 1000 us ahead, which the collectives' common ends reveal
    start = np.array([[0, 10, 20, 30, 40], [1000, 1011, 1022, 1030, 1041], [4, 15, 19, 36, 47]], float)
    end = np.array([[5, 16, 25, 38, 50], [1005, 1016, 1025, 1038, 1050], [5, 16, 25, 38, 50]], float)
    w = find_waits(list(start), list(end))
    assert w.collectives == 5 and list(w.offset_us) == [0, 1000, 0]
    assert list(w.last_arrivals) == [0, 1, 4]
    latest = np.array([4, 15, 22, 36, 47])
    assert w.wait_us.tolist() == [list(latest - (start[r] - w.offset_us[r])) for r in range(3)]
    assert find_waits([start[0], start[1][:4]], [end[0], end[1][:4]]) is None  # counts differ
    assert find_waits([start[0]], [end[0]]) is None  # one rank


def test_the_rank_that_costs_the_others_most_is_not_always_the_one_most_often_last():
    # three ranks, two steps of three collectives; rank 2 comes last three times by 1 us, rank 1
    # twice by 400 us: the others wait for rank 1, whatever the count says
    start = np.array([[0, 1000, 2000, 10_000, 11_000, 12_000],
                      [400, 1000, 2000, 10_400, 11_000, 12_000],
                      [0, 1001, 2001, 10_000, 11_001, 11_999]], float)
    end = np.tile(np.array([500, 1500, 2500, 10_500, 11_500, 12_500], float), (3, 1))
    w = find_waits(list(start), list(end))
    assert list(w.last) == [1, 2, 2, 1, 2, 0] and list(w.last_arrivals) == [1, 2, 3]
    steps = [np.array([0, 0, 0, 1, 1, 1])] * 3
    m = waits_for(w, steps, [2, 2, 2])
    # [q, r]: q's median wait per step in the collectives r reached last
    assert np.allclose(m, [[0.0, 0.4, 0.0015], [0.0, 0.0, 0.0015], [0.0005, 0.4, 0.0]], rtol=0, atol=1e-12)
    # only the collectives inside steps count; a step without such a wait counts 0
    m = waits_for(w, [np.array([0, 0, 0, -1, -1, -1])] * 3, [1, 1, 1])
    assert np.allclose(m[0], [0.0, 0.4, 0.002], rtol=0, atol=1e-12)
