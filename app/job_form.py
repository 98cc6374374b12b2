"""The Run a benchmark form's logic, without Streamlit: from what a person entered to checked run
specs, one per commit x variant x execution mode, or a SpecError naming the first bad field.

A commit range `A..B` becomes one job per commit along B's first-parent history (every K-th,
always keeping B), as `python -m ingest backfill` queues them. Checking a single ref asks the
host (ingest.runs.worker.check_runnable), so an unknown ref or an unreachable host is refused
here and nothing is queued; a range is checked by listing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ingest.runs.errors import SpecError
from ingest.runs.repos import ROOT, locate_repo
from ingest.runs.spec import Config, RunSpec, parse_spec


@dataclass(frozen=True)
class FormInput:
    engine: str  # reference | sglang | import
    host: str = "local"
    device: str = "cpu"
    repo: str = ""  # a config [repos] name; for the reference engine "" means this checkout
    commits: str = ""  # "", one ref, or a range A..B
    every: int = 1  # a range: every K-th commit
    variants: tuple[str, ...] = ()  # reference: KV strategies; sglang: "unpatched" or patch sets
    cuda_graph: tuple[bool, ...] = (False,)  # one job per execution mode
    workload: dict = field(default_factory=dict)  # the other workload fields; blanks are left out
    path: str = ""  # import engine
    timeout_s: float = 3600.0


@dataclass(frozen=True)
class JobPlan:
    specs: list[RunSpec]
    commits: list = field(default_factory=list)  # CommitInfo facts of a range, to record
    repo: str | None = None  # the repo those commits belong to
    batch: str = ""  # one label for the jobs queued together


def _clean_workload(values: dict) -> dict:
    return {k: v for k, v in values.items() if v not in (None, "", [], ())}


def find_repo_location(form: FormInput, config: Config) -> tuple[str | None, str | None]:
    """(repo name, checkout path on the host) that refs are looked up in; path None if unknown."""
    if form.engine != "reference" and not form.repo:
        return None, None  # only the reference workload defaults to this checkout
    return locate_repo(form.repo, config, form.host)


def _expand_range(form: FormInput, config: Config) -> tuple[list, str | None, str | None]:
    from ingest.runs.git import list_first_parent
    from ingest.runs.worker import make_host_for

    name, path = find_repo_location(form, config)
    if path is None:
        raise SpecError(f"commits: the range {form.commits!r} needs a repo from the config's [repos]"
                        " (or, for the reference engine on this machine, this checkout)")
    return list_first_parent(make_host_for(config, form.host), path, form.commits.strip(), form.every), name, path


def plan_jobs(form: FormInput, config: Config) -> JobPlan:
    """Every spec the form asks for, each checked by parse_spec; raises SpecError (or another
    RunError: an unreachable host) with the reason, before anything is queued."""
    text = form.commits.strip()
    if form.engine == "import":
        body = {"engine": "import", "host": form.host, "device": form.device, "path": form.path.strip() or None,
                "repo": form.repo or None, "ref": text or None, "timeout_s": form.timeout_s}
        spec = parse_spec({k: v for k, v in body.items() if v is not None}, config)
        return JobPlan([spec], batch=f"form {spec.describe()}")
    if not form.variants:
        raise SpecError("variants: choose at least one" + (" KV strategy" if form.engine == "reference" else ""))
    if not form.cuda_graph:
        raise SpecError("execution: choose eager, CUDA graph or both")
    commits, repo_name, repo_path = ([], None, None)
    if ".." in text:
        commits, repo_name, repo_path = _expand_range(form, config)
        refs = [c.sha for c in commits]
    else:
        refs = [text or None]
        repo_name, repo_path = find_repo_location(form, config) if form.repo else (None, None)
    specs = []
    for ref in refs:
        for variant in form.variants:
            for graph in form.cuda_graph:
                workload = _clean_workload({**form.workload, "cuda_graph": graph})
                body = {"engine": form.engine, "host": form.host, "device": form.device, "workload": workload,
                        "timeout_s": form.timeout_s}
                if form.engine == "reference":
                    workload["kv"] = variant
                else:
                    body["variant"] = variant
                if repo_name:
                    body["repo"] = repo_name
                if repo_path and repo_name not in config.repos and repo_path != str(ROOT):
                    body["repo_path"] = repo_path
                if ref:
                    body["ref"] = ref
                specs.append(parse_spec(body, config))
    if not commits:
        from ingest.runs.worker import check_runnable

        check_runnable(specs[0], config)  # the host answers and the ref names a commit
    what = f"{form.commits.strip()} every {form.every}" if commits else (text or "HEAD")
    return JobPlan(specs, commits, repo_name, f"form {form.engine} {what}")

