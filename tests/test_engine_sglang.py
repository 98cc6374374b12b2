"""The sglang engine: its pure functions on SGLang's real formats, and whole runs on this
machine against a stand-in SGLang checkout.

The formats below are copied from SGLang's sources: sglang 0.5.23's wheel
(`sglang/benchmark/one_batch.py`, `sglang/srt/managers/scheduler_components/profiler_manager.py`)
and earlier `python/sglang/bench_one_batch.py` revisions of github.com/sgl-project/sglang (the
`--profile-filename-prefix` releases). The end-to-end tests run tests/standins/make_fake_sglang.py
instead of SGLang, because SGLang cannot be installed on these machines (FACTS.md section 4);
each says so.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ingest.runs.engines.sglang import (
    LAYERS_SCRIPT,
    SERVER_DRIVER_SCRIPT,
    VERSIONS_SCRIPT,
    BenchFlags,
    PatchFailed,
    build_driver_config,
    build_one_batch_argv,
    build_profile_request,
    build_server_argv,
    build_server_env,
    check_server_workload,
    count_profiled_steps,
    detect_bench_flags,
    explain_missing_decode,
    find_bench_module,
    find_decode_trace,
    find_server_traces,
    parse_json_line,
    parse_printed_decode,
    parse_result_jsonl,
    plan_profile_start_step,
    read_decode_figures,
    read_no_decode_report,
    reads_decode_min_bs,
    run_sglang,
    run_sglang_server,
)
from ingest.runs.errors import CommandCancelled, CommandFailed, CommandTimeout, RunError, SpecError
from ingest.runs.hosts import LocalHost
from ingest.runs.spec import Config, HostConfig, RepoConfig, RunSpec, Workload
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, prepare_import
from kernels.bundle import read_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent / "standins"))
from make_fake_sglang import (  # noqa: E402
    CURRENT_VERSION,
    GATHER_PATCH,
    OLD_VERSION,
    STALE_PATCH,
    make_fake_sglang,
    write_model_config,
)

# --- SGLang's real formats --------------------------------------------------------------------

# sglang 0.5.23 sglang/benchmark/one_batch.py, the argparse lines the detection reads.
ARGS_0_5_23 = '''
        parser.add_argument("--profile", action="store_true", help="Enable profiling.")
        parser.add_argument(
            "--profile-record-shapes",
            action="store_true",
            help="Record tensor shapes in profiling results.",
        )
        parser.add_argument(
            "--profile-stage",
            type=str,
            default=BenchArgs.profile_stage,
            choices=["all", "prefill", "decode"],
            help="Which stage to profile: all, prefill, or decode only.",
        )
        parser.add_argument(
            "--profile-prefix",
            dest="profile_prefix",
            type=str,
            default=BenchArgs.profile_prefix,
        )
        parser.add_argument(
            "--profile-start-step",
            type=int,
            default=None,
        )
        parser.add_argument(
            "--profile-steps",
            type=int,
            default=None,
        )
'''
# A bench_one_batch.py of the releases between: stages and shapes, one profiled decode step.
ARGS_STAGED = '''
        parser.add_argument("--profile", action="store_true", help="Enable profiling.")
        parser.add_argument(
            "--profile-record-shapes",
            action="store_true",
            help="Record tensor shapes in profiling results.",
        )
        parser.add_argument(
            "--profile-stage",
            type=str,
            default=BenchArgs.profile_stage,
            choices=["all", "prefill", "decode"],
            help="Which stage to profile: all, prefill, or decode only.",
        )
        parser.add_argument(
            "--profile-filename-prefix",
            type=str,
            default=BenchArgs.profile_filename_prefix,
        )
'''
# The earliest bench_one_batch.py: the whole run profiled, the trace written to the cwd.
ARGS_EARLY = '''
        parser.add_argument(
            "--profile", action="store_true", help="Use Torch Profiler."
        )
        parser.add_argument(
            "--profile-filename-prefix",
            type=str,
            default=BenchArgs.profile_filename_prefix,
            help="Prefix of the profiling file names. The full profiling result file(s) be "
            '"[profile_filename_prefix]_batch[batch_size]_input[input_len]_output[output_len].trace.json.gz"',
        )
'''

# Output of sglang 0.5.23's one_batch: rank_print(f"Decode {i}. Batch size: {batch_size}, latency:
# {latency:6.5f} s, throughput: {throughput:9.2f} token/s") for i < 5, then
# f"Decode.  median latency: {med_decode_latency:6.5f} s, median throughput: {med_decode_throughput:9.2f} token/s".
OUTPUT_0_5_23 = """max_total_num_tokens=495000
Warmup ...
Prefill. latency: 0.31207 s, throughput:   6562.62 token/s
Decode 0. Batch size: 1, latency: 0.09511 s, throughput:     10.51 token/s
Decode 1. Batch size: 1, latency: 0.09402 s, throughput:     10.64 token/s
Decode.  median latency: 0.09402 s, median throughput:     10.64 token/s
Total. latency:  0.594 s, throughput:   3458.32 token/s
Benchmark ...
Prefill. latency: 0.30112 s, throughput:   6801.27 token/s
Decode 0. Batch size: 1, latency: 0.09333 s, throughput:     10.71 token/s
Decode 1. Batch size: 1, latency: 0.09321 s, throughput:     10.73 token/s
torch profiler chrome trace for decode saved to /tmp/prof/stepwatch_batch1_input2048_output32_decode.trace.json.gz
Decode 2. Batch size: 1, latency: 0.09318 s, throughput:     10.73 token/s
Decode.  median latency: 0.09320 s, median throughput:     10.73 token/s
Total. latency:  3.187 s, throughput:    652.71 token/s
"""
# Early releases: rank_print(f"Decode.  latency: {latency:6.5f} s, throughput: {throughput:9.2f} token/s")
# for i < 5 (and, before bench_one_batch, no median line at all).
OUTPUT_EARLY_STEPS_ONLY = """Warmup ...
Decode.  latency: 0.50000 s, throughput:      2.00 token/s
Benchmark ...
Prefill. latency: 0.31207 s, throughput:   6562.62 token/s
Decode.  latency: 0.09600 s, throughput:     10.42 token/s
Decode.  latency: 0.09300 s, throughput:     10.75 token/s
Decode.  latency: 0.09400 s, throughput:     10.64 token/s
Total. latency:  3.187 s, throughput:    652.71 token/s
"""

# One --result-filename line of sglang 0.5.23 (json.dumps of measurement_results).
RESULT_LINE = ('{"run_name": "stepwatch", "batch_size": 1, "input_len": 2048, "output_len": 32, '
               '"prefill_latency": 0.30112, "prefill_throughput": 6801.27, "median_decode_latency": 0.0932, '
               '"median_decode_throughput": 10.729613733905579, "total_latency": 3.187, '
               '"overall_throughput": 652.71}')


def test_find_bench_module_prefers_the_current_name():
    assert find_bench_module(lambda p: p == "python/sglang/benchmark/one_batch.py") == "sglang.benchmark.one_batch"
    assert find_bench_module(lambda p: p == "python/sglang/bench_one_batch.py") == "sglang.bench_one_batch"
    assert find_bench_module(lambda p: True) == "sglang.benchmark.one_batch"
    with pytest.raises(RunError, match="no one-batch benchmark"):
        find_bench_module(lambda p: False)


def test_detect_bench_flags_across_releases():
    assert detect_bench_flags(ARGS_0_5_23) == BenchFlags()
    assert detect_bench_flags(ARGS_STAGED) == BenchFlags(prefix="--profile-filename-prefix", stage=True,
                                                         steps=False, start_step=False, record_shapes=True)
    assert detect_bench_flags(ARGS_EARLY) == BenchFlags(prefix="--profile-filename-prefix", stage=False,
                                                        steps=False, start_step=False, record_shapes=False)
    # A release that kept the old name as an alias gets the new one.
    assert detect_bench_flags(ARGS_STAGED.replace('"--profile-filename-prefix",',
                                                  '"--profile-prefix",\n"--profile-filename-prefix",')).prefix \
        == "--profile-prefix"


WORKLOAD = Workload(model_path="/models/glm-5", load_format="dummy", batch_size=1, input_len=2048, output_len=32,
                    kv_cache_dtype="fp8_e4m3", attention_backend="flashinfer", profile_steps=3,
                    extra_args=("--mem-fraction-static=0.8",))


def test_build_one_batch_argv_current_release():
    argv = build_one_batch_argv("/venv/bin/python", "sglang.benchmark.one_batch", WORKLOAD,
                                result_file="/tmp/x/result.jsonl", run_name="stepwatch", profile_prefix="sw",
                                flags=BenchFlags())
    assert argv == ["/venv/bin/python", "-m", "sglang.benchmark.one_batch", "--model-path", "/models/glm-5",
                    "--batch-size", "1", "--input-len", "2048", "--output-len", "32", "--run-name", "stepwatch",
                    "--result-filename", "/tmp/x/result.jsonl", "--profile", "--profile-record-shapes",
                    "--profile-stage", "decode", "--profile-steps", "3", "--profile-start-step", "16",
                    "--profile-prefix", "sw", "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3",
                    "--attention-backend", "flashinfer", "--mem-fraction-static=0.8"]


def test_build_one_batch_argv_early_release_and_options():
    early = BenchFlags(prefix="--profile-filename-prefix", stage=False, steps=False, start_step=False,
                       record_shapes=False)
    w = Workload(model_path="m", tp=2, batch_size=8, input_len=16, output_len=4)
    argv = build_one_batch_argv("python3", "sglang.bench_one_batch", w, result_file="r", run_name="n",
                                profile_prefix="p", flags=early)
    assert argv == ["python3", "-m", "sglang.bench_one_batch", "--model-path", "m", "--batch-size", "8",
                    "--input-len", "16", "--output-len", "4", "--run-name", "n", "--result-filename", "r",
                    "--profile", "--profile-filename-prefix", "p", "--tp-size", "2"]
    # A value that looks like a flag still travels as one argv element after its flag.
    odd = Workload(model_path="dir with space/model")
    argv = build_one_batch_argv("python3", "m", odd, result_file="r", run_name="n", profile_prefix="p",
                                flags=BenchFlags())
    assert argv[argv.index("--model-path") + 1] == "dir with space/model"


def test_plan_profile_start_step():
    assert plan_profile_start_step(32, 3) == 16  # SGLang's default, output_len // 2
    assert plan_profile_start_step(32, 30) == 1  # 30 steps of 31 decode steps: start as late as fits
    assert plan_profile_start_step(8, 7) == 0
    with pytest.raises(RunError, match="raise output_len to at least 9"):
        plan_profile_start_step(8, 8)
    assert count_profiled_steps(WORKLOAD, BenchFlags()) == 3
    assert count_profiled_steps(WORKLOAD, BenchFlags(steps=False)) == 1
    assert count_profiled_steps(WORKLOAD, BenchFlags(stage=False, steps=False)) == 32


def test_parse_result_jsonl_takes_the_last_record():
    older = RESULT_LINE.replace("10.729613733905579", "9.0")
    record = parse_result_jsonl(older + "\n" + RESULT_LINE + "\n\n")
    assert record["run_name"] == "stepwatch" and record["output_len"] == 32
    assert read_decode_figures(record) == (0.0932, 10.729613733905579)
    with pytest.raises(RunError, match="empty"):
        parse_result_jsonl("\n")
    with pytest.raises(RunError, match="line 2 is not JSON"):
        parse_result_jsonl(RESULT_LINE + "\n{truncated")
    with pytest.raises(RunError, match="median_decode_latency"):
        read_decode_figures({"run_name": "x", "batch_size": 1, "output_len": 1})


def test_parse_printed_decode_reads_the_benchmark_not_the_warmup():
    assert parse_printed_decode(OUTPUT_0_5_23) == (0.0932, 10.73)
    # Without a median line: the median of the per-step lines after `Benchmark ...`.
    assert parse_printed_decode(OUTPUT_EARLY_STEPS_ONLY) == (0.094, 10.64)
    steps_only = "\n".join(line for line in OUTPUT_0_5_23.splitlines() if "median" not in line)
    assert parse_printed_decode(steps_only) == (0.09321, 10.73)
    with pytest.raises(RunError, match="printed no"):
        parse_printed_decode("Warmup ...\nBenchmark ...\nTotal. latency:  3.187 s\n")


def test_find_decode_trace_current_and_old_names():
    current = "stepwatch_batch1_input2048_output32_decode.trace.json.gz"
    old = "stepwatch_batch1_input2048_output32.trace.json.gz"
    prefill = "stepwatch_batch1_input2048_output32_prefill.trace.json.gz"
    assert find_decode_trace([prefill, current, old], "stepwatch", 1, 2048, 32) == current
    assert find_decode_trace([old, "result.jsonl"], "stepwatch", 1, 2048, 32) == old
    assert find_decode_trace(["stepwatch_batch1_input2048_output32.trace.json"], "stepwatch", 1, 2048, 32) \
        == "stepwatch_batch1_input2048_output32.trace.json"
    with pytest.raises(RunError, match=f"expected {current}.*found {prefill}"):
        find_decode_trace([prefill], "stepwatch", 1, 2048, 32)
    with pytest.raises(RunError, match="found no trace files"):
        find_decode_trace([], "stepwatch", 1, 2048, 32)


def test_find_server_traces_all_ranks_in_rank_order():
    # profiler_manager._stop_profile: stage_prefix + "-".join([profile_id, f"TP-{tp_rank}", ...])
    # + f"-{stage.name}" + ".trace.json.gz"; profile_id defaults to str(time.time()).
    pid = "1764412345.6789012"
    names = [f"{pid}-TP-{r}.trace.json.gz" for r in (2, 0, 10, 1)] + ["1764412000.1-TP-0.trace.json.gz"]
    assert find_server_traces(names, pid) == [f"{pid}-TP-{r}.trace.json.gz" for r in (0, 1, 2, 10)]
    staged = [f"my-run-{pid}-TP-{r}-DP-0-{s}.trace.json.gz" for r in (1, 0) for s in ("EXTEND", "DECODE")]
    assert find_server_traces(staged, pid, "my-run") == [f"my-run-{pid}-TP-{r}-DP-0-DECODE.trace.json.gz"
                                                          for r in (0, 1)]
    with pytest.raises(RunError, match="no decode traces of server profile .* among 4 files"):
        find_server_traces(staged, pid)  # they carry a prefix
    # A by-stage profile stopped by /stop_profile before its DECODE stage: the stageless files.
    stopped = [f"{pid}-TP-0-EXTEND.trace.json.gz", f"{pid}-TP-0.trace.json.gz"]
    assert find_server_traces(stopped, pid) == [f"{pid}-TP-0.trace.json.gz"]
    with pytest.raises(RunError, match="only EXTEND ones"):
        find_server_traces(stopped[:1], pid)


def test_server_command_and_profile_request():
    w = Workload(model_path="/models/glm-5", tp=8, load_format="dummy", kv_cache_dtype="fp8_e4m3",
                 attention_backend="flashinfer", extra_args=("--mem-fraction-static=0.8",), output_len=32)
    argv = build_server_argv("/venv/bin/python", w)
    assert argv == ["/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/glm-5",
                    "--tp-size", "8", "--load-format", "dummy", "--kv-cache-dtype", "fp8_e4m3",
                    "--attention-backend", "flashinfer", "--mem-fraction-static=0.8"]
    request = build_profile_request("/tmp/prof", 3, "stepwatch", "abc123")
    assert request == {"output_dir": "/tmp/prof", "num_steps": 3, "activities": ["CPU", "GPU"],
                       "profile_by_stage": True, "with_stack": True, "record_shapes": True,
                       "profile_prefix": "stepwatch", "profile_id": "abc123"}
    config = build_driver_config(argv, w, result_file="/tmp/r.jsonl", trace_dir="/tmp/prof",
                                 profile_request=request, startup_timeout_s=60)
    assert config["trace_stem"] == "stepwatch-abc123" and config["ranks"] == 8
    # profiler_manager.py:431 (sglang 0.5.23) reads the variable; environ.py:458 keeps manager v1
    assert config["server_env"] == build_server_env(w) == {
        "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS": str(w.batch_size), "SGLANG_PROFILE_V2": "0"}
    assert json.loads(json.dumps(config)) == config  # travels as one argv element
    compile(SERVER_DRIVER_SCRIPT, "driver", "exec")
    check_server_workload(Workload(output_len=5, profile_steps=3))
    with pytest.raises(RunError, match="at least profile_steps \\+ 2 = 5"):
        check_server_workload(Workload(output_len=4, profile_steps=3))


def _versions(checkout: Path, pythonpath: str = "") -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    out = subprocess.run([sys.executable, "-c", VERSIONS_SCRIPT, str(checkout)], capture_output=True,
                         text=True, cwd=checkout, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return parse_json_line(out.stdout, "versions")


@pytest.mark.slow
def test_versions_script_tolerates_missing_pieces(tmp_path):
    (tmp_path / "python" / "sglang").mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "version.py").write_text('__version__ = "0.4.6.post1"\n')
    (tmp_path / "python" / "pyproject.toml").write_text('dependencies = ["sgl-kernel==0.1.0", "torch"]\n')
    found = _versions(tmp_path)
    import torch

    assert found["sglang"] == "0.4.6.post1" and found["sglang_source"] == "python/sglang/version.py"
    assert found["sglang_kernel_pinned"] == "0.1.0"
    assert found["torch"] == torch.__version__ and found["python"]
    for key in ("sglang_kernel", "sglang_installed", "cuda", "driver", "gpu"):
        assert key in found  # null where this machine has none


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null"}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


@pytest.mark.slow
def test_versions_script_reports_the_checkout_not_the_installed_package(tmp_path):
    """sglang 0.5.23's python/sglang/version.py holds no number (setuptools-scm): importing it from
    a fresh worktree falls back to importlib.metadata, the INSTALLED package. The probe reads the
    checkout instead: its tag, and how far the commit is past it."""
    checkout, site = tmp_path / "sglang", tmp_path / "site"
    (checkout / "python" / "sglang").mkdir(parents=True)
    (checkout / "python" / "sglang" / "__init__.py").write_text("from sglang.version import __version__\n")
    (checkout / "python" / "sglang" / "version.py").write_text(
        "try:\n    from sglang._version import __version__\nexcept ImportError:\n"
        "    import importlib.metadata\n\n    __version__ = importlib.metadata.version('sglang')\n")
    (checkout / "python" / "pyproject.toml").write_text(
        '[project]\nname = "sglang"\ndynamic = ["version"]\ndependencies = ["sglang-kernel==0.4.10"]\n\n'
        '[tool.setuptools_scm]\nversion = "not this"\n')
    (site / "sglang-9.9.9.dist-info").mkdir(parents=True)
    (site / "sglang-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    pythonpath = f"{checkout / 'python'}:{site}"
    # What importing the checkout's sglang reports: the installed package's version.
    imported = subprocess.run([sys.executable, "-c", "import sglang; print(sglang.__version__)"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": pythonpath})
    assert imported.stdout.strip() == "9.9.9"
    _git(checkout, "init", "-q", "-b", "main")
    _git(checkout, "add", "-A")
    _git(checkout, "commit", "-q", "-m", "release")
    _git(checkout, "tag", "v0.5.23")
    _git(checkout, "tag", "sgl-kernel-v0.4.10")  # another component's tag: not the version
    found = _versions(checkout, pythonpath)
    assert (found["sglang"], found["sglang_source"], found["sglang_installed"]) == ("0.5.23", "git describe", "9.9.9")
    (checkout / "NOTES").write_text("x\n")
    _git(checkout, "add", "NOTES")
    _git(checkout, "commit", "-q", "-m", "one more")
    found = _versions(checkout, pythonpath)
    assert found["sglang"].startswith("0.5.23-1-g") and found["sglang_kernel_pinned"] == "0.4.10"
    # A static [project] version (releases before setuptools-scm) wins over the tags.
    (checkout / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "0.5.1.post3"\n')
    assert _versions(checkout, pythonpath)["sglang"] == "0.5.1.post3"


WORKLOAD_BS5 = Workload(model_path="m", tp=8, batch_size=5, output_len=16, profile_steps=3)
STEM = "stepwatch-" + "0123abcd" * 4  # profile ids are uuid4().hex


def test_read_no_decode_report():
    report = {"found": [f"{STEM}-TP-0-EXTEND.trace.json.gz"], "stop_profile": "HTTP 500: Internal Server Error"}
    output = "Benchmark ...\n[stepwatch driver] no decode trace: " + json.dumps(report) + "\n"
    assert read_no_decode_report(output) == report
    assert read_no_decode_report("[stepwatch driver] traces: a, b\n") is None
    assert read_no_decode_report("[stepwatch driver] no decode trace: {trunc") is None


def test_reads_decode_min_bs():
    # sglang 0.5.23 sglang/srt/environ.py:462
    assert reads_decode_min_bs("    SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS = EnvInt(0)\n") is True
    assert reads_decode_min_bs("    SGLANG_PROFILE_V2 = EnvBool(False)\n") is False
    assert reads_decode_min_bs(None) is None


def test_explain_missing_decode_names_expected_found_and_remedy():
    found = [f"{STEM}-TP-{r}-EXTEND.trace.json.gz" for r in (1, 0, 2, 3, 4, 5, 6, 7)]
    lost = {"found": found, "stop_profile": "HTTP 500: Internal Server Error"}
    held = explain_missing_decode(lost, WORKLOAD_BS5, trace_stem=STEM, min_bs_read=True)
    ignored = explain_missing_decode(lost, WORKLOAD_BS5, trace_stem=STEM, min_bs_read=False)
    for text in (held, ignored):
        assert "\n" not in text
        assert text.startswith(f"no DECODE trace: expected {STEM}-TP-<rank>-DECODE.trace.json.gz (TP 0-7), found "
                               "-EXTEND traces of TP 0-7; /stop_profile answered HTTP 500 (no capture running): ")
        assert len(text) < 500  # the job table keeps 500 characters of an error
    assert "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=5 waits for a decode batch of 5 requests" in held
    assert "--max-running-requests" in held and "lower batch_size" in held
    assert "saved it as -EXTEND" in ignored and "raise profile_steps to at least batch_size (5)" in ignored
    assert "ignores SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS (not in its srt/environ.py)" in ignored
    no_environ = explain_missing_decode(lost, WORKLOAD_BS5, trace_stem=STEM, min_bs_read=None)
    assert "(it has no srt/environ.py)" in no_environ and len(no_environ) < 500
    two = explain_missing_decode({"found": found[:1] + [f"{STEM}-TP-0.trace.json.gz"], "stop_profile": "HTTP 200: ok"},
                                 WORKLOAD_BS5, trace_stem=STEM, min_bs_read=True)
    assert "found -EXTEND traces of TP 1; stageless traces of TP 0; /stop_profile answered HTTP 200 (see" in two
    nothing = explain_missing_decode({"found": [], "stop_profile": "URLError('timed out')"}, WORKLOAD_BS5,
                                     trace_stem=STEM, min_bs_read=True)
    assert "found no trace; /stop_profile answered URLError('timed out') (see the driver's log)" in nothing


def test_layers_script(tmp_path):
    def layers(config) -> int | None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        out = subprocess.run([sys.executable, "-c", LAYERS_SCRIPT, str(tmp_path)], capture_output=True, text=True)
        return json.loads(out.stdout)["layers"]

    assert layers({"num_hidden_layers": 78}) == 78
    assert layers({"text_config": {"num_hidden_layers": 61}}) == 61
    assert layers({"hidden_size": 1}) is None
    (tmp_path / "config.json").unlink()
    out = subprocess.run([sys.executable, "-c", LAYERS_SCRIPT, "org/model-on-the-hub"], capture_output=True, text=True)
    assert json.loads(out.stdout) == {"layers": None}


# --- Whole runs against the stand-in ----------------------------------------------------------

class RecordingHost(LocalHost):
    """This machine, remembering what it was asked to run and which temporary dirs it made."""

    def __init__(self):
        self.argvs: list[list[str]] = []
        self.temp_dirs: list[str] = []

    def run(self, argv, **kw):
        self.argvs.append(list(argv))
        return super().run(argv, **kw)

    def mkdtemp(self, prefix="stepwatch-"):
        self.temp_dirs.append(super().mkdtemp(prefix))
        return self.temp_dirs[-1]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """A stand-in SGLang checkout (SGLang cannot be installed here, FACTS.md section 4)."""
    root = tmp_path_factory.mktemp("fake-sglang")
    made = make_fake_sglang(root / "sglang")
    model = write_model_config(root / "model", layers=2)
    config = Config(hosts={"local": HostConfig("local", python=sys.executable)},
                    repos={"fake": RepoConfig("fake", str(made.path))},
                    patches={"gather": (str(GATHER_PATCH),), "stale": (str(STALE_PATCH),)})
    return made, model, config


def _spec(model: Path, variant: str = "unpatched", **workload) -> RunSpec:
    fields = dict(model_path=str(model), load_format="dummy", batch_size=1, input_len=16, output_len=8,
                  kv_cache_dtype="fp8_e4m3", attention_backend="flashinfer", profile_steps=3)
    return RunSpec(engine="sglang", workload=Workload(**{**fields, **workload}), repo="fake", ref="main",
                   variant=variant, timeout_s=600)


def _worktrees(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True,
                         text=True, check=True).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")]


def _run(fake, tmp_path_factory, sha_of: str = "current", **kw):
    made, model, config = fake
    host, lines, progress = RecordingHost(), [], []
    spec = _spec(model, **kw)
    bundle = run_sglang(spec, config, host, sha=getattr(made, f"{sha_of}_sha"),
                        work_dir_local=tmp_path_factory.mktemp("work"), on_line=lines.append,
                        should_stop=lambda: False, on_progress=lambda d, p: progress.append((d, p)))
    return bundle, host, lines, progress


@pytest.fixture(scope="module")
def unpatched(fake, tmp_path_factory):
    return _run(fake, tmp_path_factory)


@pytest.fixture(scope="module")
def patched(fake, tmp_path_factory):
    return _run(fake, tmp_path_factory, variant="gather")


def _top_op(bundle: Path):
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    stats = record.kernel_stats.to_pandas().groupby("name")["total_us"].sum().sort_values(ascending=False)
    return record, stats


def _trace_events(path: Path) -> list[dict]:
    """The complete events (ph X) of a torch.profiler trace."""
    with gzip.open(path) as f:
        text = f.read().decode("utf-8", "replace")
    return [e for e in json.loads(text, strict=False)["traceEvents"] if e.get("ph") == "X"]


def _step_spans(events: list[dict]) -> list[dict]:
    """SGLang's step spans (model_runner.py:1831), in time order."""
    return sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step[")),
                  key=lambda e: e["ts"])


