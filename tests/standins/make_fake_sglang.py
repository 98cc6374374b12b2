"""A stand-in for an SGLang checkout, for the sglang engine's tests.

SGLang cannot be installed on these machines (FACTS.md section 4: sglang 0.5.23 pins
torch==2.14.1 and a 373 MB CUDA kernel wheel; no GPU here and none of its CUDA stack on the lent
one), so the engine is tested against this throwaway git repository instead. It looks like an
SGLang checkout where the engine looks, and behaves like SGLang where the engine depends on it:

- `python/sglang/__init__.py` with `__version__`, `python/pyproject.toml` pinning the kernel
  package, `python/sglang/srt/server_args.py` with a subset of SGLang's server flags (same
  names, aliases and choices; anything else is rejected by argparse as SGLang rejects it);
- commit 1, the OLD layout: `python/sglang/bench_one_batch.py` with the flags of the early
  releases (`--profile`, `--profile-filename-prefix`), per-step `Decode.  latency:` lines, and
  one trace of the whole run written to the current directory without `_decode`;
- commit 2, the CURRENT layout (as sglang 0.5.23): `python/sglang/benchmark/one_batch.py` only,
  with `--profile-stage/-steps/-start-step/-record-shapes/-prefix`, `Decode {i}. Batch size:`
  lines, the `Decode.  median latency` line, and the decode trace written to
  $SGLANG_TORCH_PROFILER_DIR as `{prefix}_batch{bs}_input{il}_output{ol}_decode.trace.json.gz`;
- in both, `python -m sglang.launch_server` (--host/--port): GET /health, POST /generate (SSE
  when streaming), POST /start_profile and /stop_profile with SGLang's by-stage logic, one
  scheduler process per TP rank, each writing `[prefix-]{profile_id}-TP-{rank}[-DECODE]...` with
  a `step[DECODE bs=N]` span per forward, as SGLang's server profiling does.

Both append SGLang's JSONL record to --result-filename and write a REAL torch.profiler trace
(CPU ops of a tiny MLA-like decode model, with_stack=True). The model's attention runs
`python/sglang/srt/layers/attention/flashinfer_mla_backend.py`, which holds SGLang's whole-pool
cast line verbatim; `fake-gather-then-cast.patch` beside this file replaces it with a
gather-then-cast, so a patched run really does less work (no pool-sized `aten::copy_`).

Knob, for tests only: FAKE_SGLANG_NO_RESULT_FILE=1 makes the benchmark skip the JSONL (as a run
whose --result-filename is empty does), to exercise the engine's printed-lines fallback.

    python tests/standins/make_fake_sglang.py DIR   # creates DIR as a git repository
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
GATHER_PATCH = HERE / "fake-gather-then-cast.patch"
STALE_PATCH = HERE / "fake-stale-context.patch"
VERSION = "0.5.23+stand-in"
WHOLE_POOL_CAST = "k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)"

INIT = f'''"""Stand-in for sglang (tests/standins/make_fake_sglang.py): SGLang cannot be installed here."""

__version__ = "{VERSION}"
'''

PYPROJECT = '''[project]
name = "sglang"
dynamic = ["version"]
dependencies = ["torch", "sglang-kernel==0.4.10"]
'''

SERVER_ARGS = '''"""The server flags the stand-in honours: SGLang's names, aliases and choices."""

import argparse
import dataclasses

