"""`python -m ingest`: import traces and bundles into the database, and report on runs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from db.store import DEFAULT_DB, StoreError, open_db, run_tables
from kernels.bundle import BundleError

from .categories import load_rule_chain
from .errors import IngestError
from .importer import ImportOptions, prepare_import
from .priority import DatabaseThread
from .progress import Progress
from .report import build_report, format_report
from .trace_read import DEFAULT_LIMITS
from .runs.errors import RunError, SpecError
from .runs.git import list_first_parent
from .runs.repos import ROOT as REPO_ROOT, locate_repo
from .runs.spec import DEVICES, ENGINES, load_config, parse_spec
from .runs.survival import MAX_ATTEMPTS, process_stamp
from .runs.worker import check_runnable, execute_job, make_host_for, run_worker, worker_name


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line (what is wrong) and exit code 2, not the whole usage text."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ingest", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    imp = sub.add_parser("import", help="import a trace, a directory of per-rank traces, or a bundle")
    imp.add_argument("path", metavar="PATH")
    imp.add_argument("--db", default=DEFAULT_DB, help=f"database file (default {DEFAULT_DB}, or $STEPWATCH_DB)")
    imp.add_argument("--repo", help="repository name the run belongs to")
    imp.add_argument("--commit", metavar="REF", help="commit the run measured")
    imp.add_argument("--variant", metavar="LABEL", help="e.g. unpatched, or a patch set's name")
    imp.add_argument("--layers", type=_positive_int, metavar="N", help="the model's layer count")
    imp.add_argument("--tok-per-s", type=_positive_float, metavar="X", help="decode tokens per second measured")
    imp.add_argument("--steps", type=_positive_int, metavar="N",
                     help="profiled steps, for a trace with no ProfilerStep and no CUDA graph launches")
    imp.add_argument("--rules", metavar="FILE", help="extra category rules (TOML), tried before the built-in ones")
    imp.add_argument("--repo-path", metavar="PATH",
                     help="a git checkout holding the commit, to record its date, author, subject and order "
                          "(default: this checkout, for runs of the stepwatch repo)")
    imp.add_argument("--max-trace-mb", type=_positive_int, metavar="MB", default=DEFAULT_LIMITS.max_bytes >> 20,
                     help=f"refuse a trace of more JSON than this (default {DEFAULT_LIMITS.max_bytes >> 20:,} MB)")
    imp.add_argument("--max-events", type=_positive_int, metavar="N", default=DEFAULT_LIMITS.max_events,
                     help=f"refuse a trace of more events than this (default {DEFAULT_LIMITS.max_events:,})")

    run = sub.add_parser("run", help="run a benchmark now (recorded as a job) and import its result")
    _add_spec_arguments(run)
    run.add_argument("--queue", action="store_true", help="only queue it for a worker")

    wrk = sub.add_parser("worker", help="take queued jobs one at a time and run them")
    wrk.add_argument("--db", default=DEFAULT_DB)
    wrk.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"),
                     help="hosts, repos and patch sets (TOML); default $STEPWATCH_CONFIG")
    wrk.add_argument("--poll-s", type=_positive_float, default=1.0)
    wrk.add_argument("--exit-when-idle", action="store_true", help="stop when the queue is empty")
    wrk.add_argument("--max-attempts", type=_positive_int, default=MAX_ATTEMPTS, metavar="N",
                     help=f"attempts a job gets when its worker dies (default {MAX_ATTEMPTS}: one retry)")

    bf = sub.add_parser("backfill", help="queue runs along a repository's first-parent history")
    bf.add_argument("--repo", required=True, metavar="NAME_OR_PATH",
                    help="a repo from the config's [repos], or the path of a git checkout on this machine")
    bf.add_argument("--range", required=True, dest="range_spec", metavar="A..B")
    bf.add_argument("--every", type=_positive_int, default=1, metavar="K", help="every K-th commit (B always)")
    bf.add_argument("--variants", default="unpatched", help="comma-separated variants (patch sets)")
    _add_spec_arguments(bf, with_repo=False)

    jobs = sub.add_parser("jobs", help="list jobs")
    jobs.add_argument("--db", default=DEFAULT_DB)
    jobs.add_argument("--status", action="append", choices=("queued", "running", "succeeded", "failed", "cancelled"))
    jobs.add_argument("--limit", type=_positive_int, default=30)

    cancel = sub.add_parser("cancel", help="cancel a queued or running job")
    cancel.add_argument("job_id", type=_positive_int, metavar="JOB_ID")
    cancel.add_argument("--db", default=DEFAULT_DB)

    samples = sub.add_parser("samples", help="load the bundled sample runs into an empty database")
    samples.add_argument("--db", default=DEFAULT_DB)

    chk = sub.add_parser("check", help="changes over a commit range, as Markdown (for CI)")
    chk.add_argument("--range", required=True, dest="range_spec", metavar="A..B")
    chk.add_argument("--repo", default="stepwatch", metavar="NAME_OR_PATH",
                     help="the repository (a config [repos] name, a checkout path, or stepwatch)")
    chk.add_argument("--repo-path", metavar="PATH", help="the checkout of --repo NAME, when the config does not name it")
    chk.add_argument("--db", default=DEFAULT_DB)
    chk.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"))
    chk.add_argument("--fail-on-regression", action="store_true",
                     help="exit 1 when tok/s or step time has a confirmed regression in the range")

    rep = sub.add_parser("report", help="print a run's figures")
    rep.add_argument("run_id", type=_positive_int, metavar="RUN_ID")
    rep.add_argument("--db", default=DEFAULT_DB, help=f"database file (default {DEFAULT_DB})")
    rep.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    rep.add_argument("--rank", type=int, default=None,
                     help="which rank's kernels (default: the run's first rank, e.g. the only one of a single trace)")
    rep.add_argument("--top", type=_positive_int, default=15, help="kernels in the table (default 15)")
    return p


def _add_spec_arguments(p: argparse.ArgumentParser, with_repo: bool = True) -> None:
    p.add_argument("spec_file", nargs="?", metavar="SPEC_FILE", help="a run spec (TOML or JSON); flags override")
    p.add_argument("--db", default=DEFAULT_DB)
    p.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"),
                   help="hosts, repos and patch sets (TOML); default $STEPWATCH_CONFIG")
    p.add_argument("--engine", choices=ENGINES)
    p.add_argument("--host")
    p.add_argument("--device", choices=DEVICES)
    if with_repo:
        p.add_argument("--repo")
        p.add_argument("--repo-path", help="a git checkout on the host, for a repo the config does not name")
        p.add_argument("--ref", help="commit, tag or branch (resolved to a full sha)")
        p.add_argument("--variant")
    p.add_argument("--path", help="import engine: a trace, directory or bundle")
    p.add_argument("--timeout-s", type=_positive_float)
    p.add_argument("--preset")
    p.add_argument("--kv")
    p.add_argument("--cuda-graph", action="store_true", default=None)
    p.add_argument("--model-path")
    p.add_argument("--load-format")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--attention-backend")
    for flag in ("batch-size", "input-len", "output-len", "context", "tp", "profile-steps"):
        p.add_argument(f"--{flag}", type=_positive_int)


_WORKLOAD_FLAGS = ("preset", "kv", "cuda_graph", "model_path", "load_format", "kv_cache_dtype",
                   "attention_backend", "batch_size", "input_len", "output_len", "context", "tp", "profile_steps")


def _spec_body(args) -> dict:
    """The spec file's fields (if any) with the flags given on the command line on top."""
    body: dict = {}
    if args.spec_file:
        import tomllib

        path = args.spec_file
        try:
            text = open(path).read()
            body = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
        except OSError as e:
            raise SpecError(f"{path}: cannot read ({e.strerror})") from None
        except (ValueError, tomllib.TOMLDecodeError) as e:
            raise SpecError(f"{path}: not valid {'JSON' if path.endswith('.json') else 'TOML'} ({e})") from None
        if not isinstance(body, dict):
            raise SpecError(f"{path}: a spec is a table/object")
    workload = dict(body.get("workload") or {})
    for key in _WORKLOAD_FLAGS:
        if getattr(args, key, None) is not None:
            workload[key] = getattr(args, key)
    body["workload"] = workload
    for key in ("engine", "host", "device", "repo", "repo_path", "ref", "variant", "path", "timeout_s"):
        if getattr(args, key, None) is not None:
            body[key] = getattr(args, key)
    return body


