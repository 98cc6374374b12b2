"""The Run a benchmark form's logic, without Streamlit: from what a person entered to the jobs to
queue, or a SpecError naming the first bad field. It parses and plans; it runs no git, asks no
host and looks at no checkout (only parse_spec's own checks touch files: a patch set's files, an
import's path), so that the page never waits on a remote machine. What only git or the host can
tell (an unknown ref, a dead host, no GPU) fails the queued job within seconds, in the worker,
and shows in the page's job list.

- One ref (or none: HEAD) queues one run spec a variant x execution mode, as they are; with a
  repeat count N (1 to ingest.limits.MAX_REPEATS) each N times, each its own job and run, in
  rounds (A B A B: a host's drift falls on every variant alike), as `ingest run --repeat` does.
- A range `A..B` queues one range job (spec.RangeSpec): the runs without a ref, the range and
  every K; the worker lists B's first-parent history after A (every K-th commit, always B),
  records the commits and queues one job a commit x run, in this plan's batch (ingest/runs/
  expand.py), the specs `python -m ingest backfill` queues. A repeat count N lists the runs N
  times, in rounds: N jobs a commit x run, a commit's jobs next to each other. Both ends are checked for spelling
  here, and a range whose checkout cannot be anywhere is refused here.
- Batch sizes, contexts (reference) and input / output lengths (sglang) take one value or a list
  ("1, 4, 16"), a sweep: one run a combination, each of its own series, tied by a sweep id
  (spec.SweepSpec; its limits MAX_SWEEP_POINTS / MAX_SWEEP_VALUES, a value given twice refused).
  The reference engine's sweep is queued as one job a point: each is its own process anyway (as
  `ingest run` runs it), so each keeps its own attempts, cancel, log and kept bundle, and a fleet
  runs points side by side; SGLang's one-batch benchmark (TP 1) takes the lists itself and runs
  every point in one process, the model loaded once, so its sweep is ONE job whose card says
  "sweep ... of N points". At a range, each commit gets its own sweep (and sweep id).
- Code runs only from a repository the config names, or this checkout for the reference engine:
  any other repo (a name the config lacks, the path of some other checkout) is refused here with
  its name (spec.find_code_problem), and again by the worker. An import's path must lie under the
  config's `[imports] roots`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ingest.limits import MAX_REPEATS
from ingest.runs.errors import SpecError
from ingest.runs.spec import (Config, RangeSpec, RunSpec, SweepSpec, check_commits, find_code_problem, list_spec_jobs,
                              parse_any_spec, parse_job_spec, parse_spec, place_at_commit)

# the form's text fields that take one value or a list, and the names their messages give them
LISTED_FIELDS = {"batch_size": "batch sizes", "input_len": "input tokens", "output_len": "output tokens",
                 "context": "context tokens"}


@dataclass(frozen=True)
class FormInput:
    engine: str  # reference | sglang | import
    host: str = "local"
    device: str = "cpu"
    repo: str = ""  # a config [repos] name; for the reference engine "" (or "stepwatch") means this checkout
    commits: str = ""  # "", one ref, or a range A..B
    every: int = 1  # a range: every K-th commit
    variants: tuple[str, ...] = ()  # reference: KV strategies; sglang: "unpatched" or patch sets
    cuda_graph: tuple[bool, ...] = (False,)  # one job per execution mode
    workload: dict = field(default_factory=dict)  # the other workload fields; blanks are left out
    path: str = ""  # import engine
    timeout_s: float = 3600.0
    repeat: int = 1  # runs of each job (1 to MAX_REPEATS), each its own job


@dataclass(frozen=True)
class JobPlan:
    jobs: list[tuple[str, str]]  # (spec JSON, label) of each job to queue, in order
    batch: str  # one label for the jobs queued together, and for those a range job queues
    specs: list[RunSpec | SweepSpec] = field(default_factory=list)  # the run specs (or sweeps) among `jobs`
    expand: RangeSpec | None = None  # the range job among `jobs`, expanded by a worker


def parse_listed(text, name: str):
    """A listed field's text ("1, 4, 16", or "8"): an int, a list of ints (a sweep), or None when
    blank; raises SpecError naming the field. Limits and duplicates are the spec's to refuse."""
    if text is None or isinstance(text, int):
        return text
    parts = [p.strip() for p in str(text).replace(";", ",").split(",")]
    if not any(parts):
        return None
    values = []
    for part in parts:
        if not part.isdigit():
            raise SpecError(f"{name}: {part!r} is not a whole number (one value, or several separated by commas: "
                            "1, 4, 16)")
        values.append(int(part))
    return values[0] if len(values) == 1 else values


def _clean_workload(values: dict) -> dict:
    values = {k: parse_listed(v, LISTED_FIELDS[k]) if k in LISTED_FIELDS else v for k, v in values.items()}
    return {k: v for k, v in values.items() if v not in (None, "", [], ())}


def _build_run_body(form: FormInput, variant: str, graph: bool) -> dict:
    """One variant x execution mode as a run spec body, without repo or ref."""
    workload = _clean_workload({**form.workload, "cuda_graph": graph})
    body = {"engine": form.engine, "host": form.host, "device": form.device, "workload": workload,
            "timeout_s": form.timeout_s}
    if form.engine == "reference":
        workload["kv"] = variant
    else:
        body["variant"] = variant
    return body


