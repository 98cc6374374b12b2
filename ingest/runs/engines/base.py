"""What an engine receives, returns and reports: the interface every engine module implements.

An engine turns one checked RunSpec into a result bundle (kernels/bundle.py) on a Host. Each
engine module ends with its `ENGINE = Engine(name, check, run)`; the worker (ingest.runs.worker)
looks engines up by the spec's `engine` name in `ingest.runs.engines.registry.ENGINES` and calls:

1. `check(spec, config, host)` before anything runs, with the host answering and the commit
   resolved: raise SpecError (or HostError) for what would fail at run time (no CUDA on the host,
   a patch file missing). The job fails at once with that line; it is not retried.
2. `run(spec, config, host, checkout, work_dir, io) -> Path`: run the benchmark at
   `checkout.sha` (in a worktree of `checkout.repo_path` on the host; see `Checkout`) and return
   the bundle directory, copied into the local `work_dir`. The
   worker imports it: engines never touch the database.

While it runs an engine reports through `EngineIO` (each output line, steps done of planned,
every directory it makes on the host, so that a worker that dies leaves nothing behind) and polls
`io.should_stop()` (a cancel), stopping with CommandCancelled. It fails with RunError subclasses:
CommandFailed and CommandTimeout for the benchmark itself, RunError for anything else.

Adding an engine (vLLM, TensorRT-LLM) is one module beside these with its ENGINE, its name in
`ingest.runs.names.ENGINES` and `registry.ENGINES`, and its workload fields in
`ingest.runs.spec.parse_workload` (spec parsing stays free of I/O, so the dashboard can use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..hosts import Host
from ..spec import Config, RunSpec, SweepSpec


def _ignore(*_args) -> None:
    return None


@dataclass(frozen=True)
class EngineIO:
    """How an engine reports while it runs, and learns that it should stop."""

    on_line: Callable[[str], None] = _ignore  # each line of the benchmark's output, as it comes
    on_progress: Callable[[int, int], None] = _ignore  # (steps done, steps planned)
    on_scratch: Callable[[str, str | None], None] = _ignore  # (a directory made on the host, the repo of its worktree)
    should_stop: Callable[[], bool] = lambda: False  # a cancel was asked for: stop, raise CommandCancelled


@dataclass(frozen=True)
class Checkout:
    """The code a run measures: a full commit sha and the repository on the host to check it out
    from. `repo_path` None: stepwatch's own checkout as it is (the reference workload without a
    repo, or at HEAD), with `sha` its commit when known, recorded in the bundle."""

    sha: str | None = None
    repo_path: str | None = None


@dataclass(frozen=True)
class Engine:
    name: str  # the spec's `engine`
    check: Callable[[RunSpec, Config, Host], None]
    run: Callable[[RunSpec, Config, Host, Checkout, Path, EngineIO], Path]
    # an engine that runs every point of a sweep in ONE process (SGLang's one-batch benchmark takes
    # lists): (sweep, ...) -> (a directory with one bundle a point that has a result, named
    # `point-NNN` by its index, {point index: why it has no result}); None: one job a point
    run_sweep: Callable[[SweepSpec, Config, Host, Checkout, Path, EngineIO], tuple[Path, dict[int, str]]] | None = None
