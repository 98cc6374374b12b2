"""The sglang engine's server path (TP > 1): the command line of `sglang.launch_server`, the
`/start_profile` request, and the small standard-library driver script that runs on the host
(start the server, profile `profile_steps` decode steps by stage, send `batch_size` streaming
requests, wait for every rank's DECODE trace). Pure builders, tested on SGLang's real contract
(tests/test_engine_sglang.py, tests/test_sglang_flags.py); engines/sglang.py runs them."""

from __future__ import annotations

from ..errors import RunError
from ..spec import Workload

RUN_NAME = "stepwatch"

LAUNCH_SERVER_FILE = "python/sglang/launch_server.py"
SERVER_TIMING_METHOD = "sglang-server-stream"


def build_engine_flags(workload: Workload) -> list[str]:
    """The server arguments both benchmark paths pass on: weights format, KV dtype, attention."""
    argv: list[str] = []
    if workload.load_format:
        argv += ["--load-format", workload.load_format]
    if workload.kv_cache_dtype:
        argv += ["--kv-cache-dtype", workload.kv_cache_dtype]
    if workload.attention_backend:
        argv += ["--attention-backend", workload.attention_backend]
    return argv


def build_server_argv(python: str, workload: Workload) -> list[str]:
    """`python -m sglang.launch_server ...` without --host/--port (the driver picks a free port)."""
    if workload.model_path is None:
        raise RunError("workload.model_path: the sglang engine needs a model path")
    argv = [python, "-m", "sglang.launch_server", "--model-path", workload.model_path,
            "--tp-size", str(workload.tp)]
    return argv + build_engine_flags(workload) + list(workload.extra_args)


def build_profile_request(output_dir: str, profile_steps: int, profile_prefix: str, profile_id: str) -> dict:
    """The body of `POST /start_profile`: `profile_steps` decode steps of every rank, by stage
    (so the DECODE trace holds decode steps only), with stacks and shapes."""
    return {"output_dir": output_dir, "num_steps": profile_steps, "activities": ["CPU", "GPU"],
            "profile_by_stage": True, "with_stack": True, "record_shapes": True,
            "profile_prefix": profile_prefix, "profile_id": profile_id}


def check_server_workload(workload: Workload) -> None:
    """The server stops a by-stage decode profile on the decode step after the last profiled one,
    so the load must run at least profile_steps + 1 decode steps."""
    if workload.output_len < workload.profile_steps + 2:
        raise RunError(f"workload.output_len {workload.output_len}: the server path needs at least "
                       f"profile_steps + 2 = {workload.profile_steps + 2} output tokens")


def build_driver_config(server_argv: list[str], workload: Workload, *, result_file: str, trace_dir: str,
                        profile_request: dict, startup_timeout_s: float, trace_timeout_s: float = 600.0) -> dict:
    """What SERVER_DRIVER_SCRIPT reads from its one argument (JSON)."""
    return {"server_argv": server_argv, "batch_size": workload.batch_size, "input_len": workload.input_len,
            "output_len": workload.output_len, "ranks": workload.tp, "result_file": result_file,
            "trace_dir": trace_dir,
            "trace_stem": f"{profile_request['profile_prefix']}-{profile_request['profile_id']}",
            "profile_request": profile_request, "startup_timeout_s": startup_timeout_s,
            "trace_timeout_s": trace_timeout_s, "run_name": RUN_NAME}


