"""A/A study of the verdicts (issue 30): the same code measured many times, each run its own
process, on this machine, with and without a competing CPU load; every pair of runs through
`ingest compare`, each 21-commit A/A history through `ingest check`, and the same run values
through asv's step detection and a conbench-style lookback z-score, side by side.

    .venv/bin/python -m ingest.studies.aa_study collect --work /tmp/aa_study   # about 25 minutes
    .venv/bin/python -m ingest.studies.aa_study analyse --work /tmp/aa_study   # a few minutes

collect: two git repositories ("aa-idle", "aa-loaded") holding this checkout's kernels/ in 21
commits that change nothing but a note file; every commit of each is run once with the reference
engine's tiny preset on CPU (`python -m ingest run`, a process each, OMP_NUM_THREADS=1), and three
commits of each a second time (repeats). The runs of the two repos alternate, so that both see the
machine's drift alike; the "loaded" runs have two Python busy loops beside them (one per core of
the 2-core host), started before and stopped after each run by their own process ids. The host is
shared with other agents, so "idle" means "without our load", not a quiet machine.

analyse: reads the database the runs went into; results are printed as Markdown for
ingest/regress/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ingest.studies.aa_analyse import analyse

ROOT = Path(__file__).resolve().parents[2]
COMMITS = 21
REPEAT_AT = (0, 7, 14)  # commits run twice
REPOS = ("aa-idle", "aa-loaded")
BUSY_LOOPS = 2


def _git(path: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "aa", "GIT_AUTHOR_EMAIL": "aa@example.com",
           "GIT_COMMITTER_NAME": "aa", "GIT_COMMITTER_EMAIL": "aa@example.com"}
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(path: Path) -> list[str]:
    """A repository of this checkout's kernels/ in COMMITS commits that change only a note; its shas."""
    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__", "results"))
    _git(path, "init", "-q", "-b", "main")
    for n in range(COMMITS):
        (path / "note.txt").write_text(f"commit {n}\n")
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", f"a{n}: nothing in the code changes")
    return [_git(path, "rev-parse", f"main~{COMMITS - 1 - n}") for n in range(COMMITS)]


def start_load() -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY_LOOPS)]


def stop_load(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()  # our own child, by its handle
        p.wait()


def run_once(db: Path, repo: str, path: Path, sha: str) -> float:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ingest", "run", "--engine", "reference", "--preset", "tiny",
                          "--kv", "fused", "--device", "cpu", "--profile-steps", "2", "--repo", repo,
                          "--repo-path", str(path), "--ref", sha, "--db", str(db)],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        raise SystemExit(f"run of {repo} at {sha[:12]} failed: {out.stderr[-2000:]}")
    return time.monotonic() - t0


def collect(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    db = work / "aa.duckdb"
    shas = {repo: make_repo(work / repo) for repo in REPOS}
    (work / "shas.json").write_text(json.dumps(shas))
    plan = [(i, False) for i in range(COMMITS)] + [(i, True) for i in REPEAT_AT]
    for k, (i, _) in enumerate(plan):
        for repo in REPOS:
            load = start_load() if repo == "aa-loaded" else []
            try:
                took = run_once(db, repo, work / repo, shas[repo][i])
            finally:
                stop_load(load)
            print(f"{k + 1}/{len(plan)} {repo} a{i}: {took:.0f} s", flush=True)


def import_h200(work: Path, bundles: Path) -> None:
    """The H200 half: bundles of `kernels.bench --preset glm5 --kv fused --cuda-graph --steps 2`,
    each its own process on the lent H200 (main's kernels/, the same code every time), imported
    in order as the commits of an A/A repository "aa-h200" (one bundle a commit)."""
    work.mkdir(parents=True, exist_ok=True)
    names = sorted(p for p in bundles.iterdir() if p.is_dir() and (p / "manifest.json").exists())
    global COMMITS
    COMMITS = len(names)
    shas = make_repo(work / "aa-h200")
    known = json.loads((work / "shas.json").read_text()) if (work / "shas.json").exists() else {}
    (work / "shas.json").write_text(json.dumps({**known, "aa-h200": shas}))
    for bundle, sha in zip(names, shas):
        out = subprocess.run([sys.executable, "-m", "ingest", "import", str(bundle), "--repo", "aa-h200",
                              "--commit", sha, "--repo-path", str(work / "aa-h200"), "--db", str(work / "h200.duckdb")],
                             cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"import of {bundle} failed: {out.stderr[-1000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.aa_study")
    p.add_argument("what", choices=("collect", "analyse", "import-h200", "analyse-h200"))
    p.add_argument("--work", default="/tmp/aa_study", type=Path)
    p.add_argument("--bundles", type=Path, help="import-h200: the directory of the H200 bundles")
    args = p.parse_args(argv)
    if args.what == "collect":
        collect(args.work)
    elif args.what == "import-h200":
        import_h200(args.work, args.bundles)
    elif args.what == "analyse-h200":
        print(analyse(args.work, ("aa-h200",), "h200.duckdb"))
    else:
        print(analyse(args.work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
