"""What each `python -m ingest` command does (ingest/cli.py parses the arguments first)."""

from __future__ import annotations

import json
import os
import sys

from db.series import count_series_commits
from db.store import open_db, run_tables

from .errors import IngestError
from .limits import PROGRESS_AFTER_S, import_limits
from .priority import DatabaseThread
from .runs.errors import RunError, SpecError
from .traces.categories import load_rule_chain
from .traces.importer import ImportOptions, load_pattern_catalog, prepare_import
from .traces.progress import ImportBar, Progress
from .user_files import load_user_table

_WORKLOAD_FLAGS = ("preset", "kv", "cuda_graph", "model_path", "load_format", "kv_cache_dtype",
                   "attention_backend", "batch_size", "input_len", "output_len", "context", "tp", "profile_steps")


def _spec_body(args) -> dict:
    """The spec file's fields (if any) with the flags given on the command line on top."""
    body: dict = {}
    if args.spec_file:
        # a regular file, size and depth limited (ingest/user_files.py); a table/object
        body = load_user_table(args.spec_file, SpecError, as_json=args.spec_file.endswith(".json"))
    workload = dict(body.get("workload") or {})
    for key in _WORKLOAD_FLAGS:
        value = getattr(args, key, None)
        if value is not None:  # `--batch-size 1 8 32`: a list, a sweep; one value stays one value
            workload[key] = value[0] if isinstance(value, list) and len(value) == 1 else value
    body["workload"] = workload
    for key in ("engine", "host", "device", "repo", "repo_path", "ref", "variant", "path", "timeout_s"):
        if getattr(args, key, None) is not None:
            body[key] = getattr(args, key)
    return body


def run_run(args) -> int:
    from .runs.spec import SweepSpec, list_spec_jobs, load_config, parse_any_spec
    from .runs.worker import check_runnable  # change tracking's SciPy: not for import

    config = load_config(args.config)
    body = _spec_body(args)
    spec = parse_any_spec(body, config)  # a sweep: every point checked before anything is queued
    check_runnable(spec.points[0] if isinstance(spec, SweepSpec) else spec, config)  # a bad ref, a dead host
    run_ids = []
    for repeat in range(args.repeat):  # each repeat its own job(s), its own process, its own run(s)
        if repeat and isinstance(spec, SweepSpec) and "sweep_id" not in body:
            spec = parse_any_spec(body, config)  # a repeated sweep is a sweep of its own
        jobs = list_spec_jobs(spec)
        with open_db(args.db) as store:
            job_ids = [store.enqueue_job(spec_json, label) for spec_json, label in jobs]
        for job_id, (_, label) in zip(job_ids, jobs):
            print(f"queued job {job_id}: {label}", file=sys.stderr)
        if args.queue:
            print(*job_ids)
            continue
        for job_id in job_ids:
            run_ids += _run_now(args, config, job_id)
    for run_id in run_ids:
        print(run_id)
    return 0


def _run_now(args, config, job_id: int) -> list[int]:
    """Claim and execute one queued job here; its run ids (one, or a sweep job's, point by point)."""
    from .runs.survival import process_stamp
    from .runs.worker import execute_job, worker_name

    with open_db(args.db) as store:
        job = store.claim_job(worker_name(), job_id, worker_proc=process_stamp())
    if job is None:
        raise RunError(f"job {job_id} was taken by a worker before this command could run it")
    bar = Progress(f"job {job_id}")
    log_file = sys.stderr if not sys.stderr.isatty() else None
    reporter_echo = (lambda line: print(line, file=log_file)) if log_file else None
    status, run_id = execute_job(args.db, job, config, load_rule_chain(), _with_progress(bar, reporter_echo))
    bar.close()
    with open_db(args.db, read_only=True) as store:
        final = store.get_job(job_id, with_log=False)
        run_ids = store.list_job_run_ids(job_id) if final["sweep_id"] else [run_id]
    if status != "succeeded":
        raise RunError(f"job {job_id} {status}: {final['error_kind']}: {final['error']}")
    return run_ids


def _with_progress(bar: Progress, echo):
    """An echo for the job's output lines that also drives the progress bar."""
    from .runs.engines.reference import ProgressParser

    parser = ProgressParser(0, lambda done, planned: bar.update(done, planned))

    def each(line: str) -> None:
        if not parser.feed(line) and echo:
            echo(line)

    return each


