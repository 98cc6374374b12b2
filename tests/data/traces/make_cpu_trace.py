"""How tests/data/traces/cpu_small.trace.json was made (torch 2.13 CPU, on the dev machine):
three profiled steps of a tiny bf16 matmul + fp8->bf16 cast program, with record_shapes and
with_stack, and torch's own key_averages() written beside it for the exactness test.

    .venv/bin/python tests/data/traces/make_cpu_trace.py tests/data/traces
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule


def step(w, pool):
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    y = F.silu(x @ w)
    kv = pool.to(torch.bfloat16)
    return y.sum() + kv.sum()


def main(out: Path) -> None:
    torch.manual_seed(0)
    w = torch.randn(64, 64, dtype=torch.bfloat16)
    pool = torch.randn(256, 32).to(torch.float8_e4m3fn)
    sched = schedule(wait=0, warmup=1, active=3, repeat=1)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True, schedule=sched) as prof:
        for _ in range(4):
            step(w, pool)
            prof.step()
    prof.export_chrome_trace(str(out / "cpu_small.trace.json"))
    rows = [{"name": e.key, "count": e.count, "self_cpu_time_total_us": e.self_cpu_time_total,
             "cpu_time_total_us": e.cpu_time_total} for e in prof.key_averages()]
    (out / "cpu_small.key_averages.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
