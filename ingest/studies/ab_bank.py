"""The H200 half of the A/B study (issue 30): a bank of real runs of known changes, each its own process.

    python -m ingest.studies.ab_bank --out $OUT --budget-s 520      # on the lent H200, one call

Each run is `python -m kernels.bench --preset glm5 --kv KV --cuda-graph --steps 2 [--layers L]`, the
same command as the A/A study's H200 runs, in a process of its own. The changes are real changes of
the work a decode step does, not edits of the figures:

    base       glm5, 78 layers, fused KV                        (the A/A study's workload)
    layers80   80 layers: 2 more layers' work                   (measured +2.4 %, 2026-12-02)
    layers82   82 layers                                        (measured +5.2 %)
    layers86   86 layers                                        (measured +10.0 %)
    wholepool  78 layers, the whole-pool cast (full-pool-cast)  (the seeds' bug: measured 10.0x, not 3x)

The configurations are run round-robin (base, layers80, base, layers82, ...) so that every one sees
the machine's drift alike; the order and each run's wall time are written to bank.json. The run
stops starting runs once `--budget-s` has passed. The bundles come back as one tar file
(`bank.tar`); ingest/studies/ab_study.py imports and analyses them on the CPU machine.
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

CONFIGS = {
    "base": ("fused", 78),
    "layers80": ("fused", 80),
    "layers82": ("fused", 82),
    "layers86": ("fused", 86),
    "wholepool": ("full-pool-cast", 78),
}
# runs wanted of each, in the order they are interleaved (a round takes one of each still wanted,
# base twice): 14 base, 9 of each layer change, 6 whole-pool
WANTED = {"base": 14, "layers80": 9, "layers82": 9, "layers86": 9, "wholepool": 6}


def schedule() -> list[str]:
    left = dict(WANTED)
    order: list[str] = []
    while any(left.values()):
        for name in ("base", "layers80", "base", "layers82", "layers86", "wholepool"):
            if left[name]:
                order.append(name)
                left[name] -= 1
    return order


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.ab_bank", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=520.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/ab_bank"))
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    runs = []
    for n, name in enumerate(schedule()):
        if time.monotonic() - began > args.budget_s:
            break
        kv, layers = CONFIGS[name]
        bundle = args.work / f"{n:03d}-{name}"
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "kernels.bench", "--preset", "glm5", "--kv", kv, "--cuda-graph",
                               "--steps", "2", "--layers", str(layers), "--commit", "0" * 40, "--out", str(bundle)],
                              cwd=ROOT, capture_output=True, text=True)
        runs.append({"n": n, "config": name, "kv": kv, "layers": layers, "bundle": bundle.name,
                     "rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 2),
                     "stderr_tail": proc.stderr[-400:] if proc.returncode else ""})
        print(json.dumps(runs[-1]), flush=True)
    (args.out / "bank.json").write_text(json.dumps({"configs": CONFIGS, "runs": runs}, indent=1) + "\n")
    with tarfile.open(args.out / "bank.tar", "w") as tar:
        for run in runs:
            if run["rc"] == 0:
                tar.add(args.work / run["bundle"], arcname=run["bundle"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
