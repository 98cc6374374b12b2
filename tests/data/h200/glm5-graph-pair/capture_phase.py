"""Profile the capture of the reference decode step into a CUDA graph, as SGLang's
`--enable-profile-cuda-graph` (with SGLANG_GRAPH_BATCH_CAPTURE=1) profiles each batch size's capture:
two warm-up forwards outside the profile, then the capture run alone, record_shapes and with_stack.
Kept to see what such a trace holds (launches, ops, Python frames; whether any kernel runs).

    python3 tests/data/h200/glm5-graph-pair/capture_phase.py --preset glm5 --kv full-pool-cast --out DIR
"""

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from kernels.bench import summarize_key_averages  # noqa: E402
from kernels.workload import DecodeWorkload, build_model, get_config  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--preset", default="glm5")
p.add_argument("--kv", default="full-pool-cast")
p.add_argument("--out", required=True)
args = p.parse_args()
out = Path(args.out)
out.mkdir(parents=True, exist_ok=True)
state = build_model(get_config(args.preset), "cuda")
work = DecodeWorkload(state, args.kv, cuda_graph=False)
stream = torch.cuda.Stream()
stream.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(stream):
    for _ in range(2):
        work.forward(state.x_in)
torch.cuda.current_stream().wait_stream(stream)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts, record_shapes=True, with_stack=True) as prof:
    with torch.cuda.graph(graph):
        work.forward(state.x_in)
    torch.cuda.synchronize()
raw = out / "capture.trace.json"
prof.export_chrome_trace(str(raw))
with open(raw, "rb") as src, gzip.open(out / "capture.trace.json.gz", "wb", compresslevel=9) as dst:
    shutil.copyfileobj(src, dst)
raw.unlink()
(out / "capture_key_averages.json").write_text(json.dumps(summarize_key_averages(prof), indent=1) + "\n")
print(out)