ATTENTION_BACKEND_CHOICES = ["flashinfer", "triton", "torch_native", "fa3", "flashmla", "cutlass_mla", "trtllm_mla"]
KV_CACHE_DTYPE_CHOICES = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"]
LOAD_FORMAT_CHOICES = ["auto", "pt", "safetensors", "npcache", "dummy"]


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tp_size: int = 1
    load_format: str = "auto"
    kv_cache_dtype: str = "auto"
    attention_backend: str = None
    max_total_tokens: int = None
    trust_remote_code: bool = False
    log_level: str = "info"
    host: str = "127.0.0.1"
    port: int = 30000

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--model-path", "--model", dest="model_path", type=str, required=True)
        parser.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
        parser.add_argument("--load-format", type=str, default="auto", choices=LOAD_FORMAT_CHOICES)
        parser.add_argument("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPE_CHOICES)
        parser.add_argument("--attention-backend", type=str, default=None, choices=ATTENTION_BACKEND_CHOICES)
        parser.add_argument("--max-total-tokens", type=int, default=None)
        parser.add_argument("--trust-remote-code", action="store_true")
        parser.add_argument("--log-level", type=str, default="info")
        parser.add_argument("--host", type=str, default="127.0.0.1")
        parser.add_argument("--port", type=int, default=30000)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
'''

BACKEND = f'''"""MLA decode attention, shaped like SGLang's flashinfer_mla_backend.forward_decode."""

import torch

KV_LORA_RANK = 512


class FlashInferMLAAttnBackend:
    def __init__(self, model_runner):
        self.token_to_kv_pool = model_runner.token_to_kv_pool

    def forward_decode(self, q, layer, forward_batch):
        {WHOLE_POOL_CAST}
        k = k_buffer[forward_batch.kv_indices].view(forward_batch.batch_size, -1, k_buffer.shape[-1])
        scores = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * layer.scaling, dim=-1)
        return torch.bmm(scores, k[..., :KV_LORA_RANK])
'''

MODEL_RUNNER = '''"""A tiny MLA-like decode model: per layer a BF16 projection, attention over an FP8 (or BF16)
KV pool through the attention backend, and an output projection."""

import glob
import json
import os

import torch

from sglang.srt.layers.attention.flashinfer_mla_backend import KV_LORA_RANK, FlashInferMLAAttnBackend

KV_DIM = 576
HEADS = 4
HIDDEN = 256
DEFAULT_POOL_TOKENS = 8192
# One thread: a stand-in on a shared 2-core machine times more steadily without OpenMP spinning.
torch.set_num_threads(1)


class MLATokenToKVPool:
    """FP8 pools are stored as uint8, and get_key_buffer returns a view of the whole pool."""

    def __init__(self, size, layers, kv_cache_dtype):
        self.dtype = torch.float8_e4m3fn if kv_cache_dtype.startswith("fp8") else torch.bfloat16
        gen = torch.Generator().manual_seed(0)
        if self.dtype == torch.bfloat16:
            self.kv_buffer = [torch.randn(size, KV_DIM, generator=gen).to(torch.bfloat16) for _ in range(layers)]
        else:  # below 0x70: no NaN encodings
            self.kv_buffer = [torch.randint(0, 0x70, (size, KV_DIM), generator=gen, dtype=torch.uint8)
                              for _ in range(layers)]
        self.size = size

    def get_key_buffer(self, layer_id):
        buffer = self.kv_buffer[layer_id]
        return buffer if buffer.dtype == self.dtype else buffer.view(self.dtype)


class Layer:
    def __init__(self, layer_id, gen):
        self.layer_id = layer_id
        self.scaling = KV_DIM ** -0.5
        self.w_q = (torch.randn(HIDDEN, HEADS * KV_DIM, generator=gen) * 0.02).to(torch.bfloat16)
        self.w_o = (torch.randn(HEADS * KV_LORA_RANK, HIDDEN, generator=gen) * 0.02).to(torch.bfloat16)


class ForwardBatch:
    def __init__(self, kv_indices, batch_size):
        self.kv_indices = kv_indices
        self.batch_size = batch_size


def read_model_config(server_args):
    path = os.path.join(server_args.model_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"Can't load the configuration of '{server_args.model_path}': no config.json")
    with open(path) as f:
        config = json.load(f)
    if server_args.load_format != "dummy" and not glob.glob(os.path.join(server_args.model_path, "*.safetensors")):
        raise RuntimeError(f"Cannot find any model weights with `{server_args.model_path}`")
    return config


