"""A range job's expansion, done by the worker that claims it: the dashboard's form queues one
RangeSpec (ingest/runs/spec.py) instead of running git, ssh or looking for a checkout itself.

The worker finds the checkout the range job's `repo` names on its host (a config [repos] entry,
or this checkout for ""/"stepwatch": repos.locate_repo), asks the
host to answer (a dead host fails the job in seconds, with ssh's reason), lists A..B along B's
first-parent history there (every K-th commit, always B: git.list_first_parent) and builds one
run spec a commit x run, commits outer, each checked by parse_spec before any is queued. A
single ref is not resolved here: its runs are queued with the ref as given, and each run's own
job resolves it (an unknown ref fails that job). The specs are those `python -m ingest backfill`
and the form queued before there was a range job: same repo, repo_path, ref, order and labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from .connect import make_host_for
from .errors import SpecError
from .git import CommitInfo, list_first_parent
from .repos import locate_repo
from .spec import Config, RangeSpec, RunSpec, SweepSpec, list_spec_jobs, parse_any_spec, place_at_commit


@dataclass(frozen=True)
class Expansion:
    """What a range job queues: run specs (or sweeps: a run body listing batch sizes / lengths is
    one sweep a commit, each with a sweep id of its own), the commits they measure (to record)
    and their repo."""

    specs: list[RunSpec | SweepSpec]
    commits: list[CommitInfo]
    repo: str | None
    batch: str

    def describe(self) -> str:
        """The note its job ends with: queued 6 jobs (3 commits x 2 runs), or (1 ref x 2 runs)."""
        refs = max(len(self.commits), 1)
        runs = len(self.specs) // refs
        what = _count(refs, "commit") if self.commits else "1 ref"
        sweeps = sum(isinstance(s, SweepSpec) for s in self.specs) // refs
        kinds = f"{_count(runs, 'run')}" + (f", {sweeps} of them {'a sweep' if sweeps == 1 else 'sweeps'}"
                                            if sweeps else "")
        return f"queued {_count(len(self.list_jobs()), 'job')} ({what} x {kinds})"

    def list_jobs(self) -> list[tuple[str, str]]:
        """(spec JSON, label) of each job to queue, in order (a sweep: its point jobs, or its one job)."""
        return [job for spec in self.specs for job in list_spec_jobs(spec)]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def expand_range(spec: RangeSpec, config: Config) -> Expansion:
    """The run specs a range job stands for; raises SpecError (no checkout, an unknown ref, a
    run spec with a bad field), HostError (the host does not answer) or another RunError (git
    failed), and then nothing is queued."""
    is_range = ".." in spec.commits
    name, path = locate_repo(spec.repo, config, spec.host) if spec.repo or is_range else (None, None)
    commits: list[CommitInfo] = []
    refs = [spec.commits or None]
    if is_range:
        if path is None:
            known = f"; {spec.repo!r} is not in [repos]" if spec.repo else ""
            raise SpecError(f"commits: the range {spec.commits!r} needs a repo from the config's [repos] (or, for "
                            f"the reference engine on this machine, this checkout){known}")
        host = make_host_for(config, spec.host)
        host.check()
        commits = list_first_parent(host, path, spec.commits, spec.every)
        refs = [c.sha for c in commits]
    specs = [parse_any_spec(place_at_commit(body, name, ref), config) for ref in refs for body in spec.runs]
    return Expansion(specs, commits, name, spec.batch)
