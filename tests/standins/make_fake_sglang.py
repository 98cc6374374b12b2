"""A stand-in for an SGLang checkout, for the sglang engine's tests.

SGLang cannot be installed on these machines (FACTS.md section 4: sglang 0.5.23 pins
torch==2.14.1 and a 373 MB CUDA kernel wheel; no GPU here and none of its CUDA stack on the lent
one), so the engine is tested against this throwaway git repository instead. It looks like an
SGLang checkout where the engine looks, and behaves like sglang 0.5.23 where the engine depends
on it. Each piece below names the file (and lines) of the 0.5.23 wheel it mirrors; what a CPU
cannot reproduce is said where it matters.

The repository has two commits:
- commit 1, an OLDER release: `python/sglang/bench_one_batch.py` with the early flags
  (`--profile`, `--profile-filename-prefix`), per-step `Decode.  latency:` lines, one trace of
  the whole run written to the current directory without `_decode`; `__version__` written in
  `python/sglang/version.py`; no step spans; a by-stage server profiler that does not read
  SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS (its `srt/environ.py` does not declare it);
- commit 2, tagged `v0.5.23`, the CURRENT layout: `python/sglang/benchmark/one_batch.py` only,
  with `--profile-stage/-steps/-start-step/-record-shapes/-prefix`, `Decode {i}. Batch size:`
  lines, the `Decode.  median latency` line, the decode trace written to
  $SGLANG_TORCH_PROFILER_DIR as `{prefix}_batch{bs}_input{il}_output{ol}_decode.trace.json.gz`;
  a setuptools-scm version (`python/sglang/version.py` holds no number: the tag is the version);
  SGLang's step spans; the decode-capture variable.

In both, `python -m sglang.launch_server` (--host/--port) serves GET /health, POST /generate
(server-sent events when streaming), POST /start_profile and /stop_profile, with one scheduler
process per TP rank, and models what the engine's server path depends on:
- the scheduler's batching (`scheduler.py` event_loop_normal, get_next_batch_to_run): each loop
  takes the requests that have arrived, runs a prefill (EXTEND) batch of the waiting ones first
  if there are any, else one decode step of the running batch; requests that arrive at different
  times are prefilled in separate EXTEND batches, between decode steps of the earlier ones;
- the profiler manager's by-stage counting (`profiler_manager.py:413-457`), including the lost
  decode trace (a late prefill saves the decode capture as -EXTEND; /stop_profile then answers
  500) and, in commit 2, its remedy SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS;
- SGLang's step spans (commit 2): every ModelRunner.forward inside
  `torch.profiler.record_function(build_step_span_name(...))`, `step[EXTEND bs=N toks=T]`,
  `step[DECODE bs=N]`, `step[MIXED bs=N]`, `step[IDLE bs=0]` and, with speculative decoding,
  `step[VERIFY bs=N]` and `step[DRAFT bs=N]` inside `draft` / `draft_extend` stage spans, in
  one-batch and server runs alike, with decode and verify under a CUDA-graph-like shape
  (`--disable-cuda-graph`, deprecated in 0.5.23 but accepted, turns it off);
- the server's arguments: sglang 0.5.23's whole set when make_fake_sglang is given it (read from
  the wheel, tests/sglang_wheel.py), else a built-in few; unknown ones refused as argparse does;
  `/generate` refuses unknown sampling parameters with 400 (api_contract.py);
- the model directory: config.json with its model_type and a tokenizer, even with
  `--load-format dummy` (write_model_config writes both);
- DP attention (`--attn-dp-size`): each DP rank's own batch and profiler, files -TP-{tp}-DP-{dp}.

Sweeps (lists), as sglang 0.5.23's python/sglang/benchmark/one_batch.py does them, checked against the
wheel's source: `--batch-size`, `--input-len` and `--output-len` take several values (`nargs="+"`,
BenchArgs.add_cli_args); ONE process loads the model, warms up once on the first batch size and input
length (output min(32, first output len), not profiled: latency_test, lines 924-945), then runs
`itertools.product(batch_size, input_len, output_len)` in that order, the batch size outermost (line
958); each combination writes its own decode trace
`{prefix}_batch{bs}_input{il}_output{ol}_decode.trace.json.gz` in $SGLANG_TORCH_PROFILER_DIR
(_create_torch_profiler_filename, lines 663-668) and its own JSONL record (run_name, batch_size,
input_len, output_len, prefill_latency, prefill_throughput, median_decode_latency,
median_decode_throughput, total_latency, overall_throughput; lines 782-888), all records appended
at the end, in loop order (lines 1004-1007); a combination whose batch exceeds the pool
(`max_total_num_tokens // (input_len + output_len)`, which `--max-total-tokens` sets) prints
`skipping (bs, il, ol) due to max batch size limit` and writes neither (lines 769-775). The one
`--profile-start-step` applies to every combination. What the real JSONL does not hold, the
stand-in does not either: no GPU memory figure.

Both benchmarks append SGLang's JSONL record to --result-filename and write REAL torch.profiler
traces (CPU ops of a tiny MLA-like decode model, with_stack=True). The model's attention runs
`python/sglang/srt/layers/attention/flashinfer_mla_backend.py`, which holds SGLang's whole-pool
cast line verbatim; `fake-gather-then-cast.patch` beside this file replaces it with a
gather-then-cast, so a patched run really does less work (no pool-sized `aten::copy_`).

Knobs, for tests only (they are not SGLang's):
- FAKE_SGLANG_NO_RESULT_FILE=1: the benchmark skips the JSONL (as a run whose
  --result-filename is empty does), to exercise the engine's printed-lines fallback;
- FAKE_SGLANG_BURST=n and FAKE_SGLANG_STAGGER_STEPS=g: the server holds /generate requests
  until n have come, then lets them reach the scheduler g scheduler steps apart (0: together).
  Real SGLang admits each request when it arrives, so its batches depend on timing; the knobs
  give a test one batch structure every time, on a loaded machine too.

    python tests/standins/make_fake_sglang.py DIR   # creates DIR as a git repository
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:  # run as a script: the repository root, for `ingest`
    sys.path.insert(0, str(HERE.parents[1]))

from ingest.runs.engines.sglang_choices import (  # noqa: E402  (0.5.23's lists, checked against the wheel)
    ATTENTION_BACKEND_CHOICES,
    KV_CACHE_DTYPE_CHOICES,
    LOAD_FORMAT_CHOICES,
)

GATHER_PATCH = HERE / "fake-gather-then-cast.patch"
# sglang/api/v1/api_types.py:1256 _FIELDS_SamplingParams, in its order (tests/test_sglang_flags.py
# checks it against the wheel)
SAMPLING_PARAMS_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
                          "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
                          "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
                          "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                          "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
                          "watermark", "choice")
STALE_PATCH = HERE / "fake-stale-context.patch"
CURRENT_VERSION = "0.5.23"  # commit 2's tag, v0.5.23
OLD_VERSION = "0.4.0"  # commit 1's python/sglang/version.py
WHOLE_POOL_CAST = "k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id).to(q.dtype)"

INIT = '''"""Stand-in for sglang (tests/standins/make_fake_sglang.py): SGLang cannot be installed here."""

from sglang.version import __version__  # noqa: F401
'''

OLD_VERSION_PY = f'''__version__ = "{OLD_VERSION}"
'''

# sglang 0.5.23's python/sglang/version.py: no number in the tree. The version comes from the
# generated _version.py of a build, else the INSTALLED package's metadata, else setuptools-scm on
# the git tags. A probe that imports sglang from a fresh worktree (no _version.py) thus reports
# the installed package's version, not the checkout's.
CURRENT_VERSION_PY = '''try:
    from sglang._version import __version__
except ImportError:
    try:
        import importlib.metadata

        __version__ = importlib.metadata.version("sglang")
    except Exception:
        try:
            import pathlib

            from setuptools_scm import get_version

            __version__ = get_version(root=str(pathlib.Path(__file__).parent.parent.parent),
                                      fallback_version="0.0.0.dev0")
        except Exception:
            __version__ = "0.0.0.dev0"
'''

OLD_PYPROJECT = f'''[project]
name = "sglang"
version = "{OLD_VERSION}"
dependencies = ["torch", "sgl-kernel==0.1.0"]
'''

CURRENT_PYPROJECT = '''[project]
name = "sglang"
dynamic = ["version"]
dependencies = ["torch", "sglang-kernel==0.4.10"]

[tool.setuptools_scm]
root = ".."
version_file = "sglang/_version.py"
'''

# sglang/srt/environ.py, the few variables the stand-in reads (0.5.23: lines 143-158 parse,
# 458 SGLANG_PROFILE_V2, 462 SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS). Commit 1 lacks the last.
ENVIRON = '''"""SGLang's environment variables (stand-in for sglang/srt/environ.py): the few it reads."""

