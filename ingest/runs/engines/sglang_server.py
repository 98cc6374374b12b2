"""The sglang engine's server path (TP > 1): the command line and environment of
`sglang.launch_server`, the `/start_profile` request, the small standard-library driver script that
runs on the host (start the server, profile `profile_steps` decode steps by stage, send
`batch_size` streaming requests, collect every rank's DECODE trace), and the reading of its
failure. Pure builders, tested on SGLang's real contract (tests/test_engine_sglang.py,
tests/test_sglang_flags.py); engines/sglang.py runs them.

How SGLang's by-stage profiler loses a decode trace (sglang 0.5.23,
`sglang/srt/managers/scheduler_components/profiler_manager.py:413-439`): before every forward
the scheduler (`scheduler.py:4639`) counts prefill and decode batches separately. The first
prefill starts a capture; the first decode stops it (saved as `-EXTEND`) and starts the decode
capture; the decode capture is saved as `-DECODE` before decode number `num_steps + 1`. But the
prefill counter keeps counting while the decode capture runs, and prefill number `num_steps + 1`
stops *whatever capture is running* and saves it as `-EXTEND` (line 425). Requests that arrive
a few forwards apart are prefilled in separate batches between decodes (prefill first:
`scheduler.py:3993`), so at batch size >= num_steps + 1 the decode capture can be lost: no
`-DECODE` file ever appears and `/stop_profile` answers 500 (no capture in progress, line 325,
raised at `tokenizer_control_mixin.py:427`). With `SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS=N`
(`environ.py:462`; read at `profiler_manager.py:431`) the decode capture starts only at a decode
batch of at least N requests, i.e. once the whole batch is admitted, and no prefill follows it.
"""

from __future__ import annotations

import json

from ..errors import RunError, SpecError
from ..spec import Workload

RUN_NAME = "stepwatch"

LAUNCH_SERVER_FILE = "python/sglang/launch_server.py"
ENVIRON_FILE = "python/sglang/srt/environ.py"
SERVER_TIMING_METHOD = "sglang-server-stream"
DECODE_MIN_BS_ENV = "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"
NO_DECODE_MARK = "[stepwatch driver] no decode trace: "


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


def read_extra_arg(extra_args: tuple[str, ...] | list[str], *flags: str) -> str | None:
    """The value a flag (any of its spellings) is given in extra_args, `--flag V` or `--flag=V`;
    the last one wins, as in argparse; None when absent."""
    found = None
    for i, arg in enumerate(extra_args):
        name, eq, value = arg.partition("=")
        if name in flags:
            found = value if eq else (extra_args[i + 1] if i + 1 < len(extra_args) else None)
    return found


def plan_dp_ranks(workload: Workload) -> int:
    """How many data-parallel ranks share the batch: sglang 0.5.23's attention DP size
    (--attn-dp-size / --attention-data-parallel-size, or the deprecated --enable-dp-attention with
    --dp-size, server_args.py:416-423). Raises SpecError for what the server path cannot profile:
    DP replicas (--dp-size without DP attention), whose traces repeat TP ranks 0..tp-1 under
    -DP-0, -DP-1, ... (profiler_manager.py:344-351) where stepwatch reads one trace per rank; a
    batch that does not split evenly over the DP ranks, since each rank's profiler compares
    SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS with its own batch (profiler_manager.py:431-434)
    and the requests are dealt round robin (serving_hook.py:217-235)."""
    def size(*flags: str) -> int:
        value = read_extra_arg(workload.extra_args, *flags)
        if value is None:
            return 1
        if not value.isdigit() or int(value) < 1:
            raise SpecError(f"workload.extra_args {flags[0]} {value!r}: not a positive integer")
        return int(value)

    dp = size("--dp-size", "--data-parallel-size")
    attn_dp = size("--attn-dp-size", "--attention-data-parallel-size")
    if "--enable-dp-attention" in workload.extra_args and dp > 1:
        dp, attn_dp = 1, dp
    if dp > 1:
        raise SpecError(f"workload.extra_args --dp-size {dp}: DP replicas write traces of the same TP ranks "
                        f"(-TP-0-DP-0, -TP-0-DP-1, ...) and stepwatch reads one trace per rank; profile one "
                        f"replica (no --dp-size) or use DP attention (--attn-dp-size {dp})")
    if workload.batch_size % attn_dp:
        raise SpecError(f"workload.batch_size {workload.batch_size}: does not split evenly over the {attn_dp} DP "
                        f"ranks of --attn-dp-size {attn_dp}; SGLang deals requests round robin and each rank's "
                        f"profiler waits for its own {DECODE_MIN_BS_ENV} requests: use a multiple of {attn_dp}")
    return attn_dp