def run_worker_cmd(args) -> int:
    from .runs.spec import load_config
    from .runs.worker import run_worker, worker_name

    if args.ray and args.ray != "local" and (args.ray_cpus or args.ray_gpus):
        raise IngestError("--ray-cpus and --ray-gpus declare a cluster that --ray local starts; "
                          f"the cluster at {args.ray} declares its own")
    if not args.ray and (args.max_in_flight or args.gpus_per_run or args.ray_cpus or args.ray_gpus):
        raise IngestError("--max-in-flight, --gpus-per-run, --ray-cpus and --ray-gpus need --ray")
    config = load_config(args.config)
    print(f"worker {worker_name()} on {args.db}", file=sys.stderr)
    say = lambda line: print(line, flush=True)  # noqa: E731
    if args.ray:
        from .runs.fleet import run_fleet_worker

        run_fleet_worker(args.db, config, load_rule_chain(), args.ray, poll_s=args.poll_s,
                         max_in_flight=args.max_in_flight, gpus_per_run=args.gpus_per_run,
                         max_attempts=args.max_attempts, exit_when_idle=args.exit_when_idle, echo=say,
                         num_cpus=args.ray_cpus, num_gpus=args.ray_gpus)
        return 0
    run_worker(args.db, config, load_rule_chain(), poll_s=args.poll_s, exit_when_idle=args.exit_when_idle,
               max_attempts=args.max_attempts, echo=say)
    return 0


def run_backfill(args) -> int:
    from .runs.connect import make_host_for
    from .runs.git import list_first_parent
    from .runs.repos import locate_repo
    from .runs.spec import list_spec_jobs, load_config, parse_any_spec

    config = load_config(args.config)
    host = make_host_for(config, args.host or "local")
    repo_name, repo_path = locate_repo(args.repo, config, args.host or "local")
    if repo_path is None:
        raise SpecError(f"--repo {args.repo}: not in the config's [repos] ({config.source or 'no config file'}): "
                        "stepwatch runs code only from the repositories the config names, or its own checkout")
    commits = list_first_parent(host, repo_path, args.range_spec, args.every)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    base = _spec_body(args)
    if "sweep_id" in base:
        raise SpecError("spec.sweep_id: a backfill makes one sweep a commit and variant, each with its own id; "
                        "leave sweep_id out")
    bodies = []
    for c in commits:  # check every spec before queueing any
        for v in variants:
            body = {**base, "repo": repo_name, "ref": c.sha, "variant": v}
            if args.repo not in config.repos:
                body["repo_path"] = repo_path
            bodies.append(body)
    # a body listing batch sizes / lengths is a sweep: one a commit x variant x repeat, each its own id
    rounds = [[list_spec_jobs(parse_any_spec(b, config)) for b in bodies] for _ in range(args.repeat)]
    batch = f"backfill {repo_name} {args.range_spec}"
    with open_db(args.db) as store:
        for c in commits:
            store.record_commit(repo_name, c.sha, c.committed_at, c.author, c.subject, c.seq)
        # repeats in rounds over every commit (A B C A B C), so that a host's drift falls on all alike
        ids = [store.enqueue_job(spec_json, label, batch) for jobs in rounds for spec_jobs in jobs
               for spec_json, label in spec_jobs]
    repeats = f" x {args.repeat} repeats" if args.repeat > 1 else ""
    points = len(ids) // max(len(bodies) * args.repeat, 1)
    sweep = f" x {points} sweep points" if points > 1 else ""
    print(f"queued {len(ids)} jobs ({len(commits)} commits x {len(variants)} variants{repeats}{sweep}), "
          f"jobs {ids[0]}..{ids[-1]}", file=sys.stderr)
    print(" ".join(map(str, ids)))
    return 0


def run_jobs(args) -> int:
    with open_db(args.db, read_only=True) as store:
        rows = store.list_jobs(tuple(args.status) if args.status else None, args.limit)
    for j in rows:
        progress = f"{j['steps_done']}/{j['steps_planned']}" if j["steps_planned"] else ""
        extra = f"run {j['run_id']}" if j["run_id"] else (f"{j['error_kind']}: {j['error']}" if j["error"] else "")
        print(f"{j['job_id']:>5} {j['status']:<10} {progress:>7}  {j['label']}  {extra}".rstrip())
    return 0