def _ops_inside_spans(events: list[dict], name: str) -> tuple[int, int]:
    """(calls of CPU op `name` inside a step span, calls outside every one)."""
    spans = [(s["ts"], s["ts"] + s["dur"]) for s in _step_spans(events)]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == name]
    inside = sum(any(a <= e["ts"] and e["ts"] + e["dur"] <= b for a, b in spans) for e in ops)
    return inside, len(ops) - inside


@pytest.mark.slow
def test_run_current_layout_end_to_end(fake, unpatched):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4), current layout."""
    made, model, _ = fake
    bundle, host, lines, progress = unpatched
    m = read_bundle(bundle)
    assert (m.engine, m.variant, m.commit, m.repo) == ("sglang", "unpatched", made.current_sha, "fake")
    assert m.traces == ["stepwatch_batch1_input16_output8_decode.trace.json.gz"]
    assert m.extra["module"] == "sglang.benchmark.one_batch" and m.extra["timing_source"] == "jsonl"
    result = m.extra["result"]
    assert m.timing.tok_per_s == result["median_decode_throughput"]
    assert m.timing.median_ms == pytest.approx(result["median_decode_latency"] * 1000)
    assert m.timing.p10_ms == m.timing.p90_ms == m.timing.median_ms and m.timing.method == "sglang-one-batch"
    assert m.layers == 2 and m.profiled_steps == 3
    # The checkout's version (its tag), not an installed package's.
    assert (m.versions["sglang"], m.versions["sglang_source"]) == (CURRENT_VERSION, "git describe")
    assert m.versions["sglang_kernel_pinned"] == "0.4.10"
    assert m.workload["model_path"] == str(model) and "kv" not in m.workload
    # The benchmark ran from the worktree, with SGLang's environment, in the profiler directory.
    bench = next(a for a in host.argvs if "-m" in a)
    assert bench[bench.index("-m") + 1] == "sglang.benchmark.one_batch" and "--profile-stage" in bench
    assert any("Decode.  median latency" in line for line in lines)
    assert progress == [(i, 6) for i in range(1, 7)]
    # Nothing left behind: no worktree, no temporary directory on the host.
    assert _worktrees(made.path) == [str(made.path)]
    assert host.temp_dirs and not any(Path(d).exists() for d in host.temp_dirs)
    # sglang 0.5.23's step spans: one step[DECODE bs=1] per profiled decode step. Decode replays a
    # CUDA graph by default, so a span holds the copy of the inputs into the graph's buffers and
    # the launch; the model's matmuls run after it (on a GPU: on the device; here: on the host
    # when sample() waits for them), and so does sample()'s argmax.
    events = _trace_events(bundle / m.traces[0])
    assert [s["name"] for s in _step_spans(events)] == ["step[DECODE bs=1]"] * 3
    inside, outside = _ops_inside_spans(events, "aten::mm")
    assert inside == 0 and outside >= 3 * 2 * 2  # 3 steps x 2 layers x 2 projections
    assert _ops_inside_spans(events, "aten::copy_")[0] >= 3
    assert _ops_inside_spans(events, "aten::argmax") == (0, 3)
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    assert record.engine == "sglang" and record.tok_per_s == result["median_decode_throughput"]
    assert record.steps == 3 and record.commit == made.current_sha


@pytest.mark.slow
def test_run_old_layout_end_to_end(fake, tmp_path_factory):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4), early layout:
    sglang.bench_one_batch, --profile-filename-prefix, the whole run traced into the cwd."""
    made, _, _ = fake
    bundle, host, lines, _ = _run(fake, tmp_path_factory, sha_of="old")
    m = read_bundle(bundle)
    assert m.commit == made.old_sha and m.extra["module"] == "sglang.bench_one_batch"
    assert m.traces == ["stepwatch_batch1_input16_output8.trace.json.gz"]
    argv = m.extra["argv"]
    assert "--profile-filename-prefix" in argv and "--profile-stage" not in argv and "--profile-steps" not in argv
    assert m.profiled_steps == 8  # the prefill and all 7 decode steps
    assert m.versions["sglang"] == OLD_VERSION and m.versions["sglang_source"] == "python/sglang/version.py"
    assert _step_spans(_trace_events(bundle / m.traces[0])) == []  # releases before build_step_span_name
    assert any(line.startswith("Decode.  latency:") for line in lines)
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    assert record.tok_per_s == m.extra["result"]["median_decode_throughput"]
    assert _worktrees(made.path) == [str(made.path)]


