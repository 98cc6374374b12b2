"""Regenerate the conformance corpus: real profiler traces from other projects' public test data.

    cd /work/main && .venv/bin/python tests/data/wild/make_corpus.py [--mirrors /work/.mirror]

Each file is read from a git mirror of its project (a bare clone is enough: blobs are read with
`git cat-file`), at the commit named in SOURCES below, and written to tests/data/wild/ with its
source folder folded into its name. Files of up to BUDGET_BYTES are copied byte for byte. Larger
traces are trimmed to a time window, by text, never re-serialised:

- the keys before and after `traceEvents` are kept byte for byte, in their order;
- every metadata event (`ph` "M") is kept, and every event that has no numeric `ts`;
- a GPU activity (kernel, memcpy, memset, MTIA CCP event; any capitalisation) is kept when its
  launch (the runtime/driver event with the same `args.correlation`) is kept; one with no
  launch in the file is kept when its `ts` falls in the window;
- every other event is kept when its `ts` falls in the window [t0, t1];
- a kept event keeps its original JSON text and the separator text before it (number formats,
  key order and escapes survive): `json.JSONDecoder.raw_decode` gives each event's exact span.

A file kept "gpu" (Window(keep="gpu")) has no time window: its metadata events, step annotations,
GPU activities and their launches are kept and every other event (CPU ops, Python frames, flows)
dropped, so its kernel and step figures are the original's (its launchers are not).

A window starts at a step annotation (`ProfilerStep#N`, `step[...]`) or at the first event, and
ends after the whole step(s) asked for when they fit in BUDGET_BYTES gzipped; otherwise it ends
at the last event that still fits (a partial step: SOURCES.md says which). Trimmed files are
gzipped with mtime 0, so the output is the same on every run.

The non-trace files (which stepwatch must refuse) are copied verbatim, except the rocprof result,
whose lists are cut to their first items (re-serialised: it is not a trace, only its shape matters).

Writes manifest.json (read by tests/test_wild_traces.py), SOURCES.md and LICENSES/.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUDGET_BYTES = 97_000  # stored size of a trimmed file (the test allows 120 KB)

HTA = "facebookresearch/HolisticTraceAnalysis"
TRACELENS = "AMD-AGI/TraceLens"
KINETO = "pytorch/kineto"
HTA_COMMIT = "f4d0062c382f42bd8a74838bcdad1916c7d5d2da"
TRACELENS_COMMIT = "171dd74721ca1ec45709e5805b68ae1f65e27811"
KINETO_2021_01 = "229f2b87f69b3448c6d9876efc0147c4b4edde0e"
KINETO_2021_06 = "be239c044d2f4b62982e1ff64144097acd69f59a"
KINETO_2020_12 = "a0380a320dcf1f34df55f05182471ac59ff6cb78"
ASTRA = "astra-sim/astra-sim"
ASTRA_COMMIT = "ab5d3e629c9d28257cf9d2b367474f0cbfdf450e"
LICENCE = {HTA: "MIT", TRACELENS: "MIT", KINETO: "BSD-3-Clause", ASTRA: "MIT"}
LICENCE_FILES = {  # (repo, commit) -> name under LICENSES/
    (HTA, HTA_COMMIT): "HolisticTraceAnalysis-MIT.txt",
    (TRACELENS, TRACELENS_COMMIT): "TraceLens-MIT.txt",
    (KINETO, KINETO_2021_01): "kineto-BSD-229f2b8.txt",
    (KINETO, KINETO_2021_06): "kineto-BSD-be239c0.txt",
    (KINETO, KINETO_2020_12): "kineto-BSD-a0380a3.txt",
    (ASTRA, ASTRA_COMMIT): "astra-sim-MIT.txt",
}

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "mtia_ccp_events"}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime", "driver", "mtia_runtime"}


@dataclass(frozen=True)
class Window:
    """Where a trimmed file's window starts: at the first annotation whose name matches `step`
    (None: at the first event), ending after `steps` whole steps when they fit."""

    step: str | None = None
    steps: int = 1
    # "gpu": no time window; every GPU activity, its launch, the step annotations and the metadata
    # events are kept and every other event (CPU ops, Python frames, flows) dropped
    keep: str | None = None


@dataclass(frozen=True)
class Source:
    repo: str
    commit: str
    path: str
    stored: str
    rank: int | None  # the rank the file is (None for a file that is not a trace)
    why: str
    window: Window | None = None  # None: verbatim
    expect: str = "trace"  # or "refuse"


def _hta(path: str, stored: str, rank: int | None, why: str, window: Window | None = None,
         expect: str = "trace") -> Source:
    return Source(HTA, HTA_COMMIT, "tests/data/" + path, "hta__" + stored, rank, why, window, expect)


def _tl(path: str, stored: str, rank: int | None, why: str, window: Window | None = None,
        expect: str = "trace") -> Source:
    return Source(TRACELENS, TRACELENS_COMMIT, "tests/" + path, "tracelens__" + stored, rank, why, window, expect)


def _kineto(commit: str, path: str, stored: str, why: str, window: Window) -> Source:
    return Source(KINETO, commit, "tb_plugin/samples/" + path, "kineto__" + stored, 0, why, window)


SOURCES = [
    # -- Holistic Trace Analysis (MIT) --
    _hta("amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", "mi250_minitoy_train_ROCm6_2_kineto.json.gz", 0,
         "AMD MI250 on ROCm 6.2 (hipLaunchKernel; kernels on device 2); traceName, displayTimeUnit, "
         "baseTimeNanoseconds after traceEvents; two ProfilerSteps"),
    _hta("call_stack/backward_thread.json", "call_stack__backward_thread.json", 0,
         "plain (not gzipped) JSON of 7 events; distributedInfo after traceEvents; no metadata events"),
    _hta("cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
         "cpu_only__rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
         34, "CPU-only (gloo all-reduce); distributedInfo.rank 34; INFO log lines after traceEvents"),
    _hta("critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
         "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz", 0,
         "no ProfilerStep (a PARAM benchmark: [param|...] annotations); integer timestamps; cuda_sync events"),
    _hta("critical_path/cuda_event_sync/event_sync_trace.json.gz",
         "critical_path__cuda_event_sync__event_sync_trace.json.gz",
         0, "one ProfilerStep; event, stream and device synchronisation (cuda_sync events); INFO after traceEvents"),
    _hta("critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
         "critical_path__cuda_event_sync_multi_stream__event_sync_trace.json.gz", 0,
         "no step markers; kernels and memsets on several streams; INFO after traceEvents"),
    _hta("critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
         "critical_path__simple_add__benchmark_result_493459_1694039959_trace.json.gz", 0,
         "no step markers (PARAM benchmark of torch.add)"),
    _hta("critical_path/end_to_end/simple_add/output/overlaid_critical_path_trace.json.gz",
         "critical_path__overlaid_critical_path_trace.json.gz", 0,
         "the same trace after HTA overlaid its critical path: extra `critical_path` events and flows"),
    _hta("cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
         "cupti_profiler__benchmark_result_924719_1679055439_trace.json.gz", 0,
         "CUPTI range-profiler run: CUDA runtime calls and cuda_profiler_range events but no GPU activity "
         "(so CPU ops play the kernels); distributedInfo after traceName"),
    _hta("distributed_info_unavailable/distributed_info_not_found.json.gz",
         "distributed_info_unavailable__distributed_info_not_found.json.gz", 0,
         "CPU-only training step with no distributedInfo and no metadata events"),
    _hta("rank_non_gpu/rank_non_gpu.json.gz", "rank_non_gpu.json.gz", 0,
         "the same CPU-only step with distributedInfo {rank: 0}"),
    _hta("rank_unavailable/rank_not_found.json.gz", "rank_unavailable__rank_not_found.json.gz", 0,
         "the same CPU-only step with distributedInfo that has no rank"),
    _hta("execution_trace/benchmark_simple_add_trace.json.gz", "execution_trace__benchmark_simple_add_trace.json.gz", 0,
         "no step markers; distributedInfo then traceName after traceEvents"),
    _hta("execution_trace/benchmark_simple_add_et.json.gz", "execution_trace__benchmark_simple_add_et.json.gz", None,
         "a Chakra execution trace (nodes, no traceEvents): not a profiler trace", expect="refuse"),
    _hta("trace_compare/base/base.json.gz", "trace_compare__base.json.gz", 1,
         "distributedInfo.rank 1 with kernels on device 1; only X events (no metadata, no flows); 16 of its 18 "
         "GPU activities have no launch with their correlation"),
    _hta("trace_compare/test/test.json.gz", "trace_compare__test.json.gz", 1,
         "as base, with one kernel fewer and more CPU ops"),
    _hta("trace_file_list/inference_rank_1.json.gz", "trace_file_list__inference_rank_1.json.gz", 1,
         "old Kineto layout: `Kernel`/`Runtime` categories, `external id`; rank 1 in distributedInfo and name; "
         "no ProfilerStep"),
    _hta("triton_example/triton_example.json.gz", "triton_example.json.gz", 0,
         "one Triton kernel launched by cuLaunchKernel (cuda_driver); INFO after traceEvents; no distributedInfo"),
    _hta("trace_filter/sampled_rank-1.json.gz", "trace_filter__sampled_rank-1.json.gz", 1,
         "rank 1 of 128 (kernels on device 1); sampled events, no flows; one whole ProfilerStep",
         Window(r"ProfilerStep#551$")),
    _hta("mtia_inference_trace/mtia_inference_rank_0.json.gz", "mtia_inference_rank_0.json.gz", 0,
         "MTIA accelerator: mtia_ccp_events launched by mtia_runtime; INFO and ERROR after traceEvents; "
         "no step markers", Window()),
    _hta("nccl_parser_config/nccl_data.json.gz", "nccl_parser_config__nccl_data.json.gz", 0,
         "DDP on 2 ranks: NCCL kernels, fwdbwd flows; INFO, traceName, displayTimeUnit, baseTimeNanoseconds after",
         Window(r"ProfilerStep#5$")),
    _hta("ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
         "ns_resolution_trace__rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 0,
         "timestamps with nanosecond fractions; INFO, traceName, displayTimeUnit after traceEvents",
         Window(r"ProfilerStep#102$")),
    _hta("negative_queue_length_values_check/rank0.json.gz", "negative_queue_length_values_check__rank0.json.gz", 0,
         "rank 0 of 16: all-to-all, reduce-scatter, cudaGraphLaunch inside ProfilerSteps; integer timestamps; "
         "nothing after traceEvents",
         Window(r"ProfilerStep#551$")),
    _hta("trace_diff/control/control.json.gz", "trace_diff__control.json.gz", 3,
         "distributedInfo.rank 3 of 8 with kernels on device 3; async_cpu_to_gpu flows",
         Window(r"ProfilerStep#1010$")),
    _hta("trace_diff/test/test.json.gz", "trace_diff__test.json.gz", 1,
         "DDP on 2 V100s (rank 1): 614 GPU activities (56.5 ms) in the original have no launch in the file and "
         "correlation ids below its first launch, yet run inside ProfilerStep#1009: launched before the window",
         Window(r"ProfilerStep#1009$")),
    # -- AMD TraceLens (MIT) --
    _tl("traces/mi210/gpu_only_trace/gpu_only_trace.json.gz", "mi210__gpu_only_trace.json.gz", 0,
        "AMD MI210: kernels and HIP runtime events (hipLaunchKernel, hipExtModuleLaunchKernel) but no cpu_op "
        "at all; kernels on device 1; no step markers"),
    _tl("traces/torch_compile_triton/trace.json.gz", "torch_compile_triton__trace.json.gz", 0,
        "torch.compile with Triton kernels on AMD (hipModuleLaunchKernel, hipExtModuleLaunchKernel); no "
        "ProfilerStep; kernels on device 2"),
    _tl("traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
        "sglang_decode__sglang_Qwen3-8B_decode.json.gz",
        0, "real SGLang decode on MI300X: a `step[DECODE bs=32]` span, hipGraphLaunch replays, kernels on device 9"),
    _tl("traces/inference/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz",
        "sglang_prefilldecode__sglang_Qwen3-8B_prefilldecode.json.gz", 0,
        "real SGLang prefill on MI300X: a `step[EXTEND bs=15 toks=15360]` span, eager hipLaunchKernel and "
        "hipExtModuleLaunchKernel, kernels on device 9",
        Window(r"step\[")),
    _tl("traces/inference/vllm_decode_full/graph_execution.json.gz", "vllm_decode_full__graph_execution.json.gz", 0,
        "vLLM full CUDA-graph decode on AMD (hipGraphLaunch), no step markers, device 2"),
    _tl("traces/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz",
        "vllm_prefilldecode_piecewise__graph_execution.json.gz", 0,
        "vLLM piecewise graphs on AMD: eager kernels between graph replays, no step markers", Window()),
    _tl("traces/h100/gaunernst_bert-small-uncased__1016001.json.gz",
        "h100__gaunernst_bert-small-uncased__1016001.json.gz",
        0, "H100 inference: 14 keys after traceEvents (deviceProperties, ..., baseTimeNanoseconds); one ProfilerStep"),
    _tl("traces/mi300/gaunernst_bert-small-uncased__1016001.json.gz",
        "mi300__gaunernst_bert-small-uncased__1016001.json.gz",
        0, "the same model on MI300X: roctracer/hip versions after traceEvents, kernels on device 2"),
    _tl("traces/h100/Falconsai_nsfw_image_detection__1016002.json.gz",
        "h100__Falconsai_nsfw_image_detection__1016002.json.gz", 0,
        "H100 image model: memsets, cpu_instant_event, cuda_driver events; 14 keys after traceEvents",
        Window(r"ProfilerStep#6$")),
    _tl("traces/mi300/resnet_act_checkpoint.json.gz", "mi300__resnet_act_checkpoint.json.gz", 0,
        "MI300X DDP training with activation checkpointing: memcpy/memset, fwdbwd flows; a quarter of the GPU "
        "activities have no launch event in the file (968 of 3653 in the original)",
        Window(r"ProfilerStep#16$")),
    _tl("traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "h100__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", 0,
        "H100 inference, one ProfilerStep: 509 of its 1,707 GPU activities (13.7 ms) have no launch in the file "
        "and correlation ids below its first launch (launched before the window), most of them running "
        "inside the step", Window(r"ProfilerStep#6$")),
    _tl("traces/inference/sglang_decode/capture_traces/bs_32_rank0.json.gz",
        "sglang_decode__capture_traces__bs_32_rank0.json.gz", 0,
        "SGLang's CUDA-graph capture on MI300X (`capture_32_DECODE`, hipStreamBeginCapture): hundreds of "
        "hipLaunchKernel / hipExtModuleLaunchKernel calls captured, 2 kernels run", Window(r"ProfilerStep#134$")),
    _tl("traces/b200/eager_trace.json.gz", "b200__eager_trace.json.gz", 0,
        "B200, rank 0 of 8 (pg_config of 71 process groups in distributedInfo); no ProfilerStep", Window()),
    _tl("traces/inference/sglang_decode/capture_traces/execution_details.json",
        "sglang_decode__capture_traces__execution_details.json", None,
        "a JSON list (capture settings), not a trace", expect="refuse"),
    _tl("traces/tracediff_test/cpu_op_map.json", "tracediff_test__cpu_op_map.json", None,
        "a JSON object of op -> kernels (TraceLens output), not a trace", expect="refuse"),
    _tl("traces/h100/gaunernst_bert-small-uncased__1016001_perf_report_csvs/kernel_summary.csv",
        "h100__gaunernst_bert-small-uncased__kernel_summary.csv", None,
        "a CSV kernel summary (TraceLens output), not JSON", expect="refuse"),
    _tl("rocprof/908_results.json.gz", "rocprof__908_results.json.gz", None,
        "a rocprofiler-sdk results file (JSON, no traceEvents)", expect="refuse"),
    # -- PyTorch Kineto tb_plugin samples (BSD) --
    _kineto(KINETO_2021_01, "resnet50_profiler_api_num_workers_0/worker0.pt.trace.json.gz",
            "resnet50_profiler_api_num_workers_0__worker0.pt.trace.json.gz",
            "torch 1.8-era layout: Operator/Kernel/Runtime/Memcpy/Memset, `external id`, string tids "
            "(\"stream 7\"), ProfilerStep#N as an Operator", Window(r"ProfilerStep#6$")),
    _kineto(KINETO_2021_01, "resnet50_autograd_api_num_workers_4/worker0.pt.trace.json.gz",
            "resnet50_autograd_api_num_workers_4__worker0.pt.trace.json.gz",
            "torch 1.8-era layout profiled with the autograd API: no ProfilerStep", Window()),
    Source(KINETO, KINETO_2020_12, "plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
           "kineto__2020__resnet50_num_workers_0__worker0.pt.trace.json.gz", 0,
           "Kineto's December 2020 layout: the file is the events array itself (Chrome's JSON Array Format, no "
           "traceEvents key, no device properties), torch 1.8 nightly categories", Window(r"ProfilerStep#\d+$")),
    Source(KINETO, KINETO_2021_06, "tb_plugin/test/gpu_metrics_input.json", "kineto__test__gpu_metrics_input.json.gz",
           0, "the tb_plugin's own test input (V100): the device in `computeProperties`, the key Kineto wrote "
           "before `deviceProperties`; one ProfilerStep", Window(r"ProfilerStep#\d+$")),
    _kineto(KINETO_2021_06, "resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
            "resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
            "torch 1.9-era layout: as above plus instant events and `Call stack` strings",
            Window(r"ProfilerStep#7$")),
]


# -- ASTRA-sim (MIT): eight ranks of one Megatron tensor-parallel step (A100s, NCCL all-reduces),
# their GPU activities, launches and step annotations kept whole (tests/test_trace_windows.py reads
# them as one directory: who keeps whom waiting in the collectives)
SOURCES += [
    Source(ASTRA, ASTRA_COMMIT, f"my_test/inputs/workload/megatron-tp8/megatron_kineto_{r}.json",
           f"astrasim__megatron-tp8__megatron_kineto_{r}.json.gz", r,
           f"rank {r} of 8 (distributedInfo) of a Megatron TP=8 step on A100s: 690 GPU activities, 84 NCCL "
           "all-reduces; CPU ops, Python frames and flows dropped", Window(keep="gpu"))
    for r in range(8)
]


# -- reading the mirrors ------------------------------------------------------------------------

def find_git_dir(mirrors: Path, repo: str) -> Path:
    base = mirrors / repo.replace("/", "+")
    return base / "repo" if (base / "repo").exists() else base


def read_blob(mirrors: Path, src: Source) -> bytes:
    return subprocess.run(["git", "--git-dir", str(find_git_dir(mirrors, src.repo)), "cat-file", "blob",
                           f"{src.commit}:{src.path}"], check=True, capture_output=True).stdout


# -- cutting a trace into its text pieces -------------------------------------------------------

_WS = re.compile(r"\s*")


@dataclass
class TraceText:
    """A trace's text split around its events: prefix ends with '[', suffix starts with ']'.
    Each event is (separator text before it, its own JSON text, its parsed value)."""

    prefix: str
    events: list[tuple[str, str, object]]
    tail: str  # text between the last event and ']'
    suffix: str


def split_trace_text(text: str) -> TraceText:
    dec = json.JSONDecoder()
    i = _WS.match(text, 0).end()
    if text[i] == "[":  # Chrome's JSON Array Format: the events array is the whole file
        return _split_events(text, i, dec)
    if text[i] != "{":
        raise ValueError("not a JSON object")
    i += 1
    while True:
        i = _WS.match(text, i).end()
        if text[i] == "}":
            raise ValueError("no traceEvents")
        key, i = dec.raw_decode(text, i)
        i = _WS.match(text, i).end()
        assert text[i] == ":", i
        i = _WS.match(text, i + 1).end()
        if key == "traceEvents":
            return _split_events(text, i, dec)
        _, i = dec.raw_decode(text, i)
        i = _WS.match(text, i).end()
        if text[i] == ",":
            i += 1


def _split_events(text: str, open_at: int, dec: json.JSONDecoder) -> TraceText:
    assert text[open_at] == "[", open_at
    events = []
    pos = open_at + 1
    while True:
        start = _WS.match(text, pos).end()
        if text[start] == "]":
            return TraceText(text[: open_at + 1], events, text[pos:start], text[start:])
        if events:
            assert text[start] == ",", start
            start = _WS.match(text, start + 1).end()
        value, end = dec.raw_decode(text, start)
        events.append((text[pos:start], text[start:end], value))
        pos = end


def join_trace_text(t: TraceText, keep: list[int]) -> str:
    first_sep = t.events[0][0] if t.events else ""
    parts = [t.prefix]
    for n, i in enumerate(keep):  # keep is ascending: every kept event after the first has i > 0
        sep, body, _ = t.events[i]
        parts.append((first_sep if n == 0 else sep) + body)  # sep holds the comma before event i
    parts += [t.tail, t.suffix]
    return "".join(parts)


# -- choosing the window --------------------------------------------------------------------------

def _cat(e) -> str:
    return str(e.get("cat", "")).lower()


def _corr(e):
    args = e.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def _has_ts(e) -> bool:
    return isinstance(e.get("ts"), (int, float)) and not isinstance(e.get("ts"), bool)


def select_events(values: list, t0: float, t1: float) -> list[int]:
    """Indices of the events kept for the window [t0, t1] (see the module's docstring)."""
    def in_window(e) -> bool:
        return _has_ts(e) and t0 <= e["ts"] <= t1

    launches: dict = {}
    for e in values:
        if isinstance(e, dict) and _cat(e) in LAUNCH_CATEGORIES and e.get("ph") == "X" and _corr(e) is not None:
            launches[_corr(e)] = launches.get(_corr(e), False) or in_window(e)
    keep = []
    for i, e in enumerate(values):
        if not isinstance(e, dict) or e.get("ph") == "M" or not _has_ts(e):
            keep.append(i)
        elif _cat(e) in GPU_CATEGORIES and _corr(e) in launches:
            if launches[_corr(e)]:
                keep.append(i)
        elif in_window(e):
            keep.append(i)
    return keep


def _step_spans(values: list, pattern: str) -> list[dict]:
    rx = re.compile(pattern)
    spans = [e for e in values if isinstance(e, dict) and e.get("ph") == "X" and _has_ts(e)
             and _cat(e) in ("user_annotation", "operator", "cpu_op") and rx.match(str(e.get("name", "")))]
    return sorted(spans, key=lambda e: e["ts"])


def _gzip(text: str) -> bytes:
    return gzip.compress(text.encode("utf-8", "surrogateescape"), compresslevel=9, mtime=0)


def keep_gpu_events(values: list) -> list[int]:
    """Indices of the metadata events, step annotations, GPU activities and their launches."""
    gpu_corr = {_corr(e) for e in values if isinstance(e, dict) and _cat(e) in GPU_CATEGORIES}
    keep = []
    for i, e in enumerate(values):
        if not isinstance(e, dict) or e.get("ph") == "M" or _cat(e) in GPU_CATEGORIES:
            keep.append(i)
        elif _cat(e) in LAUNCH_CATEGORIES and _corr(e) in gpu_corr:
            keep.append(i)
        elif _cat(e) in ("user_annotation", "cpu_op", "operator") and re.match(r"ProfilerStep#\d+$|step\[",
                                                                                str(e.get("name", ""))):
            keep.append(i)
    return keep


def trim_trace(raw: bytes, window: Window) -> tuple[bytes, str]:
    """(the trimmed trace, gzipped; a description of the window for SOURCES.md)."""
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8", "surrogateescape")
    t = split_trace_text(text)
    values = [v for _, _, v in t.events]
    if window.keep == "gpu":
        result = _gzip(join_trace_text(t, keep_gpu_events(values)))
        assert len(result) <= BUDGET_BYTES, (len(result), BUDGET_BYTES)
        _check_trim(text, result)
        return result, "the whole trace, its GPU activities, their launches and the step annotations kept"
    stamps = sorted(e["ts"] for e in values if isinstance(e, dict) and e.get("ph") != "M" and _has_ts(e))
    if window.step is None:
        t0, whole_end, label = stamps[0], None, "from the first event"
    else:
        spans = _step_spans(values, window.step)
        first = spans[0]
        later = [s for s in _step_spans(values, r"ProfilerStep#\d+$|step\[") if s["ts"] >= first["ts"]]
        last = later[window.steps - 1] if len(later) >= window.steps else later[-1]
        t0, whole_end = first["ts"], last["ts"] + last["dur"]
        label = f"from the start of {first['name']}"

    def build(t1: float) -> bytes:
        return _gzip(join_trace_text(t, select_events(values, t0, t1)))

    result, label = _fit_window(build, stamps, t0, whole_end, window, label)
    _check_trim(text, result)
    return result, label


def _fit_window(build, stamps: list, t0: float, whole_end: float | None, window: Window, label: str):
    """The whole step(s) when they fit the budget, else the longest window from t0 that does."""
    if whole_end is not None:
        data = build(whole_end)
        if len(data) <= BUDGET_BYTES:
            n = window.steps
            return data, f"{label} to the end of {'it' if n == 1 else f'{n} steps'} (whole); ts {t0}..{whole_end}"
    ends = [s for s in stamps if s >= t0 and (whole_end is None or s <= whole_end)]
    lo, hi = 0, len(ends) - 1  # largest index whose window still fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(build(ends[mid])) <= BUDGET_BYTES:
            lo = mid
        else:
            hi = mid - 1
    part = " (part of the step: a whole one is over the size budget)" if whole_end is not None else ""
    return build(ends[lo]), f"{label}{part}; ts {t0}..{ends[lo]} ({(ends[lo] - t0) / 1e3:.3f} ms)"


def _check_trim(original: str, trimmed_gz: bytes) -> None:
    """The trimmed file parses, has the same keys in the same order with the same values (but
    fewer events), and every kept event's text is the original's."""
    before = json.loads(original)
    text = gzip.decompress(trimmed_gz).decode("utf-8", "surrogateescape")
    after = json.loads(text)
    if isinstance(before, list):  # the array form: no keys around the events
        before, after = {"traceEvents": before}, {"traceEvents": after}
    assert list(after) == list(before)
    assert all(after[k] == before[k] for k in before if k != "traceEvents")
    kept = split_trace_text(text).events
    assert 0 < len(kept) < len(before["traceEvents"])
    assert all(body in original for _, body, _ in kept[:: max(1, len(kept) // 200)])


# -- the non-trace file that is too big ---------------------------------------------------------

def shrink_lists(value, keep: int = 2):
    if isinstance(value, list):
        return [shrink_lists(v, keep) for v in value[:keep]]
    if isinstance(value, dict):
        return {k: shrink_lists(v, keep) for k, v in value.items()}
    return value


def shrink_json(raw: bytes) -> tuple[bytes, str]:
    body = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    text = json.dumps(shrink_lists(body), separators=(",", ":"))
    return gzip.compress(text.encode(), compresslevel=9, mtime=0), "every list cut to its first 2 items (re-serialised)"


# -- writing the corpus -------------------------------------------------------------------------

def write_corpus(mirrors: Path, out: Path) -> list[dict]:
    rows = []
    for src in SOURCES:
        raw = read_blob(mirrors, src)
        if src.window is not None:
            data, trimmed = trim_trace(raw, src.window)
        elif len(raw) > BUDGET_BYTES:
            data, trimmed = shrink_json(raw)
        else:
            data, trimmed = raw, "verbatim"
        (out / src.stored).write_bytes(data)
        rows.append({"file": src.stored, "source": src.repo, "commit": src.commit, "path": src.path,
                     "licence": LICENCE[src.repo], "licence_file": "LICENSES/" + LICENCE_FILES[(src.repo, src.commit)],
                     "original_bytes": len(raw), "stored_bytes": len(data), "trimmed": trimmed,
                     "expect": src.expect, "rank": src.rank, "why": src.why})
        print(f"{len(data):>8} {src.stored}  [{trimmed}]")
    return rows


def write_licences(mirrors: Path, out: Path) -> None:
    (out / "LICENSES").mkdir(exist_ok=True)
    for (repo, commit), name in LICENCE_FILES.items():
        text = read_blob(mirrors, Source(repo, commit, "LICENSE", "", None, ""))
        (out / "LICENSES" / name).write_bytes(text)


def write_sources_md(rows: list[dict], out: Path) -> None:
    total = sum(r["stored_bytes"] for r in rows)
    traces = [r for r in rows if r["expect"] == "trace"]
    lines = [
        "# The conformance corpus: real profiler traces from other projects",
        "",
        f"{len(traces)} traces and {len(rows) - len(traces)} files that are not traces, {total / 1e6:.2f} MB in all,",
        "from the public test data of three projects. Regenerate them with `make_corpus.py` (its docstring",
        "says how files are trimmed); `manifest.json` holds the same rows for the test",
        "(tests/test_wild_traces.py). Licence texts, with their copyright lines, are in LICENSES/.",
        "",
        "The TraceLens traces come with the note that they are for testing, validation and education only,",
        "and are not benchmark figures of the hardware (tests/traces/README.md in TraceLens).",
        "",
        "| stored file | source | commit | original path | licence | bytes in its repo | bytes here | trimmed "
        "| expect | rank | why it is here |",
        "|---|---|---|---|---|---:|---:|---|---|---:|---|",
    ]
    for r in rows:
        lines.append(f"| `{r['file']}` | {r['source']} | {r['commit'][:12]} | `{r['path']}` | {r['licence']} | "
                     f"{r['original_bytes']:,} | {r['stored_bytes']:,} | {r['trimmed']} | {r['expect']} | "
                     f"{'' if r['rank'] is None else r['rank']} | {r['why'].replace('|', '/')} |")
    (out / "SOURCES.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"),
                   help="folder of git mirrors named owner+name (default /work/.mirror)")
    args = p.parse_args()
    for old in HERE.iterdir():  # the corpus is exactly what SOURCES names
        if old.is_file() and old.name not in ("make_corpus.py", "manifest.json", "SOURCES.md"):
            old.unlink()
    rows = write_corpus(args.mirrors, HERE)
    write_licences(args.mirrors, HERE)
    write_sources_md(rows, HERE)
    (HERE / "manifest.json").write_text(json.dumps({"files": rows}, indent=1) + "\n")
    print(f"{sum(r['stored_bytes'] for r in rows):,} bytes in {len(rows)} files")


if __name__ == "__main__":
    main()