def _check_range(form: FormInput, config: Config) -> None:
    """What a range needs that no lookup can supply: both ends spelled as refs, a positive K, and
    a checkout that can exist: a repo from the config, else (on this machine only) this checkout
    for the reference engine or a path the worker will look for."""
    text = form.commits.strip()
    if (form.repo in ("", "stepwatch") and form.engine != "reference") or (form.repo not in config.repos
                                                                           and config.host(form.host).ssh is not None):
        raise SpecError(f"commits: the range {text!r} needs a repo from the config's [repos]"
                        " (or, for the reference engine on this machine, this checkout)")
    if form.every < 1:
        raise SpecError(f"every: {form.every}: must be a positive integer")
    check_commits(text)


def _plan_range_job(form: FormInput, config: Config, runs: list[dict], batch: str) -> JobPlan:
    """One range job for the runs at the commits the worker will find; each run is checked by
    parse_spec first, at the range's last ref (spelling only) and in the repo when the config
    names it."""
    text = form.commits.strip()
    if ".." in text:
        _check_range(form, config)
    repo = form.repo if form.repo in (*config.repos, "stepwatch") else None
    probes = [parse_any_spec(place_at_commit(body, repo, text.partition("..")[2] or text or None), config)
              for body in runs]
    probes = [p.points[0] if isinstance(p, SweepSpec) else p for p in probes]
    expand = RangeSpec(commits=text, repo=form.repo, runs=tuple(runs), host=form.host, every=form.every,
                       batch=batch)
    parse_job_spec(json.loads(expand.to_json()), config)  # what the worker will read, refused here if it would be
    every = f" every {form.every}" if ".." in text and form.every > 1 else ""
    variants = ", ".join(dict.fromkeys(p.describe_variant() for p in probes))
    variants += f" x {form.repeat} repeats" if form.repeat > 1 else ""
    what = probes[0].workload.preset or probes[0].workload.model_path or "?"
    label = (f"{form.engine} {what} {variants} {form.repo or 'stepwatch'}@{text or 'HEAD'}{every} "
             f"on {form.host}/{form.device}")
    return JobPlan([(expand.to_json(), label)], batch, expand=expand)


def plan_jobs(form: FormInput, config: Config) -> JobPlan:
    """The jobs the form asks for, every field checked that needs no git, host or checkout
    (parse_spec, the range's spelling); raises SpecError with the reason before anything is
    queued."""
    text = form.commits.strip()
    if isinstance(form.repeat, bool) or not isinstance(form.repeat, int) or not 1 <= form.repeat <= MAX_REPEATS:
        raise SpecError(f"repeat: {form.repeat!r}: must be a whole number from 1 to {MAX_REPEATS} (MAX_REPEATS, "
                        "ingest/limits.py)")
    if form.engine == "import" and form.repeat != 1:
        raise SpecError(f"repeat: {form.repeat}: an import reads one trace once; repeat a run, not an import")
    if form.engine == "import":
        body = {"engine": "import", "host": form.host, "device": form.device, "path": form.path.strip() or None,
                "repo": form.repo or None, "ref": text or None, "timeout_s": form.timeout_s}
        spec = parse_spec({k: v for k, v in body.items() if v is not None}, config)
        return JobPlan([(spec.to_json(), spec.describe())], f"form {spec.describe()}", [spec])
    if not form.variants:
        raise SpecError("variants: choose at least one" + (" KV strategy" if form.engine == "reference" else ""))
    if not form.cuda_graph:
        raise SpecError("execution: choose eager, CUDA graph or both")
    if form.repo:
        find_code_problem(form.engine, form.repo, None, config)
    runs = [_build_run_body(form, variant, graph) for _ in range(form.repeat)
            for variant in form.variants for graph in form.cuda_graph]  # repeats in rounds
    if ".." in text:
        return _plan_range_job(form, config, runs, f"form {form.engine} {text} every {form.every}"
                               + (f" x {form.repeat} repeats" if form.repeat > 1 else ""))
    batch = f"form {form.engine} {text or 'HEAD'}" + (f" x {form.repeat} repeats" if form.repeat > 1 else "")
    specs = [parse_any_spec(place_at_commit(body, form.repo or None, text or None), config) for body in runs]
    return JobPlan([job for s in specs for job in list_spec_jobs(s)], batch, specs)


def describe_sweeps(plan: JobPlan) -> str:
    """What the plan's sweeps are, for the page's note: "; 1 sweep of 3 points (batch_size 1, 4, 16)"."""
    sweeps = [s for s in plan.specs if isinstance(s, SweepSpec)]
    if not sweeps:
        return ""
    one = sweeps[0]
    many = f"{len(sweeps)} sweeps" if len(sweeps) > 1 else "1 sweep"
    how = "in one process" if one.in_one_process else "one job a point"
    return f"; {many} of {len(one.points)} points ({one.describe_axes()}), {how}"


def describe_range_job(plan: JobPlan) -> str:
    """What a worker does with the plan's range job, for the page's note once it is queued."""
    n = len(plan.expand.runs)
    runs = f"{n} job{'s' if n > 1 else ''}"
    if ".." in plan.expand.commits:
        return f"a worker lists the range's commits and queues {runs} at each"
    return f"a worker finds the checkout {plan.expand.repo} and queues {runs}"