@pytest.mark.slow
def test_patched_variant_loses_the_whole_pool_cast(unpatched, patched):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4): the stand-in patch
    replaces the whole-pool cast by a gather-then-cast, so the patched run really does less."""
    before, before_ops = _top_op(unpatched[0])
    after, after_ops = _top_op(patched[0])
    manifest = read_bundle(patched[0])
    assert manifest.variant == "gather" and manifest.extra["patches"] == [GATHER_PATCH.name]
    assert before_ops.index[0] == "aten::copy_"  # the pool-sized FP8 -> BF16 cast tops the unpatched trace
    assert after_ops.index[0] != "aten::copy_"
    assert after_ops.get("aten::copy_", 0.0) < before_ops["aten::copy_"] / 10
    assert after.tok_per_s > 2 * before.tok_per_s


@pytest.mark.slow
def test_patch_that_does_not_apply_leaves_nothing(fake, tmp_path):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4)."""
    made, model, config = fake
    host = RecordingHost()
    with pytest.raises(PatchFailed) as err:
        run_sglang(_spec(model, variant="stale"), config, host, sha=made.current_sha, work_dir_local=tmp_path)
    assert "fake-stale-context.patch" in str(err.value) and "patch does not apply" in err.value.output
    assert "patch failed: python/sglang/srt/layers/attention/flashinfer_mla_backend.py:10" in str(err.value)
    assert not any("-m" in a for a in host.argvs), "the benchmark ran"
    assert _worktrees(made.path) == [str(made.path)]
    assert list(tmp_path.iterdir()) == [] and not any(Path(d).exists() for d in host.temp_dirs)