def build_server_env(workload: Workload) -> dict[str, str]:
    """What the driver adds to the server's environment: hold the decode capture back until a
    decode batch holds all its DP rank's share of the `batch_size` requests (no prefill can follow
    it, so it cannot be saved as -EXTEND; each DP rank compares the variable with its own batch,
    profiler_manager.py:431-434), and pin profiler manager v1 (`SGLANG_PROFILE_V2`,
    `environ.py:458`): v2 names its files `-prefill`/`-decode`, stops a capture at any stage
    change and ignores the variable."""
    return {DECODE_MIN_BS_ENV: str(workload.batch_size // plan_dp_ranks(workload)), "SGLANG_PROFILE_V2": "0"}


def reads_decode_min_bs(environ_source: str | None) -> bool | None:
    """Whether a checkout's `python/sglang/srt/environ.py` declares the decode-capture variable
    (older releases ignore it); None when the checkout has no such file."""
    if environ_source is None:
        return None
    return DECODE_MIN_BS_ENV in environ_source


def build_profile_request(output_dir: str, profile_steps: int, profile_prefix: str, profile_id: str) -> dict:
    """The body of `POST /start_profile`: `profile_steps` decode steps of every rank, by stage
    (so the DECODE trace holds decode steps only), with stacks and shapes."""
    return {"output_dir": output_dir, "num_steps": profile_steps, "activities": ["CPU", "GPU"],
            "profile_by_stage": True, "with_stack": True, "record_shapes": True,
            "profile_prefix": profile_prefix, "profile_id": profile_id}


def check_server_workload(workload: Workload) -> None:
    """The server stops a by-stage decode profile on the decode step after the last profiled one,
    so the load must run at least profile_steps + 1 decode steps; and its DP ranks must each get
    an equal share of the batch (plan_dp_ranks)."""
    plan_dp_ranks(workload)
    if workload.output_len < workload.profile_steps + 2:
        raise SpecError(f"workload.output_len {workload.output_len}: the server path needs at least "
                       f"profile_steps + 2 = {workload.profile_steps + 2} output tokens")


def build_driver_config(server_argv: list[str], workload: Workload, *, result_file: str, trace_dir: str,
                        profile_request: dict, startup_timeout_s: float, trace_timeout_s: float = 600.0) -> dict:
    """What SERVER_DRIVER_SCRIPT reads from its one argument (JSON). trace_timeout_s bounds the
    wait for a trace that is being written (and /stop_profile, which writes one), never a wait
    for a trace that will not come."""
    return {"server_argv": server_argv, "server_env": build_server_env(workload),
            "batch_size": workload.batch_size, "input_len": workload.input_len,
            "output_len": workload.output_len, "ranks": workload.tp, "result_file": result_file,
            "trace_dir": trace_dir,
            "trace_stem": f"{profile_request['profile_prefix']}-{profile_request['profile_id']}",
            "profile_request": profile_request, "startup_timeout_s": startup_timeout_s,
            "trace_timeout_s": trace_timeout_s, "run_name": RUN_NAME}


def read_no_decode_report(output: str) -> dict | None:
    """The driver's report that no DECODE trace came ({"found": [file names], "stop_profile":
    its answer}), from its output; None when it made none."""
    for line in reversed(output.splitlines()):
        at = line.find(NO_DECODE_MARK)
        if at >= 0:
            try:
                report = json.loads(line[at + len(NO_DECODE_MARK):])
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _format_ranks(ranks: list[str]) -> str:
    """`0-7` for every rank from 0 up, else `0, 2`."""
    ordered = sorted(ranks, key=lambda r: (len(r), r))
    if len(ordered) > 2 and ordered == [str(i) for i in range(len(ordered))]:
        return f"0-{len(ordered) - 1}"
    return ", ".join(ordered)


def _summarise_traces(names: list[str], stem: str) -> str:
    """`-EXTEND traces of TP 0-7` for the files of one profile (their long id left out)."""
    kinds: dict[str, list[str]] = {}
    for name in names:
        rest = name.removeprefix(stem + "-TP-")
        rank, _, tail = rest.partition("-")
        stage = tail.split(".trace.json")[0].rpartition("-")[2] if tail else ""
        stage = stage if stage in ("EXTEND", "DECODE") else ""
        kinds.setdefault(f"-{stage}" if stage else "stageless", []).append(rank.split(".")[0])
    parts = [f"{kind} traces of TP {_format_ranks(ranks)}" for kind, ranks in sorted(kinds.items())]
    return "; ".join(parts) or "no trace"


def explain_missing_decode(report: dict, workload: Workload, *, trace_stem: str, min_bs_read: bool | None) -> str:
    """One line (under 500 characters, what the job table keeps) for a server run that wrote no
    DECODE trace: what was expected, what the server wrote, what /stop_profile answered, why,
    and what to change."""
    bs = workload.batch_size
    found = _summarise_traces([str(n) for n in report.get("found") or []], trace_stem)
    answer = str(report.get("stop_profile") or "nothing")
    status = answer.partition(":")[0] if answer.startswith("HTTP ") else answer
    ranks = _format_ranks([str(r) for r in range(workload.tp)])
    head = (f"no DECODE trace: expected {trace_stem}-TP-<rank>-DECODE.trace.json.gz (TP {ranks}), found {found}; "
            f"/stop_profile answered {status}")
    if status != "HTTP 500":
        return head + " (see the driver's log)"
    if min_bs_read:
        dp = plan_dp_ranks(workload)
        share = bs // dp
        where = f" on each of its {dp} DP ranks" if dp > 1 else ""
        return (f"{head} (no capture running): the decode capture never started: {DECODE_MIN_BS_ENV}={share} waits "
                f"for a decode batch of {share} requests{where} and none came; let the server run {bs} requests at "
                f"once (--max-running-requests, KV memory) or lower batch_size")
    where = "not in its srt/environ.py" if min_bs_read is False else "it has no srt/environ.py"
    return (f"{head} (no capture running): a prefill after decode capture began (staggered arrivals) stopped it "
            f"and saved it as -EXTEND; this checkout ignores {DECODE_MIN_BS_ENV} ({where}): raise profile_steps to "
            f"at least batch_size ({bs}) or use a commit that reads it")


# Runs on the host, standard library only: launch the server on a free port with
# cfg["server_env"] added to its environment, wait for /health, warm up, POST /start_profile,
# send batch_size streaming requests at once, print the decode figures in the one-batch
# benchmark's format and append its JSONL record, then collect every rank's DECODE trace. Once
# the batch has finished no forward runs, and SGLang's profiler only acts before a forward, so
# every trace this profile will write by itself is written by then: if a rank's DECODE trace is
# missing the driver asks /stop_profile at once (it saves a decode capture still running,
# stageless, and answers 500 when none runs) and, failing that, prints NO_DECODE_MARK + JSON and
# exits; it never waits for a trace that cannot come. The server is its child in its process
# group, so a timeout or cancel of the driver stops it too.
SERVER_DRIVER_SCRIPT = r'''
import json, os, shlex, socket, statistics, subprocess, sys, threading, time, urllib.error, urllib.request

cfg = json.loads(sys.argv[1])
NO_DECODE_MARK = "[stepwatch driver] no decode trace: "


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


def list_traces():
    stem = cfg["trace_stem"] + "-TP-"
    return sorted(n for n in os.listdir(cfg["trace_dir"]) if n.startswith(stem) and ".trace.json" in n)


def stage_of(name):
    stage = name.split(".trace.json")[0].rpartition("-")[2]
    return stage if stage in ("EXTEND", "DECODE") else None


def wait_written(names):
    """Wait (at most trace_timeout_s) until the files' sizes stop changing."""
    deadline, last = time.monotonic() + cfg["trace_timeout_s"], None
    while time.monotonic() < deadline:
        sizes = [os.path.getsize(os.path.join(cfg["trace_dir"], n)) for n in names]
        if sizes == last:
            return
        last = sizes
        time.sleep(1)
    sys.exit(f"the traces {', '.join(names)} were still growing after {cfg['trace_timeout_s']:.0f} s")


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
    names = [n for n in list_traces() if stage_of(n) == "DECODE"]
    if len(names) < cfg["ranks"]:
        try:
            answer = "HTTP 200: " + post(url + "/stop_profile", {}, cfg["trace_timeout_s"])
        except urllib.error.HTTPError as e:
            answer = f"HTTP {e.code}: {e.read().decode(errors='replace').strip()[:200]}"
        except Exception as e:
            answer = repr(e)[:200]
        say("no DECODE trace of every rank after the batch; stop_profile: " + answer)
        names = [n for n in list_traces() if stage_of(n) is None]
        if not answer.startswith("HTTP 200") or len(names) < cfg["ranks"]:
            print(NO_DECODE_MARK + json.dumps({"found": list_traces(), "stop_profile": answer}), flush=True)
            sys.exit(3)
        say("the decode capture was still running when the batch ended; /stop_profile saved it")
    wait_written(names)
    say("traces: " + ", ".join(names))


port = free_port()
url = f"http://127.0.0.1:{port}"
server_argv = cfg["server_argv"] + ["--host", "127.0.0.1", "--port", str(port)]
say("launching: " + shlex.join([f"{k}={v}" for k, v in sorted(cfg["server_env"].items())] + server_argv))
server = subprocess.Popen(server_argv, env={**os.environ, **cfg["server_env"]})
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