def run_cancel(args) -> int:
    with open_db(args.db) as store:
        status = store.request_cancel(args.job_id)
    if status is None:
        raise RunError(f"no job {args.job_id}")
    print(f"job {args.job_id}: {status}" + (" (asked to stop)" if status == "running" else ""))
    return 0


def run_samples(args) -> int:
    from .traces.samples import load_samples

    with open_db(args.db) as store:
        if store.count_rows()["runs"]:
            print("the database already has runs: samples not loaded", file=sys.stderr)
            return 0
    from .runs.track import track_changes

    n = load_samples(args.db, load_rule_chain())
    with open_db(args.db) as store:
        changes = track_changes(store)
    from .regress.report import is_confirmed

    confirmed = sum(is_confirmed(r) for r in changes)
    print(f"loaded {n} sample runs into {args.db}; {confirmed} confirmed changes, {len(changes) - confirmed} suspected",
          file=sys.stderr)
    return 0


def _checkout(repo: str | None, repo_path: str | None) -> str | None:
    """The git checkout here that holds a repo's commits: --repo-path, or this clone for the
    stepwatch repo; None when there is none."""
    from .runs.repos import ROOT

    return repo_path or (str(ROOT) if repo == "stepwatch" and (ROOT / ".git").exists() else None)


def _resolve_commit(ref: str | None, repo: str | None, repo_path: str | None):
    """`--commit` resolved as the form resolves a ref (HEAD~1, a tag, a short sha): its full sha
    with its date, author, subject and order, when a checkout here holds it. None when there is
    no checkout, or this clone lacks a stepwatch commit: the value is then kept as it was given,
    which must be a label (a short sha kept alone is a commit with no order or date)."""
    if ref is None:
        return None
    from kernels.bundle import LABEL_RULE, is_label

    from .runs.git import resolve_ref
    from .runs.hosts import LocalHost
    from .runs.spec import check_ref

    path = _checkout(repo, repo_path)
    if path is not None:
        try:
            check_ref(ref, "--commit")
            return resolve_ref(LocalHost(), path, ref)
        except SpecError as e:
            if repo_path:
                raise RunError(f"--commit {ref!r}: no such commit in --repo-path {repo_path}"
                               if "no such commit" in str(e) else str(e)) from None
    if not is_label(ref):
        raise IngestError(f"--commit {ref!r}: a ref needs a checkout to resolve it in (--repo-path); "
                          f"a commit kept as given must be a label: {LABEL_RULE}")
    return None


def _commit_facts(commit: str | None, repo: str | None, repo_path: str | None):
    """The commit's date, author, subject and order, when a checkout here holds it."""
    if commit is None:
        return None
    path = _checkout(repo, repo_path)
    if path is None:
        return None
    from .runs.git import describe_commit
    from .runs.hosts import LocalHost

    try:
        return describe_commit(LocalHost(), path, commit)
    except RunError:
        if repo_path:
            raise RunError(f"--repo-path {repo_path}: has no commit {commit}") from None
        return None  # a stepwatch commit this clone does not have: keep the sha alone


def run_check(args) -> int:
    from db.series import stored_series

    from .regress.report import format_markdown, is_confirmed_regression
    from .runs.git import resolve_ref
    from .runs.hosts import LocalHost
    from .runs.repos import locate_repo
    from .runs.spec import load_config
    from .runs.track import analyse_series, list_tracked_series

    config = load_config(args.config)
    name, path = locate_repo(args.repo, config, repo_path=args.repo_path)
    if path is None:
        raise SpecError(f"--repo {args.repo}: not in the config's [repos] ({config.source or 'no config file'}); "
                        "give its checkout with --repo-path")
    if ".." not in args.range_spec:
        raise SpecError(f"--range {args.range_spec!r}: expected A..B")
    start, _, end = args.range_spec.partition("..")
    host = LocalHost()
    lo, hi = resolve_ref(host, path, start), resolve_ref(host, path, end)
    rows = []
    with open_db(args.db, read_only=True) as store:
        for s in list_tracked_series(store, name):
            rows += [{**stored_series(s), **r} for r in analyse_series(store, s, (lo.seq, hi.seq))]
        facts = store.list_commits([r["first_bad_commit_id"] for r in rows])
    print(format_markdown(rows, facts, args.range_spec), end="")
    return 1 if args.fail_on_regression and any(is_confirmed_regression(r) for r in rows) else 0