@pytest.mark.slow
def test_missing_trace_is_an_error(fake, tmp_path):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4). With the CUDA
    profiler activity SGLang drives nsys and writes no torch trace; the stand-in does the same."""
    made, model, config = fake
    spec = _spec(model, extra_args=("--profile-activities=CUDA_PROFILER",))
    with pytest.raises(RunError, match="no decode trace: expected stepwatch_batch1_input16_output8_decode"):
        run_sglang(spec, config, LocalHost(), sha=made.current_sha, work_dir_local=tmp_path)
    assert _worktrees(made.path) == [str(made.path)] and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_printed_lines_when_no_jsonl(fake, tmp_path, monkeypatch):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4), told to write no JSONL."""
    made, model, config = fake
    monkeypatch.setenv("FAKE_SGLANG_NO_RESULT_FILE", "1")
    bundle = run_sglang(_spec(model), config, LocalHost(), sha=made.current_sha, work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert m.extra["timing_source"] == "printed" and m.extra["result"] == {}
    printed = parse_printed_decode((bundle / "benchmark.log").read_text())
    assert (m.timing.median_ms / 1000, m.timing.tok_per_s) == pytest.approx(printed)


@pytest.mark.slow
def test_eager_decode_span_covers_the_forward(fake, tmp_path):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4) with CUDA graphs off
    (`--disable-cuda-graph`, deprecated but accepted by sglang 0.5.23): the step span holds the
    whole forward; preparation and sample() stay outside it."""
    made, model, config = fake
    spec = _spec(model, batch_size=2, extra_args=("--disable-cuda-graph",))
    bundle = run_sglang(spec, config, LocalHost(), sha=made.current_sha, work_dir_local=tmp_path)
    events = _trace_events(bundle / read_bundle(bundle).traces[0])
    assert [s["name"] for s in _step_spans(events)] == ["step[DECODE bs=2]"] * 3
    assert _ops_inside_spans(events, "aten::mm") == (3 * 2 * 2, 0)
    assert _ops_inside_spans(events, "aten::argmax") == (0, 3)
    assert _ops_inside_spans(events, "aten::randint")[1] == 3  # prepare_for_decode's new KV rows


@pytest.mark.slow
def test_stand_in_prefill_span_is_named_like_sglang(fake, tmp_path):
    """The stand-in itself (SGLang cannot be installed here, FACTS.md section 4), its one-batch
    benchmark asked for the prefill stage: build_step_span_name (profile_utils.py:493-495) names an
    EXTEND forward `step[EXTEND bs={bs} toks={extend_num_tokens}]`, the batch's new tokens."""
    made, model, _ = fake
    argv = [sys.executable, "-m", "sglang.benchmark.one_batch", "--model-path", str(model), "--load-format", "dummy",
            "--batch-size", "2", "--input-len", "16", "--output-len", "4", "--profile", "--profile-stage", "prefill",
            "--profile-prefix", "p", "--result-filename", ""]
    env = {**os.environ, "PYTHONPATH": str(made.path / "python"), "SGLANG_TORCH_PROFILER_DIR": str(tmp_path),
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    events = _trace_events(tmp_path / "p_batch2_input16_output4_prefill.trace.json.gz")
    assert [s["name"] for s in _step_spans(events)] == ["step[EXTEND bs=2 toks=32]"]
    assert _ops_inside_spans(events, "aten::mm")[0] == 2 * 2  # prefill runs eagerly inside its span


@pytest.mark.slow
def test_flag_the_release_lacks_fails_like_sglang(fake, tmp_path):
    """Stand-in SGLang (it cannot be installed here, FACTS.md section 4): argparse rejects a flag
    the checked-out release does not have, as SGLang does, and the run ends with its message."""
    made, model, config = fake
    spec = _spec(model, extra_args=("--profile-steps=3",))
    with pytest.raises(CommandFailed, match="unrecognized arguments: --profile-steps=3"):
        run_sglang(spec, config, LocalHost(), sha=made.old_sha, work_dir_local=tmp_path)
    assert _worktrees(made.path) == [str(made.path)] and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_refused_before_anything_runs(fake, tmp_path):
    made, model, config = fake
    host = RecordingHost()
    with pytest.raises(RunError, match="expected a full commit sha"):
        run_sglang(_spec(model), config, host, sha="--output=x", work_dir_local=tmp_path)
    with pytest.raises(RunError, match="raise output_len"):
        run_sglang(_spec(model, profile_steps=8), config, host, sha=made.current_sha, work_dir_local=tmp_path)
    with pytest.raises(RunError, match="the server path needs at least"):
        run_sglang(_spec(model, tp=2, output_len=4), config, host, sha=made.current_sha, work_dir_local=tmp_path)
    assert host.argvs == [] and host.temp_dirs == []
    assert _worktrees(made.path) == [str(made.path)]


@pytest.mark.slow
def test_server_path_every_rank(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4): TP 2, two
    scheduler processes, each writing its own DECODE trace as SGLang's profiler_manager names it.
    The two requests reach the scheduler together (FAKE_SGLANG_BURST): one prefill batch."""
    made, model, config = fake
    monkeypatch.setenv("FAKE_SGLANG_BURST", "2")
    lines, host = [], RecordingHost()
    bundle = run_sglang(_spec(model, tp=2, batch_size=2, output_len=6), config, host, sha=made.current_sha,
                        work_dir_local=tmp_path, on_line=lines.append)
    m = read_bundle(bundle)
    assert len(m.traces) == 2 and all(t.endswith("-DECODE.trace.json.gz") for t in m.traces)
    assert [t.split("-TP-")[1][0] for t in m.traces] == ["0", "1"]
    assert m.extra["module"] == "sglang.launch_server" and m.extra["profile_request"]["num_steps"] == 3
    assert m.extra["server_env"]["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] == "2"
    assert m.extra["decode_min_bs_read"] is True and m.extra["decode_capture"] == "by-stage"
    assert m.timing.method == "sglang-server-stream" and m.profiled_steps == 3
    assert m.timing.tok_per_s == m.extra["result"]["median_decode_throughput"]
    assert any("The server is fired up" in line for line in lines)
    assert any("launching: SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=2 SGLANG_PROFILE_V2=0 " in line for line in lines)
    for trace in m.traces:
        assert [s["name"] for s in _step_spans(_trace_events(bundle / trace))] == ["step[DECODE bs=2]"] * 3
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    assert record.ranks == 2 and record.steps == 3
    assert _worktrees(made.path) == [str(made.path)]
    assert not _processes_of_run(host.temp_dirs[0])


def _staggered(monkeypatch, batch_size: int = 5, gap_steps: int = 2) -> None:
    """The stand-in server lets the batch's requests reach its scheduler gap_steps scheduler
    steps apart: each is prefilled alone, between decode steps of the earlier ones."""
    monkeypatch.setenv("FAKE_SGLANG_BURST", str(batch_size))
    monkeypatch.setenv("FAKE_SGLANG_STAGGER_STEPS", str(gap_steps))


STAGGERED = dict(tp=2, batch_size=5, output_len=16, profile_steps=3)


@pytest.mark.slow
def test_server_path_staggered_arrivals(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) modelling
    sglang 0.5.23's scheduler and by-stage profiler (profiler_manager.py:413-439): five requests
    prefilled in five EXTEND batches two steps apart, decode steps between them. Without
    SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS the fourth prefill stops the decode capture and saves it
    as -EXTEND: no DECODE trace ever comes (the server path before this variable waited 600 s,
    then /stop_profile answered 500). With it, the decode capture starts at the first decode of
    all five requests, and every rank's DECODE trace holds full-batch decode steps only."""
    made, model, config = fake
    _staggered(monkeypatch)
    bundle = run_sglang(_spec(model, **STAGGERED), config, RecordingHost(), sha=made.current_sha,
                        work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert len(m.traces) == 2 and all(t.endswith("-DECODE.trace.json.gz") for t in m.traces)
    assert m.extra["decode_capture"] == "by-stage" and m.profiled_steps == 3
    for trace in m.traces:
        assert [s["name"] for s in _step_spans(_trace_events(bundle / trace))] == ["step[DECODE bs=5]"] * 3


@pytest.mark.slow
def test_server_path_fails_fast_when_the_decode_trace_is_lost(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) at the older
    commit, whose profiler does not read SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS: the staggered
    batch loses its decode capture. The run ends as soon as the batch is over, with one line
    naming the expected trace, what the server wrote, /stop_profile's 500 and the remedy; not
    after a 600 s wait (which the run's timeout would have turned into CommandTimeout)."""
    made, model, config = fake
    _staggered(monkeypatch)
    seen: list[tuple[float, str]] = []
    host = RecordingHost()
    with pytest.raises(CommandFailed) as err:
        run_sglang(replace(_spec(model, **STAGGERED), timeout_s=300), config, host, sha=made.old_sha,
                   work_dir_local=tmp_path, on_line=lambda line: seen.append((time.monotonic(), line)))
    failed_at = time.monotonic()
    assert not isinstance(err.value, CommandTimeout)
    message = str(err.value)
    assert "\n" not in message and message.startswith("no DECODE trace: expected stepwatch-")
    assert "found -EXTEND traces of TP 0, 1; /stop_profile answered HTTP 500 (no capture running): " in message
    assert "ignores SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS (not in its srt/environ.py)" in message
    assert "raise profile_steps to at least batch_size (5)" in message
    batch_done = next(t for t, line in seen if line.startswith("Decode.  median latency"))
    assert failed_at - batch_done < 300  # seconds after the batch (clean-up included), never 600
    assert not _processes_of_run(host.temp_dirs[0])
    assert _worktrees(made.path) == [str(made.path)] and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_server_path_old_checkout_with_the_remedy_it_is_told(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) at the older
    commit, staggered as above, with the remedy the failure names: profile_steps >= batch_size
    keeps the prefill counter at or under its target (profiler_manager.py:423), so the decode
    capture is saved as -DECODE (holding the ramp-up, prefills included)."""
    made, model, config = fake
    _staggered(monkeypatch)
    bundle = run_sglang(_spec(model, **{**STAGGERED, "profile_steps": 5}), config, RecordingHost(),
                        sha=made.old_sha, work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert len(m.traces) == 2 and all(t.endswith("-DECODE.trace.json.gz") for t in m.traces)
    assert m.extra["decode_min_bs_read"] is False


@pytest.mark.slow
def test_server_path_fails_fast_when_the_batch_never_fills(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) that runs at
    most three requests at once (--max-running-requests 3) for a batch of five: with
    SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=5 the decode capture never starts; the run says so."""
    made, model, config = fake
    _staggered(monkeypatch, gap_steps=0)
    spec = _spec(model, batch_size=5, output_len=8, extra_args=("--max-running-requests=3",))
    with pytest.raises(CommandFailed) as err:
        run_sglang_server(spec, config, RecordingHost(), sha=made.current_sha, work_dir_local=tmp_path)
    assert not isinstance(err.value, CommandTimeout)
    message = str(err.value)
    assert "found -EXTEND traces of TP 0; /stop_profile answered HTTP 500 (no capture running): the decode " \
           "capture never started: SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=5 waits for a decode batch of 5" in message
    assert "--max-running-requests" in message


@pytest.mark.slow
def test_server_path_at_tp_1_and_cancel_stops_the_server(fake, tmp_path):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4): a cancel
    while the server runs stops the driver and the server's whole process tree."""
    made, model, config = fake
    seen, host = [], RecordingHost()
    with pytest.raises(CommandCancelled):
        run_sglang_server(_spec(model, output_len=6), config, host, sha=made.current_sha,
                          work_dir_local=tmp_path, on_line=seen.append,
                          should_stop=lambda: any("fired up" in line for line in seen))
    assert not _processes_of_run(host.temp_dirs[0])
    assert _worktrees(made.path) == [str(made.path)] and list(tmp_path.iterdir()) == []


def _processes_of_run(base: str, within_s: float = 120.0) -> list[int]:
    """Live processes started for a run: its driver, server and rank processes all carry the
    run's host directory in their environment (SGLANG_TORCH_PROFILER_DIR) or command line.
    Looks again every 0.1 s while some are left, for at most within_s (a stopped process may
    take a moment to exit on a loaded machine)."""
    import os
    import time

    deadline = time.monotonic() + within_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if any(base.encode() in (entry / part).read_bytes() for part in ("environ", "cmdline")):
                        found.append(int(entry.name))
                except OSError:
                    pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _read_trace_steps(path: Path):
    """The trace read alone, as `stepwatch import TRACE` reads it: its step spans give its steps."""
    from ingest.traces.analyse import analyse_trace
    from ingest.traces.trace_read import read_trace

    return analyse_trace(read_trace(path), load_rule_chain())


# One speculative decoding iteration of sglang 0.5.23's EAGLEWorkerV2 (eagle_worker_v2.py:1444-1510):
# the step spans, under CUDA graphs (the draft's graph replays bypass ModelRunner.forward) and eager
# (speculative_num_steps - 1 = 2 draft forwards, the verify, one draft-extend forward).
SPEC_ITERATION = {True: ["step[VERIFY bs=2]"],
                  False: ["step[DRAFT bs=2]", "step[DRAFT bs=2]", "step[VERIFY bs=2]", "step[DRAFT bs=2]"]}


@pytest.mark.slow
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "cuda-graphs"])
def test_speculative_decoding_trace_reads_one_step_per_iteration(fake, tmp_path, monkeypatch, graphs):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) running EAGLE
    speculative decoding as sglang 0.5.23 structures it: its DECODE trace has no `step[DECODE`
    span, and each decode iteration is a `draft` stage, a `step[VERIFY ...]` forward and a
    `draft_extend` stage (profile_utils.py:485-488, spec_utils.py:852). The reader takes one step
    per iteration, timed from the draft stage's start to the draft-extend stage's end; main's read
    every span as a step (eager: 12 steps for 3 iterations) or the verify forward alone."""
    made, model, config = fake
    monkeypatch.setenv("FAKE_SGLANG_BURST", "2")
    extra = ("--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(model),
             "--speculative-num-steps", "3") + (() if graphs else ("--disable-cuda-graph",))
    bundle = run_sglang_server(_spec(model, batch_size=2, output_len=6, extra_args=extra), config, RecordingHost(),
                               sha=made.current_sha, work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert len(m.traces) == 1 and m.traces[0].endswith("-TP-0-DECODE.trace.json.gz")
    events = _trace_events(bundle / m.traces[0])
    assert [s["name"] for s in _step_spans(events)] == SPEC_ITERATION[graphs] * 3
    stages = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"] in ("draft", "draft_extend")),
                    key=lambda e: e["ts"])
    assert [s["name"] for s in stages] == ["draft", "draft_extend"] * 3
    expected_us = [e["ts"] + e["dur"] - d["ts"] for d, e in zip(stages[::2], stages[1::2])]
    figures = _read_trace_steps(bundle / m.traces[0])
    assert (figures.step_method, figures.steps) == ("span", 3)
    assert list(figures.step_table["wall_us"]) == pytest.approx(expected_us, abs=1e-3)
    assert figures.step_ms_median == pytest.approx(sorted(expected_us)[1] / 1e3, abs=1e-6)
    assert any(n.startswith("SGLang speculative decoding: 3 decode iterations") for n in figures.notes)


# --- The stand-in's server arguments and /generate, against sglang 0.5.23's -------------------

@pytest.fixture(scope="module")
def release_fake(sglang_wheel, tmp_path_factory):
    """A stand-in SGLang checkout whose servers declare sglang 0.5.23's whole server-argument set,
    read from the wheel at test time (tests/sglang_wheel.py read_server_flags; skips without a
    network, as every wheel test does)."""
    from tests.sglang_wheel import read_server_flags

    root = tmp_path_factory.mktemp("fake-sglang-release-flags")
    made = make_fake_sglang(root / "sglang", server_flags=read_server_flags(sglang_wheel))
    model = write_model_config(root / "model", layers=2)
    config = Config(hosts={"local": HostConfig("local", python=sys.executable)},
                    repos={"fake": RepoConfig("fake", str(made.path))}, patches={})
    return made, model, config


def _parse_server_args(checkout: Path, *argv: str) -> subprocess.CompletedProcess:
    """The stand-in's ServerArgs.add_cli_args parser on argv, as launch_server builds it."""
    code = ("import argparse, json, sys; from sglang.srt.server_args import ServerArgs; p = argparse.ArgumentParser(); "
            "ServerArgs.add_cli_args(p); a = ServerArgs.from_cli_args(p.parse_args(sys.argv[1:])); "
            "print(json.dumps({k: getattr(a, k) for k in ('tp_size', 'max_total_tokens', 'disable_cuda_graph')}))")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=checkout, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(checkout / "python")}, timeout=120)