class ModelRunner:
    def __init__(self, server_args, tp_rank=0):
        self.tp_rank = tp_rank  # every rank computes the whole (tiny) model: nothing is sharded
        config = read_model_config(server_args)
        gen = torch.Generator().manual_seed(1)
        self.layers = [Layer(i, gen) for i in range(config["num_hidden_layers"])]
        self.max_total_num_tokens = server_args.max_total_tokens or DEFAULT_POOL_TOKENS
        self.token_to_kv_pool = MLATokenToKVPool(self.max_total_num_tokens, len(self.layers),
                                                 server_args.kv_cache_dtype)
        self.attn_backend = FlashInferMLAAttnBackend(self)
        self.gen = torch.Generator().manual_seed(2)

    def max_batch_size(self, input_len, output_len):
        return self.max_total_num_tokens // (input_len + output_len)

    @torch.no_grad()
    def forward(self, hidden, batch):
        x = hidden
        for layer in self.layers:
            q = (x @ layer.w_q).view(batch.batch_size, HEADS, KV_DIM)
            o = self.attn_backend.forward_decode(q, layer, batch)
            x = o.reshape(batch.batch_size, -1) @ layer.w_o
        return x

    def extend(self, batch_size, input_len):
        rows = torch.randperm(self.max_total_num_tokens, generator=self.gen)[: batch_size * input_len]
        batch = ForwardBatch(rows, batch_size)
        hidden = torch.randn(batch_size, HIDDEN, generator=self.gen).to(torch.bfloat16)
        return self.forward(hidden, batch), batch

    def decode(self, hidden, batch):
        new = torch.randint(0, self.max_total_num_tokens, (batch.batch_size,), generator=self.gen)
        seqs = batch.kv_indices.view(batch.batch_size, -1)
        batch = ForwardBatch(torch.cat([seqs, new[:, None]], dim=1).reshape(-1), batch.batch_size)
        return self.forward(hidden, batch), batch
'''

CURRENT_BENCH = '''"""
Benchmark the latency of running a single static batch without a server (stand-in).

python -m sglang.benchmark.one_batch --model-path DIR --load-format dummy --profile ...
"""

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import time
from typing import Optional, Tuple

import torch

from sglang.srt.fake_model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


@dataclasses.dataclass
class BenchArgs:
    run_name: str = "default"
    batch_size: Tuple[int] = (1,)
    input_len: Tuple[int] = (1024,)
    output_len: Tuple[int] = (16,)
    prompt_filename: str = ""
    result_filename: str = "result.jsonl"
    correctness_test: bool = False
    cut_len: int = 4
    log_decode_step: int = 0
    profile: bool = False
    profile_record_shapes: bool = False
    profile_activities: Tuple[str] = ("CPU", "GPU")
    profile_stage: str = "all"
    profile_prefix: str = "profile"
    profile_start_step: Optional[int] = None
    profile_steps: Optional[int] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--run-name", type=str, default=BenchArgs.run_name)
        parser.add_argument("--batch-size", type=int, nargs="+", default=BenchArgs.batch_size)
        parser.add_argument("--input-len", type=int, nargs="+", default=BenchArgs.input_len)
        parser.add_argument("--output-len", type=int, nargs="+", default=BenchArgs.output_len)
        parser.add_argument("--prompt-filename", type=str, default=BenchArgs.prompt_filename)
        parser.add_argument("--result-filename", type=str, default=BenchArgs.result_filename)
        parser.add_argument("--correctness-test", action="store_true")
        parser.add_argument("--cut-len", type=int, default=BenchArgs.cut_len)
        parser.add_argument("--log-decode-step", type=int, default=BenchArgs.log_decode_step)
        parser.add_argument("--profile", action="store_true", help="Enable profiling.")
        parser.add_argument("--profile-record-shapes", action="store_true")
        parser.add_argument("--profile-activities", type=str, nargs="+", default=["CPU", "GPU"],
                            choices=["CPU", "GPU", "CUDA_PROFILER", "XPU"])
        parser.add_argument("--profile-stage", type=str, default=BenchArgs.profile_stage,
                            choices=["all", "prefill", "decode"])
        parser.add_argument("--profile-prefix", dest="profile_prefix", type=str, default=BenchArgs.profile_prefix)
        parser.add_argument("--profile-start-step", type=int, default=None)
        parser.add_argument("--profile-steps", type=int, default=None)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def start_profile(profile_activities, profile_record_shapes=False, rank_print=print):
    if "CUDA_PROFILER" in profile_activities:
        rank_print("CUDA Profiler started (nsys will begin capturing)")
        return None
    activities = []
    if "CPU" in profile_activities:
        activities.append(torch.profiler.ProfilerActivity.CPU)
    if "GPU" in profile_activities and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiler = torch.profiler.profile(activities=activities, with_stack=True, record_shapes=profile_record_shapes)
    profiler.start()
    return profiler