import os


class EnvField:
    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name

    def get(self):
        value = os.getenv(self.name)
        if value is None:
            return self.default
        try:
            return self.parse(value)
        except ValueError:
            return self.default


class EnvBool(EnvField):
    def parse(self, value):
        value = value.lower()
        if value in ["true", "1", "yes", "y"]:
            return True
        if value in ["false", "0", "no", "n"]:
            return False
        raise ValueError(value)


class EnvInt(EnvField):
    def parse(self, value):
        return int(value)


class Envs:
    SGLANG_PROFILE_WITH_STACK = EnvBool(True)
    SGLANG_PROFILE_RECORD_SHAPES = EnvBool(True)
    SGLANG_PROFILE_V2 = EnvBool(False)
__DECODE_MIN_BS_FIELD__

envs = Envs()
'''
DECODE_MIN_BS_FIELD = '''    # profile_by_stage: do not start the decode-stage capture until a decode batch
    # reaches this many requests (0 = first decode batch).
    SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS = EnvInt(0)
'''

# The server flags the stand-in declares, one dict each: the argparse call sglang 0.5.23 makes for
# it (names, dest, action, nargs, type, choices, required). make_fake_sglang(server_flags=...)
# takes the release's whole set, read from the wheel's sources at test time
# (tests/sglang_wheel.py read_server_flags: the fields of sglang/srt/arg_groups/fields/*.py as
# arg_utils.py:298-417 turns them into flags, and server_args.py:351-441's own add_argument
# calls); without it (no wheel: no network) the stand-in declares only these, each as 0.5.23
# declares it (tests/test_sglang_flags.py checks them against the wheel).
def _flag(names, dest=None, action="store", type="str", nargs=None, choices=None, required=False, const=None):
    return {"names": list(names), "dest": dest or names[0][2:].replace("-", "_"), "action": action, "type": type,
            "nargs": nargs, "choices": list(choices) if choices else None, "required": required, "const": const}


BUILT_IN_SERVER_FLAGS = [
    _flag(["--model-path", "--model"], "model_path", required=True),  # fields/model.py
    _flag(["--tokenizer-path"]),
    _flag(["--tp-size", "--tensor-parallel-size"], "tp_size", type="int"),  # fields/parallel.py
    _flag(["--dp-size", "--data-parallel-size"], "dp_size", type="int"),
    _flag(["--attn-dp-size", "--attention-data-parallel-size"], "attn_dp_size", type="int"),
    _flag(["--enable-dp-attention"], action="store_true"),  # server_args.py:418 (deprecated)
    _flag(["--load-format"], choices=LOAD_FORMAT_CHOICES),
    _flag(["--kv-cache-dtype"], choices=KV_CACHE_DTYPE_CHOICES),
    _flag(["--attention-backend"], choices=ATTENTION_BACKEND_CHOICES),
    _flag(["--max-total-tokens"], type="human_int"),  # fields/schedule.py:39-50
    _flag(["--max-running-requests"], type="int"),
    _flag(["--max-prefill-tokens"], type="human_int"),
    _flag(["--enable-mixed-chunk"], action="store_true"),
    _flag(["--disable-cuda-graph"], action="store_true"),  # server_args.py:410 (deprecated)
    _flag(["--trust-remote-code"], action="store_true"),
    _flag(["--skip-tokenizer-init"], action="store_true"),
    _flag(["--log-level"]),
    _flag(["--host"]),
    _flag(["--port"], type="int"),
    _flag(["--speculative-algorithm"]),  # fields/spec.py:31-74
    _flag(["--speculative-draft-model-path", "--speculative-draft-model"], "speculative_draft_model_path"),
    _flag(["--speculative-draft-load-format"], choices=LOAD_FORMAT_CHOICES),
    _flag(["--speculative-num-steps"], type="int"),
    _flag(["--speculative-eagle-topk"], type="int"),
    _flag(["--speculative-num-draft-tokens"], type="int"),
]

SERVER_ARGS = '''"""The server flags of the stand-in: sglang 0.5.23's (SERVER_FLAGS, written by
tests/standins/make_fake_sglang.py), declared with argparse as ServerArgs.add_cli_args declares
them, so an unknown flag, a missing value, a value outside a flag's choices or a non-number for a
number is refused as SGLang's argparse refuses it (exit 2). The stand-in honours the few in
HONOURED; it takes and ignores every other."""

import argparse
import json
import re

SERVER_FLAGS = json.loads(__SERVER_FLAGS__)