def test_stand_in_takes_the_release_server_flags_and_refuses_others_as_argparse_does(release_fake):
    """The stand-in (SGLang cannot be installed here, FACTS.md section 4) declares every server flag
    of sglang 0.5.23 (read from its fields/*.py and server_args.py): real flags main's stand-in did not
    know pass, with SGLang's aliases, prefixes and human_readable_int values; an unknown flag, a value
    outside a flag's choices and a non-number for a number are refused with exit 2, as argparse does."""
    made = release_fake[0]
    ok = _parse_server_args(made.path, "--model", "m", "--tensor-parallel-size", "2", "--mem-fraction-static", "0.8",
                            "--cuda-graph-max-bs-decode", "16", "--chunked-prefill-size", "4096",
                            "--enable-mixed-chunk",
                            "--max-total-tokens", "4Ki", "--disable-cuda-graph", "--attn-dp-size", "2",
                            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"tp_size": 2, "max_total_tokens": 4096, "disable_cuda_graph": True}
    for argv, message in [(("--mem-fraction-statik", "0.8"), "unrecognized arguments: --mem-fraction-statik 0.8"),
                          (("--kv-cache-dtype", "fp8"), "argument --kv-cache-dtype: invalid choice: 'fp8'"),
                          (("--cuda-graph-max-bs-decode", "many"),
                           "argument --cuda-graph-max-bs-decode: invalid int value: 'many'"),
                          # 0.5.23 has no --cuda-graph-max-bs: only its -decode and -prefill flags
                          (("--cuda-graph-max-bs", "8"), "ambiguous option: --cuda-graph-max-bs could match"),
                          ((), "the following arguments are required: --model-path/--model")]:
        refused = _parse_server_args(made.path, *(("--model-path", "m") if argv else ()), *argv)
        assert refused.returncode == 2 and message in refused.stderr, (argv, refused.stderr[-300:])