def run_run(args) -> int:
    config = load_config(args.config)
    spec = parse_spec(_spec_body(args), config)
    check_runnable(spec, config)  # an unknown ref or an unreachable host: refused, nothing queued
    with open_db(args.db) as store:
        job_id = store.enqueue_job(spec.to_json(), spec.describe())
    print(f"queued job {job_id}: {spec.describe()}", file=sys.stderr)
    if args.queue:
        print(job_id)
        return 0
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
    if status != "succeeded":
        raise RunError(f"job {job_id} {status}: {final['error_kind']}: {final['error']}")
    print(run_id)
    return 0


def _with_progress(bar: Progress, echo):
    """An echo for the job's output lines that also drives the progress bar."""
    from .runs.engines.reference import ProgressParser

    parser = ProgressParser(0, lambda done, planned: bar.update(done, planned))

    def each(line: str) -> None:
        if not parser.feed(line) and echo:
            echo(line)

    return each


def run_worker_cmd(args) -> int:
    config = load_config(args.config)
    print(f"worker {worker_name()} on {args.db}", file=sys.stderr)
    run_worker(args.db, config, load_rule_chain(), poll_s=args.poll_s, exit_when_idle=args.exit_when_idle,
               max_attempts=args.max_attempts, echo=lambda line: print(line, flush=True))
    return 0


