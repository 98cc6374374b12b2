"""Real GPU traces in the shapes users bring, for stepwatch's conformance corpus.

Three captures, torch only (they run on the GPU machine as they are):

- `sglang-decode`: the reference decode step (kernels/workload.py, glm5 preset, whole-pool cast)
  profiled the way SGLang 0.5.23's one-batch benchmark profiles decode: the profiler is started
  and stopped by hand (no schedule, so no ProfilerStep), with_stack on, a synchronize after each
  step, each forward wrapped in `record_function("step[DECODE bs=N]")` as
  `ModelRunner.forward` wraps it (model_runner.py ~1831, `build_step_span_name`), the forward
  replayed from a CUDA graph, and small "prepare for decode" and "sample" kernels outside the
  span, as SGLang runs them. The file is named as one_batch names it:
  `{prefix}_batch{bs}_input{il}_output{ol}_decode.trace.json.gz`. Under the graph the host span
  covers only the launch of the replay; the step's time is on the GPU.
- `tp2`: two processes, one GPU each, NCCL: a tensor-parallel decode step (column-parallel
  up-projection, row-parallel down-projection, one all-reduce per layer), each forward in a
  `step[DECODE bs=N]` span, files named as SGLang's server names them:
  `{profile_id}-TP-{rank}-DECODE.trace.json.gz`. `--straggler-rank R --straggler-us U` gives rank R
  extra work before each all-reduce (a slower GPU, an uneven expert load), so the other rank
  waits in the collective; the run records that it was injected.

- `fp32-logits`: a bfloat16 decode step (rms norm, up- and down-projection per layer, as `tp2`'s
  on one GPU) whose logits are computed in float32 against an output projection kept in float32
  (as models that keep `lm_head` in float32 run it), recorded with record_shapes, eager, each
  forward in a `step[DECODE bs=1]` span: one float32 matrix product a step among bfloat16 ones.

Each capture writes `key_averages.json` beside its trace(s) (per rank for tp2), so the figures
can be checked against torch's own count. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

from kernels.bench import summarize_key_averages
from kernels.workload import DecodeWorkload, build_model, get_config


def _gzip_trace(prof, path: Path) -> None:
    raw = path.with_suffix("")  # .trace.json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst, 1 << 22)
    raw.unlink()


def capture_sglang_decode(out: Path, steps: int, preset: str, kv: str, prefix: str) -> dict:
    """One-batch-shaped decode trace of the reference workload under a CUDA graph."""
    cfg = get_config(preset)
    state = build_model(cfg, "cuda")
    work = DecodeWorkload(state, kv, cuda_graph=True)
    vocab = torch.randn(cfg.hidden, 32_000, device="cuda", dtype=torch.bfloat16) * 0.02
    positions = torch.zeros(cfg.batch_size, dtype=torch.int64, device="cuda")
    for _ in range(3):  # warm up outside the profile
        work.run_step()
    torch.cuda.synchronize()
    span = f"step[DECODE bs={cfg.batch_size}]"
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(steps):
            positions.add_(1)  # prepare_for_decode: runs outside the forward's span
            with record_function(span):
                hidden = work.run_step()
            torch.argmax(hidden @ vocab, dim=-1)  # sample(): outside the span too
            torch.cuda.synchronize()  # one_batch synchronizes after each decode step
    name = f"{prefix}_batch{cfg.batch_size}_input{cfg.context}_output{steps}_decode.trace.json.gz"
    _gzip_trace(prof, out / name)
    (out / "key_averages.json").write_text(json.dumps(summarize_key_averages(prof), indent=1) + "\n")
    return {"trace": name, "preset": preset, "kv": kv, "steps": steps, "span": span}


def _tp_rank(rank: int, world: int, out: str, layers: int, hidden: int, steps: int, straggler_rank: int,
             straggler_us: float, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0",
                      TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    torch.cuda.set_device(rank)
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    gen = torch.Generator(device="cuda").manual_seed(1234 + rank)
    shard = 4 * hidden // world
    w_up = [torch.randn(hidden, shard, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02 for _ in range(layers)]
    w_down = [torch.randn(shard, hidden, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
              for _ in range(layers)]
    extra = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, generator=gen)
    # how many extra 2048^3 GEMMs make straggler_us on this GPU (measured, not assumed)
    reps = 0
    if rank == straggler_rank and straggler_us > 0:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            extra @ extra
        end.record()
        torch.cuda.synchronize()
        reps = max(1, round(straggler_us / (start.elapsed_time(end) * 1e3 / 20)))
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)

    def forward(x):
        for up, down in zip(w_up, w_down):
            h = F.rms_norm(x, (hidden,), eps=1e-6)
            y = F.silu(h @ up) @ down  # column- then row-parallel: a partial sum on each rank
            for _ in range(reps):
                extra @ extra
            torch.distributed.all_reduce(y)
            x = x + y
        return x

    for _ in range(3):
        forward(x)
    torch.cuda.synchronize()
    torch.distributed.barrier()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(steps):
            with record_function("step[DECODE bs=1]"):
                x = forward(x)
            torch.cuda.synchronize()
    torch.distributed.barrier()
    _gzip_trace(prof, Path(out) / f"stepwatch-tp2-TP-{rank}-DECODE.trace.json.gz")
    (Path(out) / f"key_averages-TP-{rank}.json").write_text(json.dumps(summarize_key_averages(prof), indent=1) + "\n")
    torch.distributed.destroy_process_group()


def capture_tp2(out: Path, layers: int, hidden: int, steps: int, straggler_rank: int, straggler_us: float) -> dict:
    world = 2
    if torch.cuda.device_count() < world:
        raise SystemExit(f"tp2 needs {world} GPUs, this machine has {torch.cuda.device_count()}")
    port = 29500 + os.getpid() % 1000
    torch.multiprocessing.spawn(_tp_rank, args=(world, str(out), layers, hidden, steps, straggler_rank,
                                                straggler_us, port), nprocs=world, join=True)
    return {"ranks": world, "layers": layers, "hidden": hidden, "steps": steps,
            "straggler_rank": straggler_rank, "straggler_us_injected": straggler_us}


def capture_fp32_logits(out: Path, layers: int, hidden: int, vocab: int, steps: int) -> dict:
    """Eager bfloat16 decode with float32 logits, recorded with shapes (module docstring)."""
    gen = torch.Generator(device="cuda").manual_seed(1234)
    w_up = [torch.randn(hidden, 4 * hidden, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
            for _ in range(layers)]
    w_down = [torch.randn(4 * hidden, hidden, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
              for _ in range(layers)]
    lm_head = torch.randn(hidden, vocab, device="cuda", dtype=torch.float32, generator=gen) * 0.02  # kept in fp32
    x = torch.randn(1, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)

    def forward(x):
        for up, down in zip(w_up, w_down):
            x = x + F.silu(F.rms_norm(x, (hidden,), eps=1e-6) @ up) @ down
        return F.rms_norm(x, (hidden,), eps=1e-6).float() @ lm_head  # the float32 matrix product

    for _ in range(3):
        forward(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,
                 record_shapes=True) as prof:
        for _ in range(steps):
            with record_function("step[DECODE bs=1]"):
                logits = forward(x)
            torch.argmax(logits, dim=-1)  # sample(): outside the span
            torch.cuda.synchronize()
    name = "stepwatch-fp32-logits.trace.json.gz"
    _gzip_trace(prof, out / name)
    (out / "key_averages.json").write_text(json.dumps(summarize_key_averages(prof), indent=1) + "\n")
    return {"trace": name, "layers": layers, "hidden": hidden, "vocab": vocab, "steps": steps,
            "span": "step[DECODE bs=1]", "record_shapes": True, "tf32": torch.backends.cuda.matmul.allow_tf32}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("sglang-decode")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--steps", type=int, default=2)
    s.add_argument("--preset", default="glm5")
    s.add_argument("--kv", default="full-pool-cast")
    s.add_argument("--prefix", default="stepwatch")
    t = sub.add_parser("tp2")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--layers", type=int, default=16)
    t.add_argument("--hidden", type=int, default=4096)
    t.add_argument("--steps", type=int, default=3)
    t.add_argument("--straggler-rank", type=int, default=1)
    t.add_argument("--straggler-us", type=float, default=100.0)
    f = sub.add_parser("fp32-logits")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--layers", type=int, default=16)
    f.add_argument("--hidden", type=int, default=4096)
    f.add_argument("--vocab", type=int, default=32_000)
    f.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.time()
    if args.what == "sglang-decode":
        facts = capture_sglang_decode(args.out, args.steps, args.preset, args.kv, args.prefix)
    elif args.what == "fp32-logits":
        facts = capture_fp32_logits(args.out, args.layers, args.hidden, args.vocab, args.steps)
    else:
        facts = capture_tp2(args.out, args.layers, args.hidden, args.steps, args.straggler_rank, args.straggler_us)
    facts |= {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "seconds": round(time.time() - began, 1)}
    (args.out / "capture.json").write_text(json.dumps(facts, indent=1) + "\n")
    print(json.dumps(facts), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