def _store_import(db: str, record, tables, facts) -> tuple[int, bool, int]:
    """(run id, whether it was written, the commits its series now has runs at)."""
    with open_db(db) as store:
        run_id, created = store.insert_run(record, tables)
        if facts is not None:
            store.record_commit(record.repo, facts.sha, facts.committed_at, facts.author, facts.subject, facts.seq)
        commits = count_series_commits(store, run_id) if created and record.commit else 0
    if store.checkpoint_error:  # committed: stored in the WAL, which the next open replays (db/store.py)
        print(f"stepwatch: note: run {run_id} is stored, in the database's write-ahead log ({db}.wal): "
              f"{store.checkpoint_error}", file=sys.stderr)
    return run_id, created, commits


def _import_bar(meter) -> ImportBar:
    """The import's progress bar, drawn once the import has run PROGRESS_AFTER_S (or
    $STEPWATCH_PROGRESS_AFTER_S seconds)."""
    try:
        after_s = float(os.environ.get("STEPWATCH_PROGRESS_AFTER_S", PROGRESS_AFTER_S))
    except ValueError:
        after_s = PROGRESS_AFTER_S
    return ImportBar(meter, sys.stderr, after_s=after_s)


def run_import(args) -> int:
    rules = load_rule_chain(args.rules)
    patterns = load_pattern_catalog(args.patterns)
    limits = import_limits(args.max_trace_mb, args.max_events)
    resolved = _resolve_commit(args.commit, args.repo, args.repo_path)
    opts = ImportOptions(repo=args.repo, commit=resolved.sha if resolved else args.commit, variant=args.variant,
                         layers=args.layers, tok_per_s=args.tok_per_s, steps=args.steps, limits=limits,
                         patterns=patterns, mapping=args.mapping)
    with args.db_thread or DatabaseThread() as db_thread:
        # all reading and checking happens here; a bar on a terminal when it takes a while
        record = prepare_import(args.path, rules, opts, watch=_import_bar if sys.stderr.isatty() else None)
        facts = resolved or _commit_facts(record.commit, record.repo, args.repo_path)
        tables = run_tables(record)  # here, at batch priority, before the database thread holds the file
        run_id, created, commits = db_thread(_store_import, args.db, record, tables, facts)
        # change detection compares commits: the first commit of a series has nothing to compare,
        # and the detector's imports (pandas, SciPy, ruptures: ~1.5 s) are left unloaded
        if created and commits >= 2:
            from .runs.track import follow_runs

            follow_runs(args.db, [run_id], db_thread)  # its own short connections: the detection runs with none open
    kernel_rows = len(record.kernel_stats)
    print(f"{'imported' if created else 'already imported as'} run {run_id}: {record.steps} "
          f"step{'' if record.steps == 1 else 's'} ({record.step_method}), {kernel_rows} kernel "
          f"row{'' if kernel_rows == 1 else 's'}", file=sys.stderr)
    print(run_id)
    return 0


def run_export(args) -> int:
    from db.exchange import export_history, is_schema_current

    with open_db(args.db, read_only=True) as store:  # pages keep reading meanwhile
        current = is_schema_current(store)
    if not current:
        open_db(args.db).close()  # an older file: migrated first, as every writer does
    with open_db(args.db, read_only=True) as store:
        manifest = export_history(store, args.out, repo=args.repo)
    rows = {table: entry["rows"] for table, entry in manifest["tables"].items()}
    print(f"exported {rows['runs']} runs ({rows['commits']} commits, {rows['repos']} repos) from {args.db} "
          f"to {args.out}", file=sys.stderr)
    return 0