@pytest.mark.slow
def test_server_run_with_real_extra_args(release_fake, tmp_path):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) declaring sglang
    0.5.23's server arguments: a spec's extra_args with real flags main's stand-in refused
    (--mem-fraction-static, --cuda-graph-max-bs-decode, --chunked-prefill-size) run, and are in the argv."""
    made, model, config = release_fake
    extra = ("--mem-fraction-static", "0.8", "--cuda-graph-max-bs-decode", "8", "--chunked-prefill-size=4096")
    bundle = run_sglang_server(_spec(model, output_len=6, extra_args=extra), config, RecordingHost(),
                               sha=made.current_sha, work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert m.extra["argv"][-5:] == list(extra) and len(m.traces) == 1
    assert [s["name"] for s in _step_spans(_trace_events(bundle / m.traces[0]))] == ["step[DECODE bs=1]"] * 3


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_generate_refuses_unknown_sampling_parameters_with_400(fake, tmp_path):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4): /generate
    checks its body against sglang 0.5.23's API contract before admitting it (http_server.py:937-939,
    api_types.py:1256-1320): an unknown sampling parameter is a 400 with serde's message; unknown
    keys of the request itself are ignored (api_types.py:237); a valid request streams its tokens."""
    import urllib.error
    import urllib.request

    made, model, _ = fake
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                               "--load-format", "dummy", "--port", str(port)], cwd=made.path,
                              env={**os.environ, "PYTHONPATH": str(made.path / "python")},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def post(body):
        req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=5):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the stand-in server did not start"
                time.sleep(0.5)
        status, body = post({"input_ids": [1, 2, 3], "sampling_params": {"max_new_token": 4}})
        assert status == 400
        assert body["error"].startswith("unknown field `max_new_token`, expected one of `max_new_tokens`, `stop`, ")
        assert post({"input_ids": [1, 2, 3], "no_such_key": 1, "sampling_params": {"max_new_tokens": 2}}) == (
            200, {"text": "xx", "meta_info": {"prompt_tokens": 3, "completion_tokens": 2}})
    finally:
        server.terminate()
        server.wait(timeout=60)