def run_backfill(args) -> int:
    config = load_config(args.config)
    host = make_host_for(config, args.host or "local")
    repo_name, repo_path = locate_repo(args.repo, config, args.host or "local")
    if repo_path is None:
        raise SpecError(f"--repo {args.repo}: not in the config's [repos] and not a checkout on this machine")
    commits = list_first_parent(host, repo_path, args.range_spec, args.every)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    base = _spec_body(args)
    specs = []
    for c in commits:  # check every spec before queueing any
        for v in variants:
            body = {**base, "repo": repo_name, "ref": c.sha, "variant": v}
            if args.repo not in config.repos:
                body["repo_path"] = repo_path
            specs.append(parse_spec(body, config))
    batch = f"backfill {repo_name} {args.range_spec}"
    with open_db(args.db) as store:
        for c in commits:
            store.record_commit(repo_name, c.sha, c.committed_at, c.author, c.subject, c.seq)
        ids = [store.enqueue_job(s.to_json(), s.describe(), batch) for s in specs]
    print(f"queued {len(ids)} jobs ({len(commits)} commits x {len(variants)} variants), "
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
    from .samples import load_samples

    with open_db(args.db) as store:
        if store.count_rows()["runs"]:
            print("the database already has runs: samples not loaded", file=sys.stderr)
            return 0
    from .regress.track import track_changes

    n = load_samples(args.db, load_rule_chain())
    with open_db(args.db) as store:
        changes = track_changes(store)
    print(f"loaded {n} sample runs into {args.db}; {len(changes)} confirmed changes", file=sys.stderr)
    return 0


def _commit_facts(commit: str | None, repo: str | None, repo_path: str | None):
    """The commit's date, author, subject and order, when a checkout here holds it."""
    from .runs.git import describe_commit
    from .runs.hosts import LocalHost

    if commit is None:
        return None
    path = repo_path or (str(REPO_ROOT) if repo == "stepwatch" and (REPO_ROOT / ".git").exists() else None)
    if path is None:
        return None
    try:
        return describe_commit(LocalHost(), path, commit)
    except RunError:
        if repo_path:
            raise RunError(f"--repo-path {repo_path}: has no commit {commit}") from None
        return None  # a stepwatch commit this clone does not have: keep the sha alone


def run_check(args) -> int:
    from .regress.report import format_markdown
    from .regress.track import analyse_series
    from .runs.git import resolve_ref
    from .runs.hosts import LocalHost

    from db.series import list_series

    config = load_config(args.config)
    name, path = locate_repo(args.repo, config, repo_path=args.repo_path)
    if path is None:
        raise SpecError(f"--repo {args.repo}: not in the config's [repos] and not a checkout on this machine")
    if ".." not in args.range_spec:
        raise SpecError(f"--range {args.range_spec!r}: expected A..B")
    start, _, end = args.range_spec.partition("..")
    host = LocalHost()
    lo, hi = resolve_ref(host, path, start), resolve_ref(host, path, end)
    rows = []
    with open_db(args.db, read_only=True) as store:
        for s in list_series(store, name).to_dict(orient="records"):
            rows += [{**s, **r} for r in analyse_series(store, s, (lo.seq, hi.seq))]
        ids = sorted({r["first_bad_commit_id"] for r in rows})
        facts = {cid: dict(zip(("sha", "subject"), store.con.execute(
            "SELECT sha, subject FROM commits WHERE commit_id = ?", [cid]).fetchone())) for cid in ids}
    print(format_markdown(rows, facts, args.range_spec), end="")
    regressions = [r for r in rows if r["metric"] in ("tok_per_s", "step_ms") and r["direction"] == "regression"]
    return 1 if args.fail_on_regression and regressions else 0


def _store_import(db: str, record, facts) -> tuple[int, bool]:
    tables = run_tables(record)  # before the file is held
    with open_db(db) as store:
        run_id, created = store.insert_run(record, tables)
        if facts is not None:
            store.record_commit(record.repo, facts.sha, facts.committed_at, facts.author, facts.subject, facts.seq)
    return run_id, created


def run_import(args) -> int:
    rules = load_rule_chain(args.rules)
    limits = dataclasses.replace(DEFAULT_LIMITS, max_bytes=args.max_trace_mb << 20, max_events=args.max_events)
    opts = ImportOptions(repo=args.repo, commit=args.commit, variant=args.variant, layers=args.layers,
                         tok_per_s=args.tok_per_s, steps=args.steps, limits=limits)
    with args.db_thread or DatabaseThread() as db_thread:
        record = prepare_import(args.path, rules, opts)  # all reading and checking happens here
        facts = _commit_facts(record.commit, record.repo, args.repo_path)
        run_id, created = db_thread(_store_import, args.db, record, facts)
        if created and record.commit:
            from .regress.track import follow_run

            follow_run(args.db, run_id, db_thread)  # its own short connections: the detection runs with none open
    print(f"{'imported' if created else 'already imported as'} run {run_id}: {record.steps} steps "
          f"({record.step_method}), {len(record.kernel_stats)} kernel rows", file=sys.stderr)
    print(run_id)
    return 0


def run_report(args) -> int:
    with open_db(args.db, read_only=True) as store:
        report = build_report(store, args.run_id, args.rank)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report, args.top))
    return 0


def main(argv: list[str] | None = None, db_thread: DatabaseThread | None = None) -> int:
    """The command line; `db_thread`: the thread an import hands its database work to, kept at
    the priority the process started with (ingest/__main__.py lowers the rest)."""
    args = build_parser().parse_args(argv)
    args.db_thread = db_thread
    try:
        return {"import": run_import, "report": run_report, "run": run_run, "worker": run_worker_cmd,
                "backfill": run_backfill, "jobs": run_jobs, "cancel": run_cancel, "check": run_check,
                "samples": run_samples}[args.command](args)
    except (IngestError, BundleError, StoreError) as e:
        print(f"stepwatch: error: {e}", file=sys.stderr)
        return 2


__all__ = ["main"]