def make_merge_checks(trace_roots: tuple[str, ...] = ()):
    """What `ingest merge` checks each row of an export against (db.exchange.MergeChecks): the
    bundle's label rule, the importer's series key, the limits of ingest/limits.py, and the
    directories a merged run's traces may be offered from (verified there, file by file)."""
    from db.exchange import MergeChecks
    from kernels.bundle import LABEL, LABEL_RULE, MAX_LABEL_CHARS

    from .limits import MERGE_MAX_JSON_CHARS, MERGE_MAX_RUN_ROWS, MERGE_MAX_TABLE_ROWS, MERGE_MAX_TEXT_CHARS
    from .traces.importer import find_workload_key

    return MergeChecks(label_pattern=LABEL.pattern, label_rule=LABEL_RULE, max_label_chars=MAX_LABEL_CHARS,
                       max_table_rows=MERGE_MAX_TABLE_ROWS, max_run_rows=MERGE_MAX_RUN_ROWS,
                       max_text_chars=MERGE_MAX_TEXT_CHARS, max_json_chars=MERGE_MAX_JSON_CHARS,
                       workload_key_of=find_workload_key, trace_roots=tuple(trace_roots))


def run_merge(args) -> int:
    from db.exchange import check_history, merge_history, read_history

    from .runs.spec import load_config
    from .runs.survival import bundles_dir
    from .runs.track import follow_series

    config = load_config(args.config)
    # a merged run's traces are offered only from this database's kept bundles or the config's import roots
    roots = (os.path.realpath(bundles_dir(args.db)), *config.import_roots)
    history = read_history(args.directory)  # every file checked before the database is opened
    checked = check_history(history, make_merge_checks(roots))  # ... and every row
    with open_db(args.db) as store:
        result = merge_history(store, checked)
    from .regress.report import is_confirmed

    found = [r for series in result.series for r in follow_series(args.db, series)]  # as after a job
    confirmed = sum(is_confirmed(r) for r in found)
    print(f"merged {args.directory} into {args.db}: {result.describe()}; changes detected again in "
          f"{len(result.series)} series ({confirmed} confirmed, {len(found) - confirmed} suspected)", file=sys.stderr)
    return 0


_RUN_ID_DIGITS = 7  # an all-digit A or B shorter than this is a run id; longer, a commit's sha prefix
_SHA_PREFIX = __import__("re").compile(r"^[0-9a-f]{4,40}$")


def _compare_side(store, text: str, repo: str | None, which: str) -> dict:
    """A side of `ingest compare`: {"runs": DataFrame of its runs, "label", "commit": bool}."""
    from db.views import get_run_series_id, list_runs_at_commit

    import pandas as pd

    if text.isdigit() and len(text) < _RUN_ID_DIGITS:
        run = get_run_series_id(store, int(text))
        if run is None:
            raise IngestError(f"{which} {text}: no run {text} in this database")
        return {"runs": pd.DataFrame([{"run_id": int(text), **run}]), "label": f"run {text}", "commit": False}
    ref = text.lower()
    if not _SHA_PREFIX.match(ref):
        raise IngestError(f"{which} {text!r}: neither a run id nor a commit sha (4 to 40 hex digits)")
    runs = list_runs_at_commit(store, ref, repo)
    if runs.empty:
        raise IngestError(f"{which} {text}: no run measured a commit starting {ref}"
                          + (f" in repository {repo!r}" if repo else ""))
    if runs["sha"].nunique() > 1:
        raise IngestError(f"{which} {text}: names {runs['sha'].nunique()} commits; give more of the sha")
    if runs["repo"].nunique() > 1:
        raise IngestError(f"{which} {text}: commit of {runs['repo'].nunique()} repositories; name one with --repo")
    return {"runs": runs, "label": f"commit {runs['sha'].iloc[0][:12]}", "commit": True}