# Runs on the host, standard library only: launch the server on a free port, wait for /health,
# warm up, POST /start_profile, send batch_size streaming /generate requests at once, print the
# decode figures in the one-batch benchmark's format and append its JSONL record, wait until every
# rank's DECODE trace is written (POST /stop_profile if they do not come), stop the server. The
# server is its child in its process group, so a timeout or cancel of the driver stops it too.
SERVER_DRIVER_SCRIPT = r'''
import json, os, socket, statistics, subprocess, sys, threading, time, urllib.request

cfg = json.loads(sys.argv[1])


def say(text):
    print(f"[stepwatch driver] {text}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, timeout_s):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return r.read().decode(errors="replace").strip()


def is_healthy(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


def wait_healthy(url, server, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the server exited with code {server.returncode} before it was healthy")
        if is_healthy(url):
            return
        time.sleep(1)
    sys.exit(f"the server was not healthy after {timeout_s:.0f} s")


def stream(url, input_ids, max_new_tokens):
    """(arrival time, completion tokens so far) of each streamed chunk of one request."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks = []
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            out = json.loads(data)
            if "error" in out:
                raise RuntimeError(f"/generate: {out['error']}")
            done = (out.get("meta_info") or {}).get("completion_tokens", len(chunks) + 1)
            chunks.append((time.perf_counter(), done))
    return chunks


def run_batch(url, batch_size, input_len, max_new_tokens):
    """batch_size streaming requests sent at once; each one's chunks."""
    results, errors = [None] * batch_size, []

    def one(i):
        ids = [100 + (i * 7919 + j * 104729) % 9000 for j in range(input_len)]
        try:
            results[i] = stream(url, ids, max_new_tokens)
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(batch_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"a /generate request failed: {errors[0]}")
    return results


def step_latency_s(chunks):
    """One request's mean decode step: from its first streamed token to its last, per token."""
    if len(chunks) < 2 or chunks[-1][1] <= chunks[0][1]:
        return None
    return (chunks[-1][0] - chunks[0][0]) / (chunks[-1][1] - chunks[0][1])


def wait_traces(folder, stem, ranks, timeout_s, decode_only):
    """Every rank's trace, once their sizes stop changing; None after timeout_s."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        names = sorted(n for n in os.listdir(folder) if n.startswith(stem + "-TP-") and ".trace.json" in n
                       and (not decode_only or "-DECODE.trace.json" in n))
        if len(names) >= ranks:
            sizes = [os.path.getsize(os.path.join(folder, n)) for n in names]
            if sizes == last:
                return names
            last = sizes
        time.sleep(2)
    return None


def measure(url):
    bs, il, ol = cfg["batch_size"], cfg["input_len"], cfg["output_len"]
    say("warm-up")
    run_batch(url, bs, il, min(8, ol))
    say("start_profile: " + post(url + "/start_profile", cfg["profile_request"], 600))
    print("Benchmark ...", flush=True)
    steps = [s for s in map(step_latency_s, run_batch(url, bs, il, ol)) if s]
    if not steps:
        sys.exit("no request streamed more than one token")
    latency = statistics.median(steps)
    throughput = bs / latency
    print(f"Decode.  median latency: {latency:6.5f} s, median throughput: {throughput:9.2f} token/s", flush=True)
    record = {"run_name": cfg["run_name"], "batch_size": bs, "input_len": il, "output_len": ol,
              "median_decode_latency": latency, "median_decode_throughput": throughput,
              "method": "server-stream", "requests": len(steps)}
    with open(cfg["result_file"], "a") as f:
        f.write(json.dumps(record) + "\n")


def collect_traces(url):
    names = wait_traces(cfg["trace_dir"], cfg["trace_stem"], cfg["ranks"], cfg["trace_timeout_s"], True)
    if names is None:
        say("no DECODE trace from every rank yet; stop_profile: " + post(url + "/stop_profile", {}, 600))
        names = wait_traces(cfg["trace_dir"], cfg["trace_stem"], cfg["ranks"], cfg["trace_timeout_s"], False)
    if names is None:
        sys.exit(f"the server wrote no trace of every rank into {cfg['trace_dir']}")
    say("traces: " + ", ".join(names))


port = free_port()
url = f"http://127.0.0.1:{port}"
say("launching: " + " ".join(cfg["server_argv"]))
server = subprocess.Popen(cfg["server_argv"] + ["--host", "127.0.0.1", "--port", str(port)])
try:
    wait_healthy(url, server, cfg["startup_timeout_s"])
    measure(url)
    collect_traces(url)
finally:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
'''
