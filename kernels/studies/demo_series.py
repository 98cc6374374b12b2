"""A sample series with a real regression, measured on the GPU: `python -m kernels.studies.demo_series --out $OUT`.

The dashboard's samples are stepwatch's own commits, where every KV strategy is its own variant
and nothing regresses. This module gives them a series that does, the way an SGLang user meets
one: a small git repository (`glm5-serving-demo`, made here by `make_repo`, the same shas on
every machine: fixed authors, dates and contents) whose MLA backend file names the KV strategy
its decode uses. One commit switches the fused gather-cast back to casting the whole FP8 pool
every layer (the seeds' bug), a later one gathers then casts, the last fuses again.

For each commit, the strategy is read from that commit's `mla_backend.py` (`git show`), and the
reference workload (glm5 preset, CUDA graph) runs with it: timed steps, profiled steps, a bundle
under bundles/<sha7>-<repeat> with repo `glm5-serving-demo`, that commit's sha and variant
`default` (one series: the variant is the code at the commit, not a label per strategy).
The repository is a demonstration, said so in app/sample_data/README.md; the timings are the
H200's. torch + git only, so it runs on the GPU machine as is.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from kernels.bench import run_bench
from kernels.bundle import read_bundle
from kernels.workload import DecodeWorkload, build_model, get_config

REPO_NAME = "glm5-serving-demo"
VARIANT = "default"
AUTHOR = ("Demo maintainers", "demo@stepwatch.invalid")
# (date, subject, KV strategy of the commit's mla_backend.py, extra file touched or None)
COMMITS = [
    ("2026-11-02T09:00:00+00:00", "mla: decode through the fused gather-cast kernel", "fused", None),
    ("2026-11-03T09:00:00+00:00", "scheduler: log the decode batch size", "fused", "scheduler.py"),
    ("2026-11-04T09:00:00+00:00", "mla: cast the FP8 KV pool to BF16 before attention (one code path for fp8 and bf16)",
     "full-pool-cast", None),
    ("2026-11-05T09:00:00+00:00", "docs: the MLA backend's KV layout", "full-pool-cast", "README.md"),
    ("2026-11-06T09:00:00+00:00", "mla: gather the batch's KV rows, then cast them", "gather-then-cast", None),
    ("2026-11-07T09:00:00+00:00", "mla: fuse the gather and the cast into one kernel again", "fused", None),
]
STRATEGY_LINE = re.compile(r'^KV_STRATEGY = "([a-z-]+)"$', re.M)


def _git(repo: Path, *args: str, env: dict | None = None) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env)
    return out.stdout.strip()


def make_repo(path: Path) -> list[dict]:
    """Create the demo repository at `path` (empty or missing); return its commits' facts, oldest first."""
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q", "-b", "main")
    facts = []
    for seq, (date, subject, strategy, extra) in enumerate(COMMITS, start=1):
        (path / "mla_backend.py").write_text(
            '"""The MLA decode backend: how attention reads the FP8 KV pool."""\n\n'
            f'KV_STRATEGY = "{strategy}"\n')
        if extra:
            with open(path / extra, "a") as f:
                f.write(f"# {subject}\n")
        env = {**os.environ, "GIT_AUTHOR_NAME": AUTHOR[0], "GIT_AUTHOR_EMAIL": AUTHOR[1],
               "GIT_COMMITTER_NAME": AUTHOR[0], "GIT_COMMITTER_EMAIL": AUTHOR[1],
               "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        _git(path, "add", "-A")
        _git(path, "-c", "commit.gpgsign=false", "commit", "-q", "-m", subject, env=env)
        facts.append({"sha": _git(path, "rev-parse", "HEAD"), "committed_at": date, "author": AUTHOR[0],
                      "subject": subject, "seq": seq})
    return facts


def strategy_at(repo: Path, sha: str) -> str:
    """The KV strategy the commit's mla_backend.py names."""
    match = STRATEGY_LINE.search(_git(repo, "show", f"{sha}:mla_backend.py"))
    if not match:
        raise ValueError(f"{sha}: mla_backend.py names no KV_STRATEGY")
    return match.group(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2, help="runs per commit (run-to-run spread)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)

    import torch

    bundles = args.out / "bundles"
    bundles.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / REPO_NAME
        facts = make_repo(repo)
        (args.out / "commits.json").write_text(json.dumps({"repo": REPO_NAME, "commits": facts}, indent=1))
        preset = "glm5" if args.device == "cuda" else "tiny"
        state = build_model(get_config(preset), torch.device(args.device))
        results = []
        for c in facts:
            kv = strategy_at(repo, c["sha"])
            for r in range(args.repeats):
                workload = DecodeWorkload(state, kv, cuda_graph=args.device == "cuda")
                try:
                    path = run_bench(workload, bundles / f"{c['sha'][:7]}-{r + 1}", steps=2, with_stack=True,
                                     commit=c["sha"], repo=REPO_NAME, variant=VARIANT)
                finally:
                    workload.release()
                    del workload
                timing = read_bundle(path).timing
                results.append({"sha": c["sha"][:7], "kv": kv, "repeat": r + 1,
                                "median_ms": round(timing.median_ms, 3), "tok_per_s": round(timing.tok_per_s, 2)})
                print(json.dumps(results[-1]), flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    with tarfile.open(args.out / "bundles.tar.gz", "w:gz") as tar:
        tar.add(bundles, arcname="bundles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