def compare_sides(store, a: dict, b: dict) -> list[dict]:
    """One verdict per variant of a series that both sides measured: the noise model's
    (ingest.regress.noise) over the runs of each side, the spread the series' own, with the
    kernels that explain the change (the last run of each side, ingest.regress.explain)."""
    from db.views import get_step_samples, list_series_values

    from .regress.explain import explain_change
    from .regress.noise import judge_in_series, step_floor

    if a["commit"] and b["commit"]:  # each variant of a series measured at both commits
        pairs = [(runs_a, b["runs"][(b["runs"]["series"] == series) & (b["runs"]["variant"] == variant)])
                 for (series, variant), runs_a in a["runs"].groupby(["series", "variant"], sort=False)]
    else:  # a run alone: it names the series (A's)
        pairs = [(a["runs"], b["runs"])]
    out = []
    for runs_a, runs_b in pairs:
        if runs_b.empty:
            continue
        series, variant = runs_a["series"].iloc[0], runs_a["variant"].iloc[0]
        anchor = int(runs_a["run_id"].iloc[-1])
        values = list_series_values(store, anchor)
        values = values[values["variant"] == variant] if len(values) else values
        floors = [step_floor(get_step_samples(store, int(r))["ms"]) for r in (anchor, int(runs_b["run_id"].iloc[-1]))]
        floors = [f for f in floors if f is not None]
        same = (series is not None and series == runs_b["series"].iloc[0] and variant == runs_b["variant"].iloc[0]
                and runs_a["sha"].iloc[0] == runs_b["sha"].iloc[0])  # a repeat: one code, measured twice
        verdict = judge_in_series(list(zip(values["commit_id"], values["step_ms"])) if len(values) else [],
                                  list(runs_a["step_ms"]), list(runs_b["step_ms"]), same_commit=same,
                                  floor=max(floors, default=None))
        last_a, last_b = int(runs_a["run_id"].iloc[-1]), int(runs_b["run_id"].iloc[-1])
        kernels = []
        ka, kb = store.list_kernels(last_a), store.list_kernels(last_b)
        if len(ka) and len(kb):
            ex = explain_change(ka, kb, float(runs_a["step_ms"].iloc[-1]), float(runs_b["step_ms"].iloc[-1]))
            k = ex.kernels
            # what explains a change: kernels that appeared or vanished, and (for a change only) those
            # with a tenth of it or more; within noise the rest is noise too
            big = k[(k["status"] != "changed") | (verdict.changed & (k["delta_ms_per_step"].abs()
                                                                     >= 0.1 * abs(ex.delta_step_ms)))]
            kernels = [{"name": r["name"], "status": r["status"], "ms_per_step_before": _num(r["ms_per_step_before"]),
                        "ms_per_step_after": _num(r["ms_per_step_after"]), "delta_ms_per_step": _num(r["delta_ms_per_step"]),
                        "fraction_of_change": _num(r["fraction_of_change"])} for r in big.head(5).to_dict("records")]
        out.append({"series": series, "variant": variant, "verdict": verdict.verdict, "sentence": verdict.describe(),
                    "rel_change": _num(verdict.rel), "ci_low": _num(verdict.ci_low), "ci_high": _num(verdict.ci_high),
                    "spread": _num(verdict.spread.sigma), "spread_source": verdict.spread.source,
                    "spread_dof": _num(verdict.spread.dof), "min_detectable": _num(verdict.min_detectable),
                    "runs_a": [int(r) for r in runs_a["run_id"]], "runs_b": [int(r) for r in runs_b["run_id"]],
                    "runs_needed": verdict.runs_needed, "kernels": kernels})
    return out


def _num(x):
    import math

    return float(x) if x is not None and x == x and math.isfinite(float(x)) else None


def run_compare(args) -> int:
    """`ingest compare A B`: the Compare page's verdict for CI (exit 1 on a regression with
    --fail-on-regression, 2 on bad input)."""
    with open_db(args.db, read_only=True) as store:
        a = _compare_side(store, args.a, args.repo, "A")
        b = _compare_side(store, args.b, args.repo, "B")
        results = compare_sides(store, a, b)
    if not results:
        raise IngestError(f"A {args.a} and B {args.b}: no series (workload, GPU, variant) measured on both sides")
    if args.json:
        print(json.dumps({"a": a["label"], "b": b["label"], "comparisons": results}, indent=1))
    else:
        print(f"stepwatch compare: {a['label']} -> {b['label']}")
        for r in results:
            print(f"\n{r['variant'] or 'no variant'} (series {r['series'] or 'of no commit'}): {r['sentence']}")
            print(f"  runs: A {', '.join(map(str, r['runs_a']))}; B {', '.join(map(str, r['runs_b']))}")
            for k in r["kernels"]:
                delta = f"{k['delta_ms_per_step']:+.3f} ms per step" if k["delta_ms_per_step"] is not None else ""
                print(f"  kernel {k['status']}: {k['name'][:90]} {delta}")
    return 1 if args.fail_on_regression and any(r["verdict"] == "regression" for r in results) else 0
