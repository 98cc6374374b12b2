"""`python -m kernels.bench` end to end on the CPU: a valid bundle, or one error line and nothing."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels.bundle import read_bundle

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kernels.bench", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny-fused"
    done = run_bench("--preset", "tiny", "--kv", "fused", "--device", "cpu", "--steps", "2",
                     "--timing-steps", "6", "--warmup", "1", "--context", "64",
                     "--commit", "a" * 40, "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out, done


@pytest.mark.slow
def test_last_stdout_line_is_the_bundle(bundle):
    out, done = bundle
    assert done.stdout.strip().splitlines()[-1] == str(out)
    assert "progress: timing 6/6" in done.stderr and "progress: profile 2/2" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["key_averages.json", "manifest.json", "trace.json.gz"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


@pytest.mark.slow
def test_manifest_round_trip(bundle):
    m = read_bundle(bundle[0])
    assert (m.engine, m.variant, m.layers, m.profiled_steps) == ("reference", "fused", 4, 2)
    assert m.commit == "a" * 40 and m.repo == "stepwatch" and m.traces == ["trace.json.gz"]
    assert m.workload["preset"] == "tiny" and m.workload["context"] == 64
    assert m.workload["cuda_graph"] is False and m.workload["kv_dim"] == 576
    assert m.device["type"] == "cpu" and m.versions["torch"]
    t = m.timing
    assert len(t.step_ms) == 6 and t.method == "perf-counter"
    assert min(t.step_ms) <= t.p10_ms <= t.median_ms <= t.p90_ms <= max(t.step_ms)
    assert t.tok_per_s == pytest.approx(1000.0 / t.median_ms)


@pytest.mark.slow
def test_trace_has_one_profiler_step_per_decode_step(bundle):
    trace = json.loads(gzip.decompress((bundle[0] / "trace.json.gz").read_bytes()))
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    # schedule(warmup=1): step #0 is the unrecorded warm-up, so the recorded steps are #1..#N
    assert steps == ["ProfilerStep#1", "ProfilerStep#2"]
    gathers = [e for e in trace["traceEvents"] if e.get("name") == "aten::index"]
    assert len(gathers) == 2 * 4  # one row gather per layer per step in the CPU fallback
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"])  # record_shapes


@pytest.mark.slow
def test_key_averages_are_rows_with_times(bundle):
    rows = json.loads((bundle[0] / "key_averages.json").read_text())
    by_name = {r["name"]: r for r in rows}
    assert by_name["aten::bmm"]["count"] == 2 * 4 * 2  # two per layer, 2 steps, 4 layers
    assert set(rows[0]) == {"name", "count", "self_device_time_total_us", "device_time_total_us",
                            "self_cpu_time_total_us", "cpu_time_total_us"}
    assert by_name["aten::bmm"]["cpu_time_total_us"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "huge", "--kv", "fused"], "--preset"),
        (["--preset", "tiny", "--kv", "fused", "--steps", "0"], "--steps"),
        (["--preset", "tiny", "--kv", "fused", "--warmup", "x"], "--warmup"),
        (["--preset", "tiny", "--kv", "fused", "--context", "9000"], "pool_tokens"),
        (["--preset", "tiny", "--kv", "fused", "--cuda-graph"], "--cuda-graph"),
    ],
)
@pytest.mark.slow
def test_bad_flags_exit_with_one_line_and_write_nothing(tmp_path, args, message):
    out = tmp_path / "b"
    done = run_bench(*args, "--device", "cpu", "--out", str(out))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_existing_non_empty_out_is_refused(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    done = run_bench("--preset", "tiny", "--kv", "fused", "--device", "cpu", "--out", str(tmp_path))
    assert done.returncode == 2 and "--out" in done.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.slow
def test_device_cuda_without_cuda_is_one_line(tmp_path):
    done = run_bench("--preset", "tiny", "--kv", "fused", "--device", "cuda", "--out", str(tmp_path / "b"))
    assert done.returncode == 2
    assert done.stderr.strip() == f"python -m kernels.bench: error: --device cuda: CUDA is not available (torch {__import__('torch').__version__})"
    assert list(tmp_path.iterdir()) == []