# --- The model directory --load-format dummy still needs -------------------------------------

def _one_batch(checkout: Path, model: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sglang.benchmark.one_batch", "--model-path", str(model),
                           "--load-format", "dummy", "--batch-size", "1", "--input-len", "8", "--output-len", "4"],
                          cwd=checkout, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(checkout / "python")})


@pytest.mark.slow
def test_stand_in_refuses_a_model_directory_without_config_or_tokenizer(fake, tmp_path):
    """The stand-in (SGLang cannot be installed here, FACTS.md section 4) needs what sglang 0.5.23's
    one-batch benchmark reads with --load-format dummy: config.json with a model_type
    (ModelConfig.from_server_args, one_batch.py:332) and a tokenizer (get_tokenizer, :374-378)."""
    made = fake[0]
    assert _one_batch(made.path, write_model_config(tmp_path / "full")).returncode == 0
    no_tokenizer = _one_batch(made.path, write_model_config(tmp_path / "no-tokenizer", tokenizer=False))
    assert no_tokenizer.returncode == 1 and f"OSError: Can't load tokenizer for '{tmp_path}/no-tokenizer'" in \
        no_tokenizer.stderr
    untyped = write_model_config(tmp_path / "no-model-type")
    (untyped / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    refused = _one_batch(made.path, untyped)
    assert refused.returncode == 1 and "Should have a `model_type` key in its config.json" in refused.stderr


@pytest.mark.parametrize("server", [False, True], ids=["one-batch", "server"])
def test_engine_refuses_a_model_directory_sglang_cannot_load_up_front(fake, tmp_path, server):
    """The engine says what SGLang would stop on (after minutes of start-up on a GPU host), before
    any worktree or process: one line naming the directory and what it lacks."""
    made, _, config = fake
    run = run_sglang_server if server else run_sglang
    bare = write_model_config(tmp_path / "bare", tokenizer=False)
    host = RecordingHost()
    with pytest.raises(RunError) as err:
        run(_spec(bare), config, host, sha=made.current_sha, work_dir_local=tmp_path / "work")
    assert str(err.value) == (f"workload.model_path: {bare} has no tokenizer (none of tokenizer.json, "
                              "tokenizer.model, vocab.json, ...); sglang 0.5.23 reads the model's Hugging Face "
                              "config.json and its tokenizer even with --load-format dummy (only the weights are "
                              "skipped)")
    (bare / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    with pytest.raises(RunError, match=f"^workload.model_path: {bare}/config.json has no model_type "):
        run(_spec(bare), config, host, sha=made.current_sha, work_dir_local=tmp_path / "work")
    with pytest.raises(RunError, match=f"^workload.model_path: {tmp_path}/none is not a directory; "):
        run(_spec(tmp_path / "none"), config, host, sha=made.current_sha, work_dir_local=tmp_path / "work")
    assert _worktrees(made.path) == [str(made.path)] and not any(Path(d).exists() for d in host.temp_dirs)
    # a tokenizer elsewhere (--tokenizer-path), or none loaded (the server's --skip-tokenizer-init): no refusal
    from ingest.runs.engines.sglang import plan_model_dir_check

    assert plan_model_dir_check(Workload(model_path="/m", extra_args=("--tokenizer-path=/t",)), server) == \
        ["/m", "/t", "1"]
    assert plan_model_dir_check(Workload(model_path="/m", extra_args=("--skip-tokenizer-init",)), server) == \
        ["/m", "/m", "0" if server else "1"]


# --- DP ranks: each holds its share of the batch ------------------------------------------------

@pytest.mark.parametrize("extra,ranks", [((), 1), (("--attn-dp-size", "2"), 2),
                                         (("--attention-data-parallel-size=4",), 4),
                                         (("--dp-size", "2", "--enable-dp-attention"), 2)])
def test_decode_threshold_is_each_dp_rank_share(extra, ranks):
    """sglang 0.5.23 compares SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS with each DP rank's own batch
    (profiler_manager.py:431-434, ScheduleBatch.batch_size()): with 4 DP ranks no rank ever holds
    the whole batch of 8, so main's threshold of 8 never started a decode capture."""
    workload = Workload(model_path="m", tp=4, batch_size=8, output_len=8, extra_args=extra)
    check_server_workload(workload)
    assert build_server_env(workload)["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] == str(8 // ranks)


def test_dp_layouts_the_server_path_cannot_profile_are_refused_in_one_line():
    with pytest.raises(SpecError) as err:
        check_server_workload(Workload(model_path="m", tp=2, batch_size=5, output_len=8,
                                       extra_args=("--attn-dp-size", "2")))
    assert str(err.value) == ("workload.batch_size 5: does not split evenly over the 2 DP ranks of --attn-dp-size 2; "
                              "SGLang deals requests round robin and each rank's profiler waits for its own "
                              "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS requests: use a multiple of 2")
    with pytest.raises(SpecError, match=r"^workload.extra_args --dp-size 2: DP replicas write traces of the same TP "
                                        r"ranks \(-TP-0-DP-0, -TP-0-DP-1, ...\)"):
        check_server_workload(Workload(model_path="m", tp=2, batch_size=4, output_len=8,
                                       extra_args=("--data-parallel-size=2",)))
    with pytest.raises(SpecError, match=r"^workload.extra_args --attn-dp-size 'two': not a positive integer$"):
        check_server_workload(Workload(model_path="m", tp=2, batch_size=4, output_len=8,
                                       extra_args=("--attn-dp-size", "two")))


@pytest.mark.slow
def test_server_path_with_dp_attention(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) with DP attention
    as sglang 0.5.23 runs it: TP 2 as 2 attention-DP ranks, requests dealt round robin, each rank's
    profiler counting its own batch of 2 and naming its files -TP-{tp}-DP-{dp}
    (profiler_manager.py:344-351). The engine sets the decode threshold to the rank's share (2), so
    each rank's DECODE trace holds 3 decode steps of its 2 requests; the importer reads the rank
    from -TP-. Main's engine asked for 4 on each rank: the decode capture never started."""
    made, model, config = fake
    monkeypatch.setenv("FAKE_SGLANG_BURST", "4")
    spec = _spec(model, tp=2, batch_size=4, output_len=6, extra_args=("--attn-dp-size", "2"))
    bundle = run_sglang(spec, config, RecordingHost(), sha=made.current_sha, work_dir_local=tmp_path)
    m = read_bundle(bundle)
    assert m.extra["server_env"]["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] == "2"
    assert [t.split("-", 1)[1].split("-", 1)[1] for t in m.traces] == ["TP-0-DP-0-DECODE.trace.json.gz",
                                                                       "TP-1-DP-1-DECODE.trace.json.gz"]
    for trace in m.traces:
        assert [s["name"] for s in _step_spans(_trace_events(bundle / trace))] == ["step[DECODE bs=2]"] * 3
    record = prepare_import(bundle, load_rule_chain(), ImportOptions())
    assert record.ranks == 2 and record.steps == 3


@pytest.mark.slow
def test_stand_in_counts_mixed_batches_as_prefill(fake, tmp_path, monkeypatch):
    """Stand-in SGLang server (SGLang cannot be installed here, FACTS.md section 4) with
    --enable-mixed-chunk: a request that arrives while others decode is prefilled in one MIXED
    forward with their decode step, and the by-stage profiler counts MIXED as a prefill
    (ForwardMode.is_prefill, forward_batch_info.py:224-235; profiler_manager.py:415). At the older
    commit (no decode threshold) the first MIXED batch after the decode capture began stops it and
    saves it as -EXTEND: no DECODE trace, as with a late EXTEND. With the threshold (current
    commit) the capture waits for all 3 requests, and holds full-batch decode steps only."""
    made, model, config = fake
    _staggered(monkeypatch, batch_size=3, gap_steps=2)
    spec = _spec(model, tp=2, batch_size=3, output_len=10, profile_steps=1, extra_args=("--enable-mixed-chunk",))
    with pytest.raises(CommandFailed) as err:
        run_sglang(spec, config, RecordingHost(), sha=made.old_sha, work_dir_local=tmp_path / "old")
    assert "found -EXTEND traces of TP 0, 1; /stop_profile answered HTTP 500 (no capture running)" in str(err.value)
    bundle = run_sglang(spec, config, RecordingHost(), sha=made.current_sha, work_dir_local=tmp_path / "current")
    for trace in read_bundle(bundle).traces:
        assert [s["name"] for s in _step_spans(_trace_events(bundle / trace))] == ["step[DECODE bs=3]"]


def _fake_module(checkout: Path, name: str):
    """A module of the stand-in checkout, imported from its python/ (its own copy of sys.modules
    entries is not kept: each call loads the file afresh)."""
    import importlib.util

    path = checkout / "python" / (name.replace(".", "/") + ".py")
    spec = importlib.util.spec_from_file_location(f"stand_in_{name.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(checkout / "python"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(checkout / "python"))
    return module


def _release_prefill_modes(wheel: Path) -> tuple[str, ...]:
    """ForwardMode.is_extend's modes in sglang 0.5.23 (forward_batch_info.py:227-235), without the
    one it takes only when asked (include_draft_extend_v2): what is_prefill counts."""
    import ast
    import zipfile

    with zipfile.ZipFile(wheel) as whl:
        source = whl.read("sglang/srt/model_executor/forward_batch_info.py").decode()
    func = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "is_extend")
    ret = next(n for n in ast.walk(func) if isinstance(n, ast.Return))
    return tuple(v.comparators[0].attr for v in ret.value.values if isinstance(v, ast.Compare))


def test_stand_in_prefill_counting_is_the_release(fake, sglang_wheel, tmp_path):
    """The stand-in's by-stage profiler (SGLang cannot be installed here, FACTS.md section 4)
    counts as prefill exactly the modes sglang 0.5.23's ForwardMode.is_prefill does (read from
    the wheel), passes IDLE and PREBUILT, and raises on any other mode (profiler_manager.py:441-446)."""
    made = fake[0]
    manager = _fake_module(made.path, "sglang.srt.fake_profiler_manager")
    release = _release_prefill_modes(sglang_wheel)
    assert release == ("EXTEND", "MIXED", "TARGET_VERIFY", "SPLIT_PREFILL", "DLLM_EXTEND")
    assert manager.PREFILL_MODES == release
    profiler = manager.SchedulerProfilerManager(0, lambda: 0)
    profiler.init_profile(str(tmp_path), None, 2, ["CUDA_PROFILER"], False, False, True, "id")
    for mode in release:
        profiler.profile_batch_predicate(mode, 1)
    assert (profiler.profiler_prefill_ct, profiler.profiler_decode_ct) == (len(release), 0)
    profiler.profile_batch_predicate("IDLE", 0)
    profiler.profile_batch_predicate("PREBUILT", 1)
    with pytest.raises(RuntimeError, match="^unsupported profile stage: DRAFT_EXTEND_V2$"):
        profiler.profile_batch_predicate("DRAFT_EXTEND_V2", 1)


def test_stand_in_step_span_names_are_the_release(fake, sglang_wheel):
    """The stand-in's build_step_span_name (SGLang cannot be installed here, FACTS.md section 4)
    names every forward as sglang 0.5.23's utils/profile_utils.py:462-505 does, whose lines are
    checked in the wheel: DRAFT for any forward of a draft runner, VERIFY for TARGET_VERIFY, toks
    for EXTEND only, the mode's name otherwise (DECODE, IDLE, MIXED, DRAFT_EXTEND_V2)."""
    import zipfile

    with zipfile.ZipFile(sglang_wheel) as whl:
        release = whl.read("sglang/srt/utils/profile_utils.py").decode()
    for line in ('stage = "DRAFT"', "elif mode == ForwardMode.TARGET_VERIFY:", 'stage = "VERIFY"', "stage = mode.name",
                 'base = f"step[{stage} bs={bs} toks={ext_toks}"', 'base = f"step[{stage} bs={bs}"'):
        assert line in release, line
    name = _fake_module(fake[0].path, "sglang.srt.fake_step_span").build_step_span_name

    class Batch:
        def __init__(self, mode, bs, toks=None):
            self.forward_mode, self.batch_size, self.extend_num_tokens = mode, bs, toks

    assert name(Batch("EXTEND", 2, 32)) == "step[EXTEND bs=2 toks=32]"
    assert name(Batch("DECODE", 2)) == "step[DECODE bs=2]"
    assert name(Batch("TARGET_VERIFY", 2)) == "step[VERIFY bs=2]"
    assert name(Batch("MIXED", 3)) == "step[MIXED bs=3]" and name(Batch("IDLE", 0)) == "step[IDLE bs=0]"
    assert name(Batch("DECODE", 2), True) == name(Batch("DRAFT_EXTEND_V2", 2), True) == "step[DRAFT bs=2]"
    assert name(Batch("EXTEND", 2, 32), True) == "step[DRAFT bs=2 toks=32]"
