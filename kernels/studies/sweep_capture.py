"""A batch-size sweep of the reference workload on the GPU, for the sweep samples (issue 33):
`python -m kernels.studies.sweep_capture --out $OUT`.

Every point is `python -m kernels.bench --preset glm5 --kv KV --cuda-graph --steps 2 --batch-size BS
--context CTX --pool-tokens POOL`, a process of its own (the same command as the A/A and A/B studies'
runs, with the batch and context set). The pool is one size for every point (POOL_TOKENS, the rows a
served pool would hold: the largest point, bs 128 x 4K, fits), since a server's pool does not change with
its batch. The two variants are the whole-pool cast (the seeds' bug) and the fused gather-cast (the
patch's path); they alternate point by point so both see the machine's drift alike. After the grid,
REPEAT_POINTS are run twice more each (three runs there), as long as `--budget-s` allows; the run stops
starting bundles once it has passed; `--start N` goes on from the plan's point N, `--variants`, `--contexts`
and `--no-repeats` narrow the plan. Bundles come back as one tar file (`sweep.tar`), the order and each
run's wall time in sweep.json. torch + the standard library only, so it runs on the GPU machine as is.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BATCH_SIZES = (1, 4, 16, 32, 128)
CONTEXTS = (1024, 4096)
VARIANTS = ("full-pool-cast", "fused")
POOL_TOKENS = 600_000  # > 128 x 4,096 = 524,288 rows
REPEAT_POINTS = ((32, 1024), (1, 1024), (128, 1024))  # (bs, context), run 3 times in all


def plan(variants: tuple[str, ...] = VARIANTS, contexts: tuple[int, ...] = CONTEXTS,
         repeats: bool = True) -> list[tuple[int, int, str]]:
    grid = [(bs, ctx, kv) for ctx in contexts for bs in BATCH_SIZES for kv in variants]
    again = [(bs, ctx, kv) for _ in range(2) for bs, ctx in REPEAT_POINTS for kv in variants] if repeats else []
    return grid + again


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.studies.sweep_capture", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=225.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/sweep_capture"))
    p.add_argument("--start", type=int, default=0, 
                   help="skip the plan's first START points (a budget cut them short before)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated KV strategies")
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)), help="comma-separated contexts")
    p.add_argument("--no-repeats", action="store_true", help="the grid only")
    args = p.parse_args(argv)
    points = plan(tuple(args.variants.split(",")), tuple(int(c) for c in args.contexts.split(",")), not args.no_repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    runs = []
    for n, (bs, ctx, kv) in enumerate(points):
        if n < args.start:
            continue
        if time.monotonic() - began > args.budget_s:
            break
        bundle = args.work / f"{n:03d}-{kv}-bs{bs}-ctx{ctx}"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kernels.bench", "--preset", "glm5", "--kv", kv, "--cuda-graph",
                               "--steps", "2", "--batch-size", str(bs), "--context", str(ctx), "--pool-tokens",
                               str(POOL_TOKENS), "--commit", "0" * 40, "--out", str(bundle)],
                              cwd=ROOT, capture_output=True, text=True)
        runs.append({"n": n, "kv": kv, "bs": bs, "context": ctx, "bundle": bundle.name, "rc": proc.returncode,
                     "wall_s": round(time.monotonic() - t0, 2),
                     "stderr_tail": proc.stderr[-400:] if proc.returncode else ""})
        print(json.dumps(runs[-1]), flush=True)
    (args.out / "sweep.json").write_text(json.dumps({"pool_tokens": POOL_TOKENS, "runs": runs}, indent=1) + "\n")
    with tarfile.open(args.out / "sweep.tar", "w") as tar:
        for run in runs:
            if run["rc"] == 0:
                tar.add(args.work / run["bundle"], arcname=run["bundle"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