def stop_profile(profiler, profile_activities, rank_print=print, save_trace=False, trace_filename=None, stage=None):
    if profiler is not None:
        profiler.stop()
    if save_trace and profiler is not None and trace_filename:
        os.makedirs(os.path.dirname(os.path.abspath(trace_filename)), exist_ok=True)
        profiler.export_chrome_trace(trace_filename)
        print(profiler.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=10))
        stage_desc = f"for {stage}" if stage else ""
        rank_print(f"torch profiler chrome trace {stage_desc} saved to {trace_filename}")


def _create_torch_profiler_filename(profile_prefix, batch_size, input_len, output_len, stage):
    output_dir = os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
    filename = f"{profile_prefix}_batch{batch_size}_input{input_len}_output{output_len}_{stage}.trace.json.gz"
    return os.path.join(output_dir, filename)


def latency_test_run_once(run_name, model_runner, rank_print, batch_size, input_len, output_len,
                          log_decode_step, profile, profile_record_shapes, profile_activities, profile_prefix,
                          profile_stage, profile_start_step=None, profile_steps=None):
    if batch_size > model_runner.max_batch_size(input_len, output_len):
        rank_print(f"skipping ({batch_size}, {input_len}, {output_len}) due to max batch size limit")
        return
    measurement_results = {"run_name": run_name, "batch_size": batch_size, "input_len": input_len,
                           "output_len": output_len}
    tot_latency = 0
    enable_profile_prefill = profile and profile_stage in ["all", "prefill"]
    profiler = None
    if enable_profile_prefill:
        profiler = start_profile(profile_activities, profile_record_shapes, rank_print)
    tic = time.perf_counter()
    hidden, batch = model_runner.extend(batch_size, input_len)
    prefill_latency = time.perf_counter() - tic
    if enable_profile_prefill:
        stop_profile(profiler, profile_activities, rank_print, True,
                     _create_torch_profiler_filename(profile_prefix, batch_size, input_len, output_len, "prefill"),
                     "prefill")
    tot_latency += prefill_latency
    throughput = input_len * batch_size / prefill_latency
    rank_print(f"Prefill. latency: {prefill_latency:6.5f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["prefill_latency"] = prefill_latency
    measurement_results["prefill_throughput"] = throughput

    decode_latencies = []
    profile_start = profile_start_step if profile_start_step is not None else (output_len // 2)
    profile_end = profile_start + (profile_steps if profile_steps is not None else 1)
    enable_profile_decode = profile and profile_stage in ["all", "decode"]
    trace_filename_decode = None
    profiler = None
    for i in range(output_len - 1):
        if enable_profile_decode and i == profile_start:
            trace_filename_decode = _create_torch_profiler_filename(
                profile_prefix, batch_size, input_len, output_len, "decode")
            profiler = start_profile(profile_activities, profile_record_shapes, rank_print)
        tic = time.perf_counter()
        hidden, batch = model_runner.decode(hidden, batch)
        latency = time.perf_counter() - tic
        if enable_profile_decode and profiler is not None and i >= profile_end - 1:
            stop_profile(profiler, profile_activities, rank_print, True, trace_filename_decode, "decode")
            profiler = None
        tot_latency += latency
        throughput = batch_size / latency
        decode_latencies.append(latency)
        if i < 5 or (log_decode_step > 0 and i % log_decode_step == 0):
            rank_print(f"Decode {i}. Batch size: {batch_size}, latency: {latency:6.5f} s, throughput: {throughput:9.2f} token/s")

    if output_len > 1:
        med_decode_latency = statistics.median(decode_latencies)
        med_decode_throughput = batch_size / med_decode_latency
        rank_print(f"Decode.  median latency: {med_decode_latency:6.5f} s, median throughput: {med_decode_throughput:9.2f} token/s")
        measurement_results["median_decode_latency"] = med_decode_latency
        measurement_results["median_decode_throughput"] = med_decode_throughput

    throughput = (input_len + output_len) * batch_size / tot_latency
    rank_print(f"Total. latency: {tot_latency:6.3f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["total_latency"] = tot_latency
    measurement_results["overall_throughput"] = throughput
    return measurement_results


def latency_test(server_args, bench_args):
    rank_print = print
    if server_args.tp_size != 1:
        raise NotImplementedError("the stand-in's one-batch benchmark runs tp_size 1 only")
    model_runner = ModelRunner(server_args)
    rank_print(f"max_total_num_tokens={model_runner.max_total_num_tokens}")
    rank_print("Warmup ...")
    latency_test_run_once(bench_args.run_name, model_runner, rank_print, bench_args.batch_size[0],
                          bench_args.input_len[0], min(32, bench_args.output_len[0]), 0, False, False,
                          ("CPU", "GPU"), "", "all")
    rank_print("Benchmark ...")
    result_list = []
    for bs, il, ol in itertools.product(bench_args.batch_size, bench_args.input_len, bench_args.output_len):
        ret = latency_test_run_once(bench_args.run_name, model_runner, rank_print, bs, il, ol,
                                    bench_args.log_decode_step, bench_args.profile, bench_args.profile_record_shapes,
                                    bench_args.profile_activities, bench_args.profile_prefix,
                                    bench_args.profile_stage, bench_args.profile_start_step, bench_args.profile_steps)
        if ret is not None:
            result_list.append(ret)
    if bench_args.result_filename and os.environ.get("FAKE_SGLANG_NO_RESULT_FILE") != "1":
        with open(bench_args.result_filename, "a") as fout:
            for result in result_list:
                fout.write(json.dumps(result) + "\\n")


def cli_main():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    BenchArgs.add_cli_args(parser)
    args = parser.parse_args()
    latency_test(ServerArgs.from_cli_args(args), BenchArgs.from_cli_args(args))


if __name__ == "__main__":
    cli_main()
'''

OLD_BENCH = '''"""
Benchmark the latency of running a single static batch without a server (stand-in, early layout).

python -m sglang.bench_one_batch --model-path DIR --load-format dummy --profile
"""

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import time
from typing import Tuple

import torch

from sglang.srt.fake_model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


@dataclasses.dataclass
class BenchArgs:
    run_name: str = "default"
    batch_size: Tuple[int] = (1,)
    input_len: Tuple[int] = (1024,)
    output_len: Tuple[int] = (16,)
    result_filename: str = "result.jsonl"
    correctness_test: bool = False
    cut_len: int = 4
    profile: bool = False
    profile_filename_prefix: str = "profile"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--run-name", type=str, default=BenchArgs.run_name)
        parser.add_argument("--batch-size", type=int, nargs="+", default=BenchArgs.batch_size)
        parser.add_argument("--input-len", type=int, nargs="+", default=BenchArgs.input_len)
        parser.add_argument("--output-len", type=int, nargs="+", default=BenchArgs.output_len)
        parser.add_argument("--result-filename", type=str, default=BenchArgs.result_filename)
        parser.add_argument("--correctness-test", action="store_true")
        parser.add_argument("--cut-len", type=int, default=BenchArgs.cut_len)
        parser.add_argument("--profile", action="store_true", help="Use Torch Profiler.")
        parser.add_argument("--profile-filename-prefix", type=str, default=BenchArgs.profile_filename_prefix)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def latency_test_run_once(run_name, model_runner, rank_print, batch_size, input_len, output_len, profile,
                          profile_filename_prefix):
    if batch_size > model_runner.max_batch_size(input_len, output_len):
        rank_print(f"skipping ({batch_size}, {input_len}, {output_len}) due to max batch size limit")
        return
    measurement_results = {"run_name": run_name, "batch_size": batch_size, "input_len": input_len,
                           "output_len": output_len}
    tot_latency = 0
    profiler = None
    if profile:
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True)
        profiler.start()

    tic = time.time()
    hidden, batch = model_runner.extend(batch_size, input_len)
    prefill_latency = time.time() - tic
    tot_latency += prefill_latency
    throughput = input_len * batch_size / prefill_latency
    rank_print(f"Prefill. latency: {prefill_latency:6.5f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["prefill_latency"] = prefill_latency
    measurement_results["prefill_throughput"] = throughput

    decode_latencies = []
    for i in range(output_len - 1):
        tic = time.time()
        hidden, batch = model_runner.decode(hidden, batch)
        latency = time.time() - tic
        tot_latency += latency
        throughput = batch_size / latency
        decode_latencies.append(latency)
        if i < 5:
            rank_print(f"Decode.  latency: {latency:6.5f} s, throughput: {throughput:9.2f} token/s")

    if profile:
        profiler.stop()
        profile_filename = f"{profile_filename_prefix}_batch{batch_size}_input{input_len}_output{output_len}.trace.json.gz"
        parent_dir = os.path.dirname(os.path.abspath(profile_filename))
        os.makedirs(parent_dir, exist_ok=True)
        profiler.export_chrome_trace(profile_filename)
        rank_print(f"torch profiler chrome trace saved to {profile_filename}")

    if output_len > 1:
        med_decode_latency = statistics.median(decode_latencies)
        med_decode_throughput = batch_size / med_decode_latency
        rank_print(f"Decode.  median latency: {med_decode_latency:6.5f} s, median throughput: {med_decode_throughput:9.2f} token/s")
        measurement_results["median_decode_latency"] = med_decode_latency
        measurement_results["median_decode_throughput"] = med_decode_throughput

    throughput = (input_len + output_len) * batch_size / tot_latency
    rank_print(f"Total. latency: {tot_latency:6.3f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["total_latency"] = tot_latency
    measurement_results["overall_throughput"] = throughput
    return measurement_results


def latency_test(server_args, bench_args):
    rank_print = print
    if server_args.tp_size != 1:
        raise NotImplementedError("the stand-in's one-batch benchmark runs tp_size 1 only")
    model_runner = ModelRunner(server_args)
    rank_print(f"max_total_num_tokens={model_runner.max_total_num_tokens}")
    rank_print("Warmup ...")
    latency_test_run_once(bench_args.run_name, model_runner, rank_print, bench_args.batch_size[0],
                          bench_args.input_len[0], 8, profile=False, profile_filename_prefix="")
    rank_print("Benchmark ...")
    result_list = []
    for bs, il, ol in itertools.product(bench_args.batch_size, bench_args.input_len, bench_args.output_len):
        ret = latency_test_run_once(bench_args.run_name, model_runner, rank_print, bs, il, ol, bench_args.profile,
                                    bench_args.profile_filename_prefix)
        if ret is not None:
            result_list.append(ret)
    if bench_args.result_filename and os.environ.get("FAKE_SGLANG_NO_RESULT_FILE") != "1":
        with open(bench_args.result_filename, "a") as fout:
            for result in result_list:
                fout.write(json.dumps(result) + "\\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    BenchArgs.add_cli_args(parser)
    args = parser.parse_args()
    latency_test(ServerArgs.from_cli_args(args), BenchArgs.from_cli_args(args))
'''

FAKE_SERVER = '''"""An HTTP server shaped like SGLang's where the engine touches it: GET /health, POST /generate
(server-sent events when "stream"), POST /start_profile and /stop_profile; one scheduler process
per TP rank, each with its own torch profiler, writing its trace under the name SGLang's
profiler_manager gives it: [prefix-]{profile_id}-TP-{rank}[-EXTEND|-DECODE].trace.json.gz."""

import json
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RankProfiler:
    """profiler_manager's start/stop logic: by stage with num_steps, or num_steps forward steps."""

    def __init__(self, tp_rank):
        self.tp_rank = tp_rank
        self.req = None
        self.profiler = None
        self.forward_ct = 0

    def configure(self, req):
        self.req = dict(req)
        self.req["profile_id"] = self.req.get("profile_id") or str(time.time())
        self.prefill_ct = self.decode_ct = 0
        self.target_forward_ct = None
        if not self.req.get("profile_by_stage"):
            self.start()
            if self.req.get("num_steps"):
                self.target_forward_ct = self.forward_ct + self.req["num_steps"]

    def start(self):
        import torch

        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                               with_stack=self.req.get("with_stack") is not False,
                                               record_shapes=bool(self.req.get("record_shapes")))
        self.profiler.start()

    def stop(self, stage=None):
        if self.profiler is None:
            return
        self.profiler.stop()
        out = self.req.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        os.makedirs(out, exist_ok=True)
        prefix = self.req.get("profile_prefix")
        name = ((prefix + "-" if prefix else "") + "-".join([self.req["profile_id"], f"TP-{self.tp_rank}"])
                + (f"-{stage}" if stage else "") + ".trace.json.gz")
        self.profiler.export_chrome_trace(os.path.join(out, name))
        self.profiler = None

    def before_batch(self, mode):
        if self.req is None:
            return
        n = self.req.get("num_steps")
        if self.req.get("profile_by_stage") and n:
            if mode == "EXTEND":
                if self.prefill_ct == 0:
                    self.start()
                self.prefill_ct += 1
                if self.prefill_ct > n:
                    self.stop("EXTEND")
            else:
                if self.decode_ct == 0:
                    self.stop("EXTEND")
                    self.start()
                self.decode_ct += 1
                if self.decode_ct > n:
                    self.stop("DECODE")
                    self.req = None
        elif self.target_forward_ct is not None and self.forward_ct >= self.target_forward_ct:
            self.stop()
            self.req = None


def rank_main(server_args, tp_rank, inbox, outbox):
    try:
        import torch

        from sglang.srt.fake_model_runner import ModelRunner

        parent = os.getppid()
        runner = ModelRunner(server_args, tp_rank)
        profiler = RankProfiler(tp_rank)
        hidden = batch = None
        outbox.put(("done", tp_rank, None))
        while True:
            try:
                msg = inbox.get(timeout=1)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            kind = msg[0]
            if kind == "exit":
                return
            if kind == "start_profile":
                profiler.configure(msg[1])
            elif kind == "stop_profile":
                profiler.stop()
                profiler.req = None
            else:
                _, bs, il = msg
                profiler.before_batch(kind)
                with torch.profiler.record_function(f"step[{kind} bs={bs}]"):
                    if kind == "EXTEND":
                        hidden, batch = runner.extend(bs, il)
                    else:
                        hidden, batch = runner.decode(hidden, batch)
                profiler.forward_ct += 1
            outbox.put(("done", tp_rank, None))
    except Exception:
        outbox.put(("error", tp_rank, traceback.format_exc()))


class Scheduler:
    """Runs the TP ranks in lockstep: one batch at a time, every rank the same step."""

    def __init__(self, server_args):
        ctx = multiprocessing.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(server_args.tp_size)]
        self.procs = [ctx.Process(target=rank_main, args=(server_args, r, q, self.outbox), daemon=True)
                      for r, q in enumerate(self.inboxes)]
        for p in self.procs:
            p.start()
        self.collect()
        self.commands = queue.Queue()
        threading.Thread(target=self.loop, daemon=True).start()

    def collect(self):
        for _ in self.inboxes:
            kind, rank, detail = self.outbox.get()
            if kind == "error":
                raise RuntimeError(f"TP{rank} failed:\\n{detail}")

    def broadcast(self, msg):
        for q in self.inboxes:
            q.put(msg)
        self.collect()

    def loop(self):
        while True:
            first = self.commands.get()
            if first[0] == "control":
                self.control(first)
                continue
            time.sleep(0.05)  # let requests sent together join one batch
            reqs, controls = [first[1]], []
            while True:
                try:
                    more = self.commands.get_nowait()
                except queue.Empty:
                    break
                if more[0] == "generate":
                    reqs.append(more[1])
                else:
                    controls.append(more)
            self.run_batch(reqs)
            for c in controls:
                self.control(c)

    def control(self, command):
        _, msg, reply = command
        self.broadcast(msg)
        reply.put("ok")

    def run_batch(self, reqs):
        bs, il = len(reqs), max(r["input_len"] for r in reqs)
        steps = max(r["max_new_tokens"] for r in reqs)
        try:
            self.broadcast(("EXTEND", bs, il))
            for r in reqs:
                r["out"].put(1)
            for i in range(1, steps):
                self.broadcast(("DECODE", bs, il))
                for r in reqs:
                    if r["max_new_tokens"] > i:
                        r["out"].put(i + 1)
        except Exception as e:
            for r in reqs:
                r["out"].put(e)
        for r in reqs:
            r["out"].put(None)

    def submit(self, input_len, max_new_tokens):
        out = queue.Queue()
        self.commands.put(("generate", {"input_len": input_len, "max_new_tokens": max_new_tokens, "out": out}))
        return out

    def run_control(self, msg):
        reply = queue.Queue()
        self.commands.put(("control", msg, reply))
        return reply.get()

    def shutdown(self):
        for q in self.inboxes:
            q.put(("exit",))
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()


def make_handler(scheduler):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, code, body=b"", content_type="text/plain"):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self.reply(200 if self.path in ("/health", "/health_generate") else 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/start_profile":
                scheduler.run_control(("start_profile", body))
                return self.reply(200, b"Start profiling.\\n")
            if self.path == "/stop_profile":
                scheduler.run_control(("stop_profile",))
                return self.reply(200, b"Stop profiling. This will take some time.\\n")
            if self.path != "/generate":
                return self.reply(404)
            ids = body.get("input_ids") or [0] * len(str(body.get("text", "")).split())
            max_new = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
            out = scheduler.submit(len(ids), max_new)
            if not body.get("stream"):
                done = 0
                while (item := out.get()) is not None:
                    done = item
                meta = {"prompt_tokens": len(ids), "completion_tokens": done}
                return self.reply(200, json.dumps({"text": "x" * done, "meta_info": meta}).encode(),
                                  "application/json")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            while (item := out.get()) is not None:
                if isinstance(item, Exception):
                    chunk = {"error": {"message": str(item)}}
                else:
                    chunk = {"text": "x" * item, "meta_info": {"prompt_tokens": len(ids), "completion_tokens": item}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\\n\\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\\n\\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def launch_server(server_args):
    scheduler = Scheduler(server_args)
    httpd = ThreadingHTTPServer((server_args.host, server_args.port), make_handler(scheduler))
    httpd.daemon_threads = True

    def on_sigterm(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_sigterm)
    print("The server is fired up and ready to roll!", flush=True)
    try:
        httpd.serve_forever()
    finally:
        scheduler.shutdown()
'''

LAUNCH_SERVER = '''"""Launch the (stand-in) server: python -m sglang.launch_server --model-path DIR ..."""

import argparse

from sglang.srt.fake_server import launch_server
from sglang.srt.server_args import ServerArgs

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    launch_server(ServerArgs.from_cli_args(parser.parse_args()))
'''

COMMON_FILES = {
    "python/pyproject.toml": PYPROJECT,
    "python/sglang/__init__.py": INIT,
    "python/sglang/srt/__init__.py": "",
    "python/sglang/srt/server_args.py": SERVER_ARGS,
    "python/sglang/srt/fake_model_runner.py": MODEL_RUNNER,
    "python/sglang/srt/fake_server.py": FAKE_SERVER,
    "python/sglang/launch_server.py": LAUNCH_SERVER,
    "python/sglang/srt/layers/__init__.py": "",
    "python/sglang/srt/layers/attention/__init__.py": "",
    "python/sglang/srt/layers/attention/flashinfer_mla_backend.py": BACKEND,
}
OLD_FILES = {"python/sglang/bench_one_batch.py": OLD_BENCH}
CURRENT_FILES = {"python/sglang/benchmark/__init__.py": "", "python/sglang/benchmark/one_batch.py": CURRENT_BENCH}


@dataclass(frozen=True)
class FakeSglang:
    path: Path
    old_sha: str  # commit 1: sglang.bench_one_batch, early flags
    current_sha: str  # commit 2: sglang.benchmark.one_batch only, as sglang 0.5.23


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "stand-in", "GIT_AUTHOR_EMAIL": "stand-in@example.invalid",
           "GIT_COMMITTER_NAME": "stand-in", "GIT_COMMITTER_EMAIL": "stand-in@example.invalid",
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True)
    return done.stdout.strip()


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_fake_sglang(path: Path) -> FakeSglang:
    """Create a git repository at `path` (must not exist or be empty) with the two layouts."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    _write(path, {**COMMON_FILES, **OLD_FILES})
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "stand-in: early layout (sglang.bench_one_batch)")
    old_sha = _git(path, "rev-parse", "HEAD")
    (path / "python/sglang/bench_one_batch.py").unlink()
    _write(path, CURRENT_FILES)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "stand-in: current layout (sglang.benchmark.one_batch)")
    return FakeSglang(path, old_sha, _git(path, "rev-parse", "HEAD"))


def write_model_config(directory: Path, layers: int = 2) -> Path:
    """A model directory with only config.json, for --load-format dummy."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": layers, "hidden_size": 256,
              "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_fake_sglang.py DIR")
    made = make_fake_sglang(Path(sys.argv[1]))
    print(f"{made.path}\nold {made.old_sha}\ncurrent {made.current_sha}")
