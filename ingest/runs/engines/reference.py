"""The reference engine: stepwatch's own MLA decode workload (kernels.bench) on a host.

Without a repo it runs this checkout's kernels/ (copied to a remote host first); with a repo
and a commit it runs the workload as that commit defines it, from a git worktree on the host,
so a series along a repository's history measures each commit's own code."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

from ..errors import CommandTimeout, SpecError
from ..git import add_worktree, remove_worktree
from ..hosts import Host, LocalHost
from ..repos import ROOT
from ..spec import Config, RunSpec
from .base import Checkout, Engine, EngineIO

_PROGRESS = re.compile(r"^progress: (timing|profile) (\d+)/(\d+)")
TIMING_STEPS = 20
WARMUP_STEPS = 5


def build_bench_argv(python: str, spec: RunSpec, out: str, *, sha: str | None, repo: str) -> list[str]:
    w = spec.workload
    argv = [python, "-m", "kernels.bench", "--preset", w.preset, "--kv", w.kv, "--device", spec.device,
            "--steps", str(w.profile_steps), "--batch-size", str(w.batch_size),
            "--timing-steps", str(TIMING_STEPS), "--warmup", str(WARMUP_STEPS), "--out", out, "--repo", repo]
    if w.cuda_graph:
        argv.append("--cuda-graph")
    if w.graph_mapping:
        argv.append("--graph-mapping")
    if w.context is not None:
        argv += ["--context", str(w.context)]
    if sha is not None:
        argv += ["--commit", sha]
    return argv


class ProgressParser:
    """Turns kernels.bench's `progress: timing i/N` lines into (done, planned) steps."""

    def __init__(self, profile_steps: int, on_progress: Callable[[int, int], None] | None):
        self.done = {"timing": 0, "profile": 0}
        self.planned = {"timing": TIMING_STEPS, "profile": profile_steps}
        self.on_progress = on_progress

    def feed(self, line: str) -> bool:
        """Take one output line; True when it was a progress line."""
        m = _PROGRESS.match(line)
        if m and self.on_progress:
            self.done[m.group(1)] = int(m.group(2))
            self.planned[m.group(1)] = int(m.group(3))
            self.on_progress(sum(self.done.values()), sum(self.planned.values()))
        return m is not None


def run_reference(spec: RunSpec, config: Config, host: Host, *, work_dir_local: Path, sha: str | None = None,
                  repo_path: str | None = None, on_line: Callable[[str], None] | None = None,
                  should_stop: Callable[[], bool] | None = None,
                  on_progress: Callable[[int, int], None] | None = None,
                  on_scratch: Callable[[str, str | None], None] | None = None) -> Path:
    """Run kernels.bench for `spec` on `host`; return the bundle directory copied to work_dir_local.
    The directory made on the host (with a worktree of `repo_path` in it, if any) is told to
    `on_scratch(path, repo)` as soon as it exists, for removal should the caller die first."""
    local = isinstance(host, LocalHost)
    python = sys.executable if local else config.host(spec.host).python
    tmp = host.mkdtemp("stepwatch-ref-")
    if on_scratch:
        on_scratch(tmp, repo_path if sha is not None else None)
    worktree = None
    try:
        if repo_path is not None and sha is not None:
            worktree = f"{tmp}/src"
            add_worktree(host, repo_path, sha, worktree)
            cwd = worktree
        elif local:
            cwd = str(ROOT)
        else:
            host.put(ROOT / "kernels", tmp)
            cwd = tmp
        out = f"{tmp}/bundle"
        parser = ProgressParser(spec.workload.profile_steps, on_progress)

        def each_line(line: str) -> None:
            parser.feed(line)
            if on_line:
                on_line(line)

        argv = build_bench_argv(python, spec, out, sha=sha, repo=spec.repo or "stepwatch")
        host.run(argv, cwd=cwd, env={"PYTHONUNBUFFERED": "1"}, timeout_s=spec.timeout_s, on_line=each_line,
                 should_stop=should_stop)
        return host.get(out, work_dir_local)
    finally:
        if worktree is not None:
            remove_worktree(host, repo_path, worktree)
        host.rmtree(tmp)


CUDA_PROBE = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
CUDA_PROBE_TIMEOUT_S = 120.0


def check_reference(spec: RunSpec, config: Config, host: Host) -> None:
    """A run on device cuda where the host's torch sees no GPU would fail at run time; it is
    refused now, with the reason."""
    if spec.device != "cuda":
        return
    python = sys.executable if isinstance(host, LocalHost) else config.host(spec.host).python
    try:
        result = host.run([python, "-c", CUDA_PROBE], check=False, timeout_s=CUDA_PROBE_TIMEOUT_S)
    except CommandTimeout:
        raise SpecError(f"device cuda: host {spec.host} did not answer whether it has CUDA within "
                        f"{CUDA_PROBE_TIMEOUT_S:.0f} s") from None
    if result.returncode == 3:
        raise SpecError(f"device cuda: host {spec.host} has no CUDA device (torch.cuda.is_available() is False "
                        "there): use device cpu, or a host with a GPU")
    if result.returncode != 0:
        last = (result.output.strip().splitlines() or ["no output"])[-1]
        raise SpecError(f"device cuda: cannot tell whether host {spec.host} has CUDA ({python}: {last})")


def _run(spec: RunSpec, config: Config, host: Host, checkout: Checkout, work_dir: Path, io: EngineIO) -> Path:
    return run_reference(spec, config, host, work_dir_local=work_dir, sha=checkout.sha, repo_path=checkout.repo_path,
                         on_line=io.on_line, should_stop=io.should_stop, on_progress=io.on_progress,
                         on_scratch=io.on_scratch)


ENGINE = Engine("reference", check_reference, _run)