def human_readable_int(value):
    """utils/common.py:3394-3430: an integer, or one with an SI (k, M, G, T) or IEC (Ki .. Ti) suffix."""
    value = value.strip()
    match = re.fullmatch(r"(\\d+(?:\\.\\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
            return int(number) * {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[suffix]
        return int(float(number) * {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}[suffix])
    return int(value)


TYPES = {"int": int, "float": float, "str": str, "human_int": human_readable_int}

# what the stand-in does something with, and its default when the flag is not given
HONOURED = {"model_path": None, "tokenizer_path": None, "tp_size": 1, "dp_size": 1, "attn_dp_size": 1,
            "enable_dp_attention": False, "load_format": "auto",
            "kv_cache_dtype": "auto", "attention_backend": None, "max_total_tokens": None,
            "max_running_requests": None, "max_prefill_tokens": 16384, "enable_mixed_chunk": False,
            "disable_cuda_graph": False, "trust_remote_code": False, "skip_tokenizer_init": False,
            "log_level": "info", "host": "127.0.0.1", "port": 30000, "speculative_algorithm": None,
            "speculative_draft_model_path": None, "speculative_draft_load_format": None,
            "speculative_num_steps": None, "speculative_eagle_topk": None, "speculative_num_draft_tokens": None}


class ServerArgs:
    def __init__(self, **values):
        for name, default in HONOURED.items():
            value = values.get(name)
            setattr(self, name, default if value is None else value)
        self.tokenizer_path = self.tokenizer_path or self.model_path

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        for flag in SERVER_FLAGS:
            kwargs = {"dest": flag["dest"]}
            if flag["action"] == "store_true":
                kwargs["action"] = "store_true"
            elif flag["action"] == "boolean_optional":
                kwargs["action"] = argparse.BooleanOptionalAction
            else:
                kwargs["type"] = TYPES[flag["type"]]
                if flag["nargs"] is not None:
                    kwargs["nargs"] = flag["nargs"]
                if flag["choices"] is not None:
                    kwargs["choices"] = flag["choices"]
                if flag["required"]:
                    kwargs["required"] = True
                if flag.get("const") is not None and flag["nargs"] == "?":
                    kwargs["const"] = flag["const"]
            parser.add_argument(*flag["names"], **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace):
        return cls(**{name: getattr(args, name, None) for name in HONOURED})
'''


def write_server_args(server_flags=None) -> str:
    """The stand-in's python/sglang/srt/server_args.py, declaring `server_flags` (the release's,
    from tests/sglang_wheel.py read_server_flags) or BUILT_IN_SERVER_FLAGS."""
    flags = BUILT_IN_SERVER_FLAGS if server_flags is None else server_flags
    return SERVER_ARGS.replace("__SERVER_FLAGS__", repr(json.dumps(flags)))


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

# Commit 2: sglang 0.5.23's step span. ModelRunner.forward (model_executor/model_runner.py:1831-1838)
# enters profile_range(build_step_span_name(forward_batch, is_draft_worker=...)); profile_range
# (utils/nvtx_utils.py:84-97) is a torch record_function while a profiler runs and nothing
# otherwise; build_step_span_name (utils/profile_utils.py:462-505) names it `step[DRAFT bs={bs}]`
# for every forward of a draft model runner (:485-486), `step[VERIFY bs={bs}]` for the target's
# TARGET_VERIFY (:487-488), `step[EXTEND bs={bs} toks={extend_num_tokens}]` for EXTEND (:491-493)
# and `step[{mode.name} bs={bs}]` for every other mode (DECODE, IDLE, MIXED, ...); the
# detailed-annotation suffix only with a detailed_annotations profile, which the engine does not
# ask for. Speculative decoding's coarse stages are spans named `draft` and `draft_extend`
# (speculative/spec_utils.py:852-856 spec_stage_span, entered at eagle_worker_v2.py:1478,1501,1593).
STEP_SPAN_CURRENT = '''"""The step span around every ModelRunner.forward (stand-in for sglang 0.5.23's
utils/profile_utils.py build_step_span_name and utils/nvtx_utils.py profile_range), and the
speculative stage spans (speculative/spec_utils.py spec_stage_span)."""

from contextlib import nullcontext

import torch


def build_step_span_name(forward_batch, is_draft_worker=False):
    bs = forward_batch.batch_size
    mode = forward_batch.forward_mode
    if is_draft_worker:
        stage = "DRAFT"
    elif mode == "TARGET_VERIFY":
        stage = "VERIFY"
    else:
        stage = mode
    if mode == "EXTEND":
        return f"step[{stage} bs={bs} toks={forward_batch.extend_num_tokens or 0}]"
    return f"step[{stage} bs={bs}]"


def profile_range(name):
    if not torch.autograd._profiler_enabled():
        return nullcontext()
    return torch.profiler.record_function(name)


def step_span(forward_batch, is_draft_worker=False):
    return profile_range(build_step_span_name(forward_batch, is_draft_worker))


def spec_stage_span(name):
    return profile_range(name)


# torch 2.13 imports torch.profiler._cupti_monitor on the first record_function. Imported inside a
# with_stack profile, that module's frames get names key_averages() cannot decode (UnicodeDecodeError
# in about one run in four here), so one span is entered before any profile starts.
with torch.profiler.record_function("stand-in warm-up"):
    pass
'''
STEP_SPAN_OLD = '''"""Releases before build_step_span_name wrapped no span around ModelRunner.forward (stand-in)."""

from contextlib import nullcontext


def step_span(forward_batch, is_draft_worker=False):
    return nullcontext()


def spec_stage_span(name):
    return nullcontext()
'''

MODEL_RUNNER = '''"""A tiny MLA-like model run the way SGLang's ModelRunner runs one: per layer a BF16 projection,
attention over an FP8 (or BF16) KV pool through the attention backend, and an output projection.

The shape of a step, as sglang 0.5.23 has it (what the traces show):
- outside the step span: the batch's preparation (prepare_for_extend / prepare_for_decode and
  ForwardBatch.init_new allocate KV rows and build indices) and, after the forward, sample();
- inside it (model_runner.py:1831): the forward; a decode batch replays a CUDA graph
  (decode_cuda_graph_runner.py: can_run_graph :845, _copy_replay_inputs :1908), so its span
  covers only the copy of the inputs into the graph's buffers and the launch, while prefill
  runs eagerly inside its span.

What a CPU cannot reproduce: on a GPU the replayed graph's kernels run on the device after the
span has closed, while the host goes on to launch sample(); Kineto links them to the
cudaGraphLaunch inside the span (correlation ids) and copies the span onto the GPU timeline
(gpu_user_annotation). Torch's profiler on a CPU records only the thread that started it (ops
of another thread are not captured), so here the launched work runs on the host thread when the
host first waits for its result (sample(), the host's sync point), right after the span: the
trace has the host-side shape of a graph replay (a short span, the model's ops after it), but no
kernel rows, no launch-to-kernel correlation and no gpu_user_annotation. Requests of different
lengths are padded to the longest (the backend views the indices as [bs, len, dim]; SGLang's
kernels take ragged indices), and there is no radix cache (toks counts every input token).
"""

import glob
import json
import os

import torch

from sglang.srt.fake_step_span import spec_stage_span, step_span
from sglang.srt.layers.attention.flashinfer_mla_backend import KV_LORA_RANK, FlashInferMLAAttnBackend

KV_DIM = 576
HEADS = 4
HIDDEN = 256
DEFAULT_POOL_TOKENS = 8192
CUDA_GRAPH_MAX_BS = 256
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


class Req:
    """One request's state on a rank: its KV rows and its last hidden state."""

    def __init__(self, rid, input_len):
        self.rid = rid
        self.input_len = input_len
        self.rows = None
        self.hidden = None


class ForwardBatch:
    """What one forward reads: its mode (a ForwardMode name: EXTEND, DECODE, TARGET_VERIFY,
    DRAFT_EXTEND_V2, IDLE, MIXED; forward_batch_info.py:198-222), batch size, new tokens and KV
    indices."""

    def __init__(self, forward_mode, reqs):
        self.forward_mode = forward_mode
        self.batch_size = len(reqs)
        self.extend_num_tokens = sum(r.input_len for r in reqs) if forward_mode == "EXTEND" else None
        longest = max(len(r.rows) for r in reqs)
        self.kv_indices = torch.cat([torch.cat([r.rows, r.rows[:1].expand(longest - len(r.rows))]) for r in reqs])


class IdleBatch:
    forward_mode = "IDLE"
    batch_size = 0
    extend_num_tokens = None


class LaunchedWork:
    """Work launched on the (stand-in) device: it runs when the host first waits for it."""

    def __init__(self, run):
        self._run = run
        self._out = None

    def wait(self):
        if self._run is not None:
            self._out, self._run = self._run(), None
        return self._out


class CudaGraphRunner:
    """Decode under CUDA graphs, as the host sees it: replay copies the batch's inputs into the
    graph's static buffers and launches the captured forward; the work runs after the span."""

    def __init__(self, model_runner):
        self.model_runner = model_runner
        self.static_hidden = torch.zeros(CUDA_GRAPH_MAX_BS, HIDDEN, dtype=torch.bfloat16)

    def can_run_graph(self, forward_batch):
        # ForwardMode.is_cuda_graph (forward_batch_info.py:275-279): DECODE, TARGET_VERIFY, IDLE
        mode = forward_batch.forward_mode
        return mode in ("DECODE", "TARGET_VERIFY") and forward_batch.batch_size <= CUDA_GRAPH_MAX_BS

    def replay(self, forward_batch, hidden):
        static = self.static_hidden[: forward_batch.batch_size]
        static.copy_(hidden)
        return LaunchedWork(lambda: self.model_runner.forward_raw(forward_batch, static))


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def read_model_config(model_path, load_format):
    """ModelConfig.from_server_args (benchmark/one_batch.py:332; transformers' AutoConfig): a
    config.json with a model_type, even with --load-format dummy (dummy skips the weights only)."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"Can't load the configuration of '{model_path}': no config.json")
    with open(path) as f:
        config = json.load(f)
    if "model_type" not in config:
        raise ValueError(f"Unrecognized model in {model_path}. Should have a `model_type` key in its config.json")
    if load_format != "dummy" and not glob.glob(os.path.join(model_path, "*.safetensors")):
        raise RuntimeError(f"Cannot find any model weights with `{model_path}`")
    return config


def get_tokenizer(tokenizer_path):
    """get_tokenizer (one_batch.py:374-378, the server's tokenizer manager too): transformers'
    AutoTokenizer needs the tokenizer's files in the directory, weights or not."""
    if not any(os.path.isfile(os.path.join(tokenizer_path, name)) for name in TOKENIZER_FILES):
        raise OSError(f"Can't load tokenizer for '{tokenizer_path}'. Otherwise, make sure '{tokenizer_path}' is the "
                      "correct path to a directory containing all relevant files for a tokenizer.")
    return tokenizer_path


class ModelRunner:
    def __init__(self, server_args, tp_rank=0, is_draft_worker=False):
        self.tp_rank = tp_rank  # every rank computes the whole (tiny) model: nothing is sharded
        self.is_draft_worker = is_draft_worker
        if is_draft_worker:  # an EAGLE/MTP draft: one layer (num_nextn_predict_layers)
            path = server_args.speculative_draft_model_path or server_args.model_path
            config = read_model_config(path, server_args.speculative_draft_load_format or server_args.load_format)
            layers = config.get("num_nextn_predict_layers") or 1
        else:
            config = read_model_config(server_args.model_path, server_args.load_format)
            layers = config["num_hidden_layers"]
        gen = torch.Generator().manual_seed(3 if is_draft_worker else 1)
        self.layers = [Layer(i, gen) for i in range(layers)]
        self.max_total_num_tokens = server_args.max_total_tokens or DEFAULT_POOL_TOKENS
        self.token_to_kv_pool = MLATokenToKVPool(self.max_total_num_tokens, len(self.layers),
                                                 server_args.kv_cache_dtype)
        self.attn_backend = FlashInferMLAAttnBackend(self)
        self.graph_runner = None if server_args.disable_cuda_graph else CudaGraphRunner(self)
        self.gen = torch.Generator().manual_seed(2)

    def max_batch_size(self, input_len, output_len):
        return self.max_total_num_tokens // (input_len + output_len)

    @torch.no_grad()
    def forward_raw(self, forward_batch, hidden):
        x = hidden
        for layer in self.layers:
            q = (x @ layer.w_q).view(forward_batch.batch_size, HEADS, KV_DIM)
            o = self.attn_backend.forward_decode(q, layer, forward_batch)
            x = o.reshape(forward_batch.batch_size, -1) @ layer.w_o
        return x

    def forward(self, forward_batch, hidden):
        """ModelRunner.forward: the step span around the forward; a decode batch replays the graph."""
        with step_span(forward_batch, self.is_draft_worker):
            if self.graph_runner is not None and self.graph_runner.can_run_graph(forward_batch):
                return self.graph_runner.replay(forward_batch, hidden)
            return self.forward_raw(forward_batch, hidden)

    @torch.no_grad()
    def sample(self, output, reqs):
        """ModelRunner.sample, after the span: waits for the forward's output, picks the tokens."""
        x = output.wait() if isinstance(output, LaunchedWork) else output
        for req, row in zip(reqs, x):
            req.hidden = row
        return torch.argmax(x.float(), dim=-1)

    def synchronize(self):
        """Nothing is left running once sample() has the output (the host waited for it there)."""

    def extend(self, reqs):
        """A prefill batch: each request's KV rows (prepare_for_extend), the forward, sample."""
        for req in reqs:
            req.rows = torch.randperm(self.max_total_num_tokens, generator=self.gen)[: req.input_len]
        hidden = torch.randn(len(reqs), HIDDEN, generator=self.gen).to(torch.bfloat16)
        return self.sample(self.forward(ForwardBatch("EXTEND", reqs), hidden), reqs)

    def mixed(self, new, running):
        """A MIXED batch (--enable-mixed-chunk): the new requests' prefill and the running ones'
        decode step in one forward, `step[MIXED bs=N]` (profile_utils.py:491-495: no toks)."""
        for req in new:
            req.rows = torch.randperm(self.max_total_num_tokens, generator=self.gen)[: req.input_len]
        self.add_decode_rows(running)
        fresh = torch.randn(len(new), HIDDEN, generator=self.gen).to(torch.bfloat16)
        hidden = torch.cat([fresh] + ([torch.stack([r.hidden for r in running])] if running else []))
        return self.sample(self.forward(ForwardBatch("MIXED", new + running), hidden), new + running)

    def idle(self):
        """An IDLE forward of a DP rank without requests while others run (`step[IDLE bs=0]`)."""
        with step_span(IdleBatch(), self.is_draft_worker):
            pass

    def add_decode_rows(self, reqs):
        new = torch.randint(0, self.max_total_num_tokens, (len(reqs),), generator=self.gen)
        for req, row in zip(reqs, new):
            req.rows = torch.cat([req.rows, row[None]])

    def decode(self, reqs):
        """A decode batch: one new KV row each (prepare_for_decode), the forward, sample."""
        self.add_decode_rows(reqs)
        hidden = torch.stack([req.hidden for req in reqs])
        return self.sample(self.forward(ForwardBatch("DECODE", reqs), hidden), reqs)


class EagleWorker:
    """Speculative decoding as sglang 0.5.23's EAGLEWorkerV2 runs it (speculative/eagle_worker_v2.py;
    EAGLE, EAGLE3, NEXTN and STANDALONE take this path), around a target and a draft ModelRunner:

    - prefill (_forward_prefill_batch :1540-1595): the target's EXTEND forward, then inside the
      `draft_extend` stage span the draft's forward (`step[DRAFT ...]`, :1062);
    - one decode iteration (forward_batch_generation :1444-1510): inside the `draft` stage span
      (:1478) the draft proposes (draft :660-740): under CUDA graphs one replay of the draft
      graph, which bypasses ModelRunner.forward and so has no step span (:692-695), else
      speculative_num_steps - 1 draft forwards, each `step[DRAFT bs=N]` (draft_forward :780-847);
      then the target verifies the tree in one TARGET_VERIFY forward, `step[VERIFY bs=N]`
      (verify :1979, a CUDA-graph mode); then inside the `draft_extend` stage span (:1501) the
      draft extends over the accepted tokens (_draft_extend_for_decode :1205-1213): a graph
      replay (no step span), else one draft forward, `step[DRAFT bs=N]`.

    What is not modelled: acceptance. The stand-in's draft is random (as a --load-format dummy
    draft is), so each iteration accepts no draft token and emits the bonus token only: one
    token per request per iteration, as a plain decode step; a real draft emits 1 to
    speculative_num_draft_tokens tokens per iteration. The draft graph's work runs when the
    verify's sample() waits (the tree it feeds is the verify's input); the draft-extend graph's
    when the scheduler processes the result, right after its stage span."""

    def __init__(self, server_args, tp_rank=0):
        self.target = ModelRunner(server_args, tp_rank)
        self.draft_runner = ModelRunner(server_args, tp_rank, is_draft_worker=True)
        # SGLang picks these per model when unset (speculative_hook.py); the stand-in: 3 steps, topk 1
        self.num_steps = server_args.speculative_num_steps or 3

    def extend(self, reqs):
        out = self.target.extend(reqs)
        hidden = torch.stack([req.hidden for req in reqs])
        with spec_stage_span("draft_extend"):
            self.draft_runner.forward(ForwardBatch("DRAFT_EXTEND_V2", reqs), hidden)
        return out

    def _draft_work(self, forward_batch, hidden, forwards):
        def run():
            x = hidden
            for _ in range(forwards):
                x = self.draft_runner.forward_raw(forward_batch, x)
            return x
        return run

    def decode(self, reqs):
        self.target.add_decode_rows(reqs)
        hidden = torch.stack([req.hidden for req in reqs])
        draft_graph = self.draft_runner.graph_runner
        with spec_stage_span("draft"):
            batch = ForwardBatch("DECODE", reqs)
            if draft_graph is not None:
                draft_graph.static_hidden[: len(reqs)].copy_(hidden)
                proposal = LaunchedWork(self._draft_work(batch, draft_graph.static_hidden[: len(reqs)],
                                                         self.num_steps - 1))
            else:
                proposal = hidden
                for _ in range(self.num_steps - 1):
                    proposal = self.draft_runner.forward(batch, proposal)
        verified = self.target.forward(ForwardBatch("TARGET_VERIFY", reqs), hidden)
        if isinstance(proposal, LaunchedWork):
            proposal.wait()
        out = self.target.sample(verified, reqs)
        with spec_stage_span("draft_extend"):
            batch = ForwardBatch("DRAFT_EXTEND_V2", reqs)
            after = torch.stack([req.hidden for req in reqs])
            if draft_graph is not None:
                extended = LaunchedWork(self._draft_work(batch, after, 1))
            else:
                extended = self.draft_runner.forward(batch, after)
        if isinstance(extended, LaunchedWork):
            extended.wait()
        return out

    def idle(self):
        self.target.idle()

    def mixed(self, new, running):
        raise NotImplementedError("the stand-in does not mix chunked prefill with speculative decoding")

    def synchronize(self):
        pass


def make_worker(server_args, tp_rank=0):
    """The scheduler's model worker: a TpModelWorker's runner, or the speculative worker."""
    algorithm = (getattr(server_args, "speculative_algorithm", None) or "").upper()
    if algorithm in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
        return EagleWorker(server_args, tp_rank)
    if algorithm:
        raise NotImplementedError(f"the stand-in models EAGLE-style speculative decoding only, not {algorithm}")
    return ModelRunner(server_args, tp_rank)
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

from sglang.srt.fake_model_runner import ModelRunner, Req, get_tokenizer
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
    reqs = [Req(i, input_len) for i in range(batch_size)]
    model_runner.synchronize()
    tic = time.perf_counter()
    next_token_ids = model_runner.extend(reqs)
    model_runner.synchronize()
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
        model_runner.synchronize()
        if enable_profile_decode and i == profile_start:
            trace_filename_decode = _create_torch_profiler_filename(
                profile_prefix, batch_size, input_len, output_len, "decode")
            profiler = start_profile(profile_activities, profile_record_shapes, rank_print)
        tic = time.perf_counter()
        next_token_ids = model_runner.decode(reqs)
        model_runner.synchronize()
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
    get_tokenizer(server_args.tokenizer_path)  # one_batch.py:374-378, whatever --load-format
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

from sglang.srt.fake_model_runner import ModelRunner, Req, get_tokenizer
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

    reqs = [Req(i, input_len) for i in range(batch_size)]
    tic = time.time()
    next_token_ids = model_runner.extend(reqs)
    prefill_latency = time.time() - tic
    tot_latency += prefill_latency
    throughput = input_len * batch_size / prefill_latency
    rank_print(f"Prefill. latency: {prefill_latency:6.5f} s, throughput: {throughput:9.2f} token/s")
    measurement_results["prefill_latency"] = prefill_latency
    measurement_results["prefill_throughput"] = throughput

    decode_latencies = []
    for i in range(output_len - 1):
        tic = time.time()
        next_token_ids = model_runner.decode(reqs)
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
    get_tokenizer(server_args.tokenizer_path)  # one_batch.py:374-378, whatever --load-format
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


# sglang 0.5.23's SchedulerProfilerManager (v1), sglang/srt/managers/scheduler_components/
# profiler_manager.py: _init_profile :89-162, _start_profile :170-284, _stop_profile :318-411,
# _profile_batch_predicate :413-457, _profile :459-492; the line numbers in its comments are
# that file's. Commit 1 lacks the decode-capture variable (lines 431-434).
PROFILER_MANAGER = '''"""The scheduler's profiler manager, v1 (stand-in for sglang 0.5.23's
sglang/srt/managers/scheduler_components/profiler_manager.py; line numbers are that file's).
CPU activity only: the stand-in has no GPU, so "GPU" (ProfilerActivity.CUDA) is left out."""

import os

import torch

from sglang.srt.environ import envs

# ForwardMode.is_prefill = is_extend (model_executor/forward_batch_info.py:224-235)
PREFILL_MODES = ("EXTEND", "MIXED", "TARGET_VERIFY", "SPLIT_PREFILL", "DLLM_EXTEND")


class SchedulerProfilerManager:
    def __init__(self, tp_rank, get_forward_ct, dp_rank=0, num_dp_ranks=1):
        self.tp_rank = tp_rank
        self.dp_rank = dp_rank
        self.num_dp_ranks = num_dp_ranks
        self.get_forward_ct = get_forward_ct
        self.torch_profiler = None
        self.activities = None
        self.profiler_start_forward_ct = None
        self.profiler_target_forward_ct = None
        self.profiler_prefill_ct = None
        self.profiler_decode_ct = None
        self.profiler_target_prefill_ct = None
        self.profiler_target_decode_ct = None
        self.profile_by_stage = False
        self.profile_in_progress = False

    def init_profile(self, output_dir, start_step, num_steps, activities, with_stack, record_shapes,
                     profile_by_stage, profile_id, profile_prefix=""):
        # :121-162
        if self.profile_in_progress:
            return False, "Profiling is already in progress. Call /stop_profile first."
        self.profile_by_stage = profile_by_stage
        if output_dir is None:
            output_dir = os.getenv("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        if activities is None:
            activities = ["CPU", "GPU"]
        self.output_dir = os.path.expanduser(output_dir)
        self.with_stack = with_stack
        self.record_shapes = record_shapes
        self.activities = activities
        self.profile_id = profile_id
        self.profile_prefix = profile_prefix
        if start_step:
            self.profiler_start_forward_ct = max(start_step, self.get_forward_ct() + 1)
        if num_steps:
            if self.profile_by_stage:
                self.profiler_prefill_ct = 0
                self.profiler_decode_ct = 0
                self.profiler_target_prefill_ct = num_steps
                self.profiler_target_decode_ct = num_steps
            elif start_step:
                self.profiler_target_forward_ct = self.profiler_start_forward_ct + num_steps
            else:
                self.profiler_target_forward_ct = self.get_forward_ct() + num_steps + 1
        else:
            self.profiler_target_forward_ct = None
        return True, "Succeeded"

    def start_profile(self, stage=None):
        # :182-270: a torch profiler for the CPU activity; :278-281 CUDA_PROFILER drives nsys
        if "CPU" in self.activities:
            self.torch_profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU],
                with_stack=self.with_stack if self.with_stack is not None else True,
                record_shapes=self.record_shapes if self.record_shapes is not None else False)
            self.torch_profiler.start()
            self.profile_in_progress = True
        if "CUDA_PROFILER" in self.activities:
            self.profile_in_progress = True
        return True, "Succeeded"

    def stop_profile(self, stage=None):
        # :325-329
        if not self.profile_in_progress:
            return False, "Profiling is not in progress. Call /start_profile first."
        os.makedirs(self.output_dir, exist_ok=True)
        stage_prefix = self.profile_prefix + "-" if self.profile_prefix else ""
        stage_suffix = f"-{stage}" if stage else ""
        if self.torch_profiler is not None:
            self.torch_profiler.stop()
            # :344-363: the DP part only with more than one DP rank (PP and EP, > 1 only: never here)
            parts = [self.profile_id, f"TP-{self.tp_rank}"]
            if self.num_dp_ranks > 1:
                parts.append(f"DP-{self.dp_rank}")
            filename = stage_prefix + "-".join(parts) + stage_suffix + ".trace.json.gz"
            self.torch_profiler.export_chrome_trace(os.path.join(self.output_dir, filename))
            # :364 then waits at a barrier of the TP group; the stand-in's ranks run in lockstep
        self.torch_profiler = None
        self.profile_in_progress = False
        self.profiler_start_forward_ct = None
        return True, "Succeeded."

    def profile_batch_predicate(self, forward_mode, batch_size):
        # :413-457, called before every forward (scheduler.py:4639) with the scheduler's batch:
        # its mode, and its size on this DP rank (ScheduleBatch.batch_size())
        if self.profile_by_stage:
            if forward_mode in PREFILL_MODES:
                if self.profiler_prefill_ct == 0:
                    self.start_profile(forward_mode)
                self.profiler_prefill_ct += 1
                if self.profiler_prefill_ct > self.profiler_target_prefill_ct:
                    if self.profile_in_progress:
                        # :423-425: whatever capture runs, the decode one too, is saved as -EXTEND
                        self.stop_profile(stage="EXTEND")
            elif forward_mode == "DECODE":
                if self.profiler_decode_ct == 0:
                    if self.profile_in_progress:
                        self.stop_profile(stage="EXTEND")
__DECODE_MIN_BS_CHECK__                    self.start_profile(forward_mode)
                self.profiler_decode_ct += 1
                if self.profiler_decode_ct > self.profiler_target_decode_ct:
                    if self.profile_in_progress:
                        self.stop_profile(stage="DECODE")
            elif forward_mode in ("IDLE", "PREBUILT"):
                pass  # :441-444
            else:
                raise RuntimeError(f"unsupported profile stage: {forward_mode}")  # :446
        else:
            if self.profiler_target_forward_ct and self.profiler_target_forward_ct <= self.get_forward_ct():
                self.stop_profile()
            if self.profiler_start_forward_ct and self.profiler_start_forward_ct == self.get_forward_ct():
                self.start_profile()

    def profile(self, req):
        # :459-492, with the request as tokenizer_control_mixin.py:401-417 completes it
        if req.get("req_type") != "START_PROFILE":
            return self.stop_profile()
        args = (req.get("output_dir"), req.get("start_step"), req.get("num_steps"), req.get("activities"),
                req.get("with_stack"), req.get("record_shapes"), bool(req.get("profile_by_stage")),
                req["profile_id"], req.get("profile_prefix") or "")
        if req.get("profile_by_stage") or req.get("start_step"):
            return self.init_profile(*args)
        self.init_profile(*args)
        return self.start_profile()
'''
DECODE_MIN_BS_CHECK = '''                    # :431-434
                    min_bs = envs.SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS.get()
                    if min_bs > 0 and batch_size < min_bs:
                        # Wait for full admission before capturing the decode stage
                        return
'''

FAKE_SERVER = '''"""An HTTP server shaped like SGLang's where the engine touches it: GET /health, POST /generate
(server-sent events when "stream"), POST /start_profile and /stop_profile; one scheduler process
per TP rank, each with its own model runner and profiler manager, run in lockstep.

The scheduler mirrors sglang 0.5.23's sglang/srt/managers/scheduler.py: event_loop_normal
(:2026) takes the requests that have arrived (ingest_requests :2184), picks the next batch
(get_next_batch_to_run :3894): a prefill (EXTEND) batch of waiting requests first when there are
any (:3993), else one decode step of the running batch; run_batch (:4614) counts the forward
(:4621) and asks the profiler manager before it (:4639). A prefilled request joins the running
batch for the next step. With --enable-mixed-chunk a prefill while others run is mixed with their
decode step into one MIXED forward (mix_with_running). DP attention: see Scheduler. Speculative
decoding (--speculative-algorithm EAGLE, EAGLE3, NEXTN, STANDALONE): fake_model_runner.EagleWorker.
Not modelled: chunked prefill's chunks (a MIXED batch prefills its requests whole), the overlap
scheduler, the radix cache, retraction, DP replicas."""

import json
import multiprocessing
import os
import queue
import signal
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang.srt.environ import envs

BURST_WAIT_S = 60.0  # a held burst that never fills is let in after this (a test's safety net)


class Arrivals:
    """When /generate requests reach the scheduler's waiting queue. SGLang takes each as soon as
    the tokenizer hands it over, so requests sent together can be prefilled in separate batches,
    as timing has it; the stand-in does the same. FAKE_SGLANG_BURST=n (for tests) holds requests
    until n have come, then lets them in FAKE_SGLANG_STAGGER_STEPS scheduler steps apart: one
    batch structure every time, however loaded the machine."""

    def __init__(self, burst, gap_steps):
        self.burst = burst
        self.gap_steps = gap_steps
        self.held = []
        self.held_since = None
        self.scheduled = []  # (step, request)

    @classmethod
    def from_env(cls):
        return cls(int(os.environ.get("FAKE_SGLANG_BURST") or 0),
                   int(os.environ.get("FAKE_SGLANG_STAGGER_STEPS") or 0))

    def add(self, req):
        if not self.held:
            self.held_since = time.monotonic()
        self.held.append(req)

    def due(self, step):
        """The requests that reach the waiting queue at this scheduler step."""
        if not self.burst:
            out, self.held = self.held, []
            return out
        if self.held and (len(self.held) >= self.burst or time.monotonic() - self.held_since > BURST_WAIT_S):
            start = max(step, self.scheduled[-1][0] + self.gap_steps) if self.scheduled else step
            burst, self.held = self.held[: self.burst], self.held[self.burst:]
            self.held_since = time.monotonic()
            self.scheduled += [(start + i * self.gap_steps, req) for i, req in enumerate(burst)]
        out = [req for at, req in self.scheduled if at <= step]
        self.scheduled = [(at, req) for at, req in self.scheduled if at > step]
        return out


def rank_main(server_args, tp_rank, dp_rank, dp_size, inbox, outbox):
    try:
        from sglang.srt.fake_model_runner import Req, make_worker
        from sglang.srt.fake_profiler_manager import SchedulerProfilerManager

        parent = os.getppid()
        runner = make_worker(server_args, tp_rank)
        forward_ct = [0]
        profiler = SchedulerProfilerManager(tp_rank, lambda: forward_ct[0], dp_rank, dp_size)
        reqs = {}
        outbox.put(("done", tp_rank, None))
        while True:
            try:
                msg = inbox.get(timeout=1)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            kind, detail = msg[0], None
            if kind == "exit":
                return
            if kind == "profile":
                detail = profiler.profile(msg[1])
            elif kind == "free":
                for rid in msg[1]:
                    reqs.pop(rid, None)
            else:  # ("batch", mode, (requests to prefill, running requests))
                _, mode, (new_items, old_ids) = msg
                forward_ct[0] += 1  # scheduler.py:4621
                profiler.profile_batch_predicate(mode, len(new_items) + len(old_ids))  # scheduler.py:4639
                new = [Req(rid, input_len) for rid, input_len in new_items]
                reqs.update((req.rid, req) for req in new)
                old = [reqs[rid] for rid in old_ids]
                if mode == "EXTEND":
                    runner.extend(new)
                elif mode == "MIXED":
                    runner.mixed(new, old)
                elif mode == "IDLE":
                    runner.idle()
                else:
                    runner.decode(old)
            outbox.put(("done", tp_rank, detail))
    except Exception:
        outbox.put(("error", tp_rank, traceback.format_exc()))


class Request:
    def __init__(self, rid, input_len, max_new_tokens):
        self.rid = rid
        self.input_len = input_len
        self.max_new_tokens = max_new_tokens
        self.done = 0
        self.out = queue.Queue()


class DPGroup:
    """One data-parallel attention rank: its scheduler's waiting and running requests, and the TP
    ranks that run its batches (all of them without DP attention)."""

    def __init__(self, dp_rank, ranks):
        self.dp_rank = dp_rank
        self.ranks = ranks
        self.waiting, self.running = [], []


class Scheduler:
    """The TP ranks in lockstep, driven by SGLang's scheduling loop (see the module's docstring).

    With DP attention (--attn-dp-size N, or the deprecated --enable-dp-attention with --dp-size N:
    server_args.py:416-423) the TP ranks form N attention-DP ranks, each with its own scheduler and
    batch; requests go to them round robin (load_balance_method auto = round_robin for a plain
    server, serving_hook.py:217-235); a DP rank with nothing to run while another runs a batch runs
    an IDLE forward (`step[IDLE bs=0]`), as the MLP sync makes it. Each rank's profiler sees its own
    DP rank's batch (profiler_manager.py:431-434 compares SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS with
    ScheduleBatch.batch_size(), the rank's share) and names its files -TP-{tp}-DP-{dp} (:344-351).
    DP replicas (--dp-size without DP attention) are not modelled: the stand-in refuses them."""

    def __init__(self, server_args):
        tp = server_args.tp_size
        dp = server_args.attn_dp_size
        if server_args.enable_dp_attention and server_args.dp_size > 1:
            dp = server_args.dp_size
        elif server_args.dp_size > 1:
            raise NotImplementedError("the stand-in models DP attention (--attn-dp-size), not DP replicas "
                                      "(--dp-size without it)")
        if dp < 1 or tp % dp:
            raise ValueError(f"tp_size {tp} must be divisible by the attention DP size {dp}")
        ctx = multiprocessing.get_context("spawn")
        self.outbox = ctx.Queue()
        self.inboxes = [ctx.Queue() for _ in range(tp)]
        per_group = tp // dp
        self.procs = [ctx.Process(target=rank_main, args=(server_args, r, r // per_group, dp, q, self.outbox),
                                  daemon=True) for r, q in enumerate(self.inboxes)]
        for p in self.procs:
            p.start()
        self.collect(range(tp))
        self.groups = [DPGroup(d, list(range(d * per_group, (d + 1) * per_group))) for d in range(dp)]
        self.next_group = 0
        pool = server_args.max_total_tokens or 8192
        self.max_running = server_args.max_running_requests or pool
        self.max_prefill_tokens = server_args.max_prefill_tokens
        self.mixed_chunk = server_args.enable_mixed_chunk
        self.arrivals = Arrivals.from_env()
        self.step = 0
        self.next_rid = 0
        self.commands = queue.Queue()
        threading.Thread(target=self.event_loop, daemon=True).start()

    def collect(self, ranks):
        details = {}
        for _ in ranks:
            kind, rank, detail = self.outbox.get()
            if kind == "error":
                raise RuntimeError(f"TP{rank} failed:\\n{detail}")
            details[rank] = detail
        return [details[r] for r in sorted(details)]

    def send(self, messages):
        """{rank: message}: each to its rank; the ranks' answers in rank order."""
        for rank, msg in messages.items():
            self.inboxes[rank].put(msg)
        return self.collect(list(messages))

    def broadcast(self, msg):
        return self.send({r: msg for r in range(len(self.inboxes))})

    def event_loop(self):
        while True:
            self.ingest_requests()
            batches = [self.get_next_batch_to_run(g) for g in self.groups]
            if any(b is not None for b in batches):
                if len(self.groups) > 1:  # prepare_mlp_sync_batch: the idle DP ranks run an IDLE forward
                    batches = [b or ("IDLE", [], []) for b in batches]
                messages = {}
                for group, batch in zip(self.groups, batches):
                    if batch is not None:
                        mode, new, old = batch
                        items = ([(r.rid, r.input_len) for r in new], [r.rid for r in old])
                        messages.update((rank, ("batch", mode, items)) for rank in group.ranks)
                try:
                    self.send(messages)
                    for group, batch in zip(self.groups, batches):
                        if batch is not None:
                            self.process_batch_result(group, *batch)
                except Exception as e:
                    self.fail(e, [r for b in batches if b for r in b[1] + b[2]])
            self.step += 1

    def ingest_requests(self):
        idle = not any(g.waiting or g.running for g in self.groups)
        while True:
            try:
                command = self.commands.get(timeout=0.02) if idle else self.commands.get_nowait()
            except queue.Empty:
                break
            idle = False
            if command[0] == "generate":
                self.arrivals.add(command[1])
            else:  # ("control", msg, reply): answered between batches, as SGLang does
                try:
                    command[2].put(self.broadcast(command[1])[0])
                except Exception as e:
                    command[2].put((False, str(e)))
        for req in self.arrivals.due(self.step):  # the DP controller, round robin
            self.groups[self.next_group].waiting.append(req)
            self.next_group = (self.next_group + 1) % len(self.groups)

    def get_next_batch_to_run(self, group):
        """(mode, requests to prefill, running requests in the forward) of a DP rank, or None."""
        if group.waiting and len(group.running) < self.max_running:
            reqs, tokens = [], 0
            for req in group.waiting:
                if len(group.running) + len(reqs) >= self.max_running:
                    break
                if reqs and tokens + req.input_len > self.max_prefill_tokens:
                    break
                reqs.append(req)
                tokens += req.input_len
            group.waiting = group.waiting[len(reqs):]
            if self.mixed_chunk and group.running:
                # --enable-mixed-chunk: the prefill is mixed with the running batch's decode
                # (schedule_batch.py mix_with_running): one MIXED forward
                return "MIXED", reqs, list(group.running)
            return "EXTEND", reqs, []
        if group.running:
            return "DECODE", [], list(group.running)
        return None

    def process_batch_result(self, group, mode, new, old):
        finished = []
        for req in new + old:
            req.done += 1
            req.out.put(req.done)
            if req.done >= req.max_new_tokens:
                req.out.put(None)
                finished.append(req)
            elif req in new:
                group.running.append(req)
        if finished:
            gone = {id(r) for r in finished}
            group.running = [r for r in group.running if id(r) not in gone]
            self.send({rank: ("free", [r.rid for r in finished]) for rank in group.ranks})

    def fail(self, error, batch):
        """A rank failed: every request still open gets the error and ends."""
        everyone = batch + [r for g in self.groups for r in g.running + g.waiting]
        open_reqs = {id(r): r for r in everyone if r.done < r.max_new_tokens}
        for req in open_reqs.values():
            req.out.put(error)
            req.out.put(None)
        for group in self.groups:
            group.running, group.waiting = [], []

    def submit(self, input_len, max_new_tokens):
        self.next_rid += 1
        req = Request(self.next_rid, input_len, max_new_tokens)
        self.commands.put(("generate", req))
        return req.out

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


def complete_profile_request(body):
    """tokenizer_control_mixin.py:401-417: a START_PROFILE request with stack, shapes and id."""
    req = dict(body or {})
    req["req_type"] = "START_PROFILE"
    req["with_stack"] = not (req.get("with_stack") is False or not envs.SGLANG_PROFILE_WITH_STACK.get())
    req["record_shapes"] = req.get("record_shapes") is not False and envs.SGLANG_PROFILE_RECORD_SHAPES.get()
    req["profile_id"] = req.get("profile_id") or str(time.time())
    return req


# sglang/api/v1/api_types.py:1256 (the sampling parameters /generate takes) and :97-108 (the
# message for any other): unknown keys of the request itself are ignored (:237), unknown sampling
# parameters refused, by api_contract.py:12-18 before the request is admitted.
SAMPLING_PARAMS_FIELDS = __SAMPLING_PARAMS_FIELDS__


def unknown_field(key, fields):
    if not fields:
        return f"unknown field `{key}`, there are no fields"
    if len(fields) == 1:
        return f"unknown field `{key}`, expected `{fields[0]}`"
    if len(fields) == 2:
        return f"unknown field `{key}`, expected `{fields[0]}` or `{fields[1]}`"
    return "unknown field `" + key + "`, expected one of " + ", ".join(f"`{f}`" for f in fields)


def generate_contract_error(body):
    """The contract violation of a /generate body, or None (api_contract.generate_contract_error)."""
    if not isinstance(body, dict):
        return "invalid type: expected struct GenerateRequest"
    params = body.get("sampling_params")
    if params is None:
        return None
    if not isinstance(params, dict):
        return "invalid type: expected struct SamplingParams"
    for key in params:
        if key not in SAMPLING_PARAMS_FIELDS:
            return unknown_field(key, SAMPLING_PARAMS_FIELDS)
    return None  # (the types of the values are not checked here)


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
            if self.path in ("/start_profile", "/stop_profile"):
                # http_server.py:1221-1240; tokenizer_control_mixin.py:424-428 raises on the first
                # rank's failure, which FastAPI answers with a plain 500
                req = complete_profile_request(body) if self.path == "/start_profile" else {"req_type": "STOP_PROFILE"}
                success, _ = scheduler.run_control(("profile", req))
                if not success:
                    return self.reply(500, b"Internal Server Error")
                return self.reply(200, b"Start profiling.\\n" if self.path == "/start_profile"
                                  else b"Stop profiling. This will take some time.\\n")
            if self.path != "/generate":
                return self.reply(404)
            error = generate_contract_error(body)
            if error is not None:  # http_server.py:937-939
                return self.reply(400, json.dumps({"error": error}).encode(), "application/json")
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
    if not server_args.skip_tokenizer_init:  # the tokenizer manager's get_tokenizer
        from sglang.srt.fake_model_runner import get_tokenizer

        get_tokenizer(server_args.tokenizer_path)
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
    "python/sglang/__init__.py": INIT,
    "python/sglang/srt/__init__.py": "",
    "python/sglang/srt/fake_model_runner.py": MODEL_RUNNER,
    "python/sglang/srt/fake_server.py": FAKE_SERVER.replace("__SAMPLING_PARAMS_FIELDS__",
                                                            repr(SAMPLING_PARAMS_FIELDS)),
    "python/sglang/launch_server.py": LAUNCH_SERVER,
    "python/sglang/srt/layers/__init__.py": "",
    "python/sglang/srt/layers/attention/__init__.py": "",
    "python/sglang/srt/layers/attention/flashinfer_mla_backend.py": BACKEND,
}
OLD_FILES = {
    "python/pyproject.toml": OLD_PYPROJECT,
    "python/sglang/version.py": OLD_VERSION_PY,
    "python/sglang/bench_one_batch.py": OLD_BENCH,
    "python/sglang/srt/environ.py": ENVIRON.replace("__DECODE_MIN_BS_FIELD__\n", ""),
    "python/sglang/srt/fake_step_span.py": STEP_SPAN_OLD,
    "python/sglang/srt/fake_profiler_manager.py": PROFILER_MANAGER.replace("__DECODE_MIN_BS_CHECK__", ""),
}
CURRENT_FILES = {
    "python/pyproject.toml": CURRENT_PYPROJECT,
    "python/sglang/version.py": CURRENT_VERSION_PY,
    "python/sglang/benchmark/__init__.py": "",
    "python/sglang/benchmark/one_batch.py": CURRENT_BENCH,
    "python/sglang/srt/environ.py": ENVIRON.replace("__DECODE_MIN_BS_FIELD__\n", DECODE_MIN_BS_FIELD),
    "python/sglang/srt/fake_step_span.py": STEP_SPAN_CURRENT,
    "python/sglang/srt/fake_profiler_manager.py": PROFILER_MANAGER.replace("__DECODE_MIN_BS_CHECK__",
                                                                           DECODE_MIN_BS_CHECK),
}


@dataclass(frozen=True)
class FakeSglang:
    path: Path
    old_sha: str  # commit 1: sglang.bench_one_batch, early flags, no decode-capture variable
    current_sha: str  # commit 2 (tag v0.5.23): sglang.benchmark.one_batch only, as sglang 0.5.23


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


def make_fake_sglang(path: Path, server_flags: list[dict] | None = None) -> FakeSglang:
    """Create a git repository at `path` (must not exist or be empty) with the two commits; its
    servers declare `server_flags` (sglang 0.5.23's, read from the wheel) or the built-in few."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    _write(path, {**COMMON_FILES, "python/sglang/srt/server_args.py": write_server_args(server_flags),
                  **OLD_FILES})
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "stand-in: an older release (sglang.bench_one_batch)")
    old_sha = _git(path, "rev-parse", "HEAD")
    (path / "python/sglang/bench_one_batch.py").unlink()
    _write(path, CURRENT_FILES)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "stand-in: sglang 0.5.23's layout (sglang.benchmark.one_batch)")
    _git(path, "tag", f"v{CURRENT_VERSION}")
    return FakeSglang(path, old_sha, _git(path, "rev-parse", "HEAD"))


def write_model_config(directory: Path, layers: int = 2, tokenizer: bool = True) -> Path:
    """A model directory for --load-format dummy: what sglang 0.5.23 reads even without weights, a
    Hugging Face config.json with its model_type (ModelConfig.from_server_args, one_batch.py:332)
    and the tokenizer's files (get_tokenizer, one_batch.py:374-378; the server's tokenizer
    manager). The tokenizer is a word-level one in tokenizer.json's format; with tokenizer=False
    the directory has config.json only, which SGLang refuses."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": layers,
              "hidden_size": 256, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_nextn_predict_layers": 1,
              "vocab_size": 16}
    (directory / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    if tokenizer:
        vocab = {f"t{i}": i for i in range(16)}
        (directory / "tokenizer.json").write_text(json.dumps(
            {"version": "1.0", "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
             "pre_tokenizer": {"type": "Whitespace"}}) + "\n")
        (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
                                                         + "\n")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_fake_sglang.py DIR")
    made = make_fake_sglang(Path(sys.argv[1]))
    print(f"{made.path}\nold {made.old_sha}\ncurrent {made.current_sha}")
