"""`python -m ingest`: import traces and bundles into the database, and report on runs.

This module builds the command line and loads nothing heavy: `--help`, a usage error or a
misspelt command answer before NumPy, pandas or DuckDB load. Each command's work is in
ingest/commands.py, imported once the arguments are parsed."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import TYPE_CHECKING

from db.common import DEFAULT_DB

from .limits import DEFAULT_LIMITS, MAX_ATTEMPTS, MAX_REPEATS, import_limits
from .runs.names import DEVICES, ENGINES

if TYPE_CHECKING:
    from .priority import DatabaseThread


def _repeat_count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_REPEATS:
        raise argparse.ArgumentTypeError(f"{text!r}: at most {MAX_REPEATS} (MAX_REPEATS, ingest/limits.py)")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


_RAY_ADDRESS = re.compile(r"^(local|auto|(ray://)?[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]{1,5})$")


def _ray_address(text: str) -> str:
    if not _RAY_ADDRESS.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Ray address (HOST:PORT, ray://HOST:PORT, auto or local)")
    return text


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
    imp.add_argument("--mapping", metavar="TRACE",
                     help="a graph-off trace (or directory of per-rank traces) of the same workload: gives each "
                          "kernel replayed from a CUDA graph the op, Python line and layer that launched it")
    imp.add_argument("--rules", metavar="FILE", help="extra category rules (TOML), tried before the built-in ones")
    imp.add_argument("--patterns", metavar="FILE",
                     help="extra patterns (TOML), checked with the built-in catalog (one with a built-in id "
                          "replaces it)")
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
                     help="hosts, repos, patch sets and import roots (TOML); default $STEPWATCH_CONFIG")
    wrk.add_argument("--poll-s", type=_positive_float, default=1.0)
    wrk.add_argument("--exit-when-idle", action="store_true", help="stop when the queue is empty")
    wrk.add_argument("--max-attempts", type=_positive_int, default=MAX_ATTEMPTS, metavar="N",
                     help=f"attempts a job gets when its worker dies (default {MAX_ATTEMPTS}: one retry)")
    wrk.add_argument("--ray", type=_ray_address, metavar="ADDRESS",
                     help="run jobs as tasks on a Ray cluster (HOST:PORT, ray://HOST:PORT, auto, or local: start "
                          "one on this machine); this process alone writes the database")
    wrk.add_argument("--max-in-flight", type=_positive_int, metavar="N",
                     help="with --ray: runs at once (default: the cluster's GPUs, or its CPUs when it has none)")
    wrk.add_argument("--gpus-per-run", type=_positive_float, metavar="N",
                     help="with --ray: GPUs every run asks for (default: one per TP rank on cuda, none on cpu)")
    wrk.add_argument("--ray-cpus", type=_positive_int, metavar="N", help="with --ray local: CPUs the cluster declares")
    wrk.add_argument("--ray-gpus", type=_positive_int, metavar="N", help="with --ray local: GPUs the cluster declares")

    bf = sub.add_parser("backfill", help="queue runs along a repository's first-parent history")
    bf.add_argument("--repo", required=True, metavar="NAME",
                    help="a repo from the config's [repos], or stepwatch (this checkout; reference engine)")
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
    chk.add_argument("--repo", default="stepwatch", metavar="NAME",
                     help="the repository (a config [repos] name, or stepwatch)")
    chk.add_argument("--repo-path", metavar="PATH", help="the checkout of --repo NAME, when the config does not name it")
    chk.add_argument("--db", default=DEFAULT_DB)
    chk.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"))
    chk.add_argument("--fail-on-regression", action="store_true",
                     help="exit 1 when tok/s or step time has a confirmed regression in the range")

    cmp_ = sub.add_parser("compare", help="the verdict on B against A (run ids or commits), as Compare gives it")
    cmp_.add_argument("a", metavar="A", help="a run id, or a commit (sha or its prefix): all its runs pooled")
    cmp_.add_argument("b", metavar="B", help="a run id, or a commit")
    cmp_.add_argument("--repo", metavar="NAME", help="the repository the commits are of (default: any)")
    cmp_.add_argument("--db", default=DEFAULT_DB)
    cmp_.add_argument("--json", action="store_true", help="one JSON object instead of text")
    cmp_.add_argument("--fail-on-regression", action="store_true", help="exit 1 when a verdict is a regression")

    rep = sub.add_parser("report", help="print a run's figures")
    rep.add_argument("run_id", type=_positive_int, metavar="RUN_ID")
    rep.add_argument("--db", default=DEFAULT_DB, help=f"database file (default {DEFAULT_DB})")
    rep.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    rep.add_argument("--rank", type=int, default=None,
                     help="which rank's kernels (default: the run's first rank, e.g. the only one of a single trace)")
    rep.add_argument("--top", type=_positive_int, default=15, help="kernels in the table (default 15)")

    exp = sub.add_parser("export", help="write runs and their history as Parquet files, for `merge`")
    exp.add_argument("--db", default=DEFAULT_DB)
    exp.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    exp.add_argument("--repo", metavar="NAME", help="only this repository's commits and runs")

    mrg = sub.add_parser("merge", help="add an export's runs to the database (runs already here are skipped)")
    mrg.add_argument("directory", metavar="DIR", help="a directory written by `python -m ingest export`")
    mrg.add_argument("--db", default=DEFAULT_DB)
    mrg.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"),
                     help="its [imports] roots: directories a merged run's traces may be offered from (beside "
                          "the database's kept bundles), once verified there")
    return p


def _add_spec_arguments(p: argparse.ArgumentParser, with_repo: bool = True) -> None:
    p.add_argument("spec_file", nargs="?", metavar="SPEC_FILE", help="a run spec (TOML or JSON); flags override")
    p.add_argument("--db", default=DEFAULT_DB)
    p.add_argument("--config", metavar="FILE", default=os.environ.get("STEPWATCH_CONFIG"),
                   help="hosts, repos, patch sets and import roots (TOML); default $STEPWATCH_CONFIG")
    p.add_argument("--engine", choices=ENGINES)
    p.add_argument("--host")
    p.add_argument("--device", choices=DEVICES)
    if with_repo:
        p.add_argument("--repo")
        p.add_argument("--repo-path", help="the checkout of --repo on the host: the config's own for that repo")
        p.add_argument("--ref", help="commit, tag or branch (resolved to a full sha)")
        p.add_argument("--variant")
    p.add_argument("--repeat", type=_repeat_count, default=1, metavar="N",
                   help="run each job N times, each its own run (default 1): repeats give the run-to-run spread "
                        "verdicts need; backfill queues them in rounds over all commits (interleaved)")
    p.add_argument("--path", help="import engine: a trace, directory or bundle under the config's [imports] roots")
    p.add_argument("--timeout-s", type=_positive_float)
    p.add_argument("--preset")
    p.add_argument("--kv")
    p.add_argument("--cuda-graph", action="store_true", default=None)
    p.add_argument("--model-path")
    p.add_argument("--load-format")
    p.add_argument("--kv-cache-dtype")
    p.add_argument("--attention-backend")
    for flag in ("batch-size", "input-len", "output-len", "context"):  # several values: a sweep, one run each
        p.add_argument(f"--{flag}", type=_positive_int, nargs="+", metavar="N",
                       help="one value, or several for a sweep (one run a combination; ingest/runs/spec.py SweepSpec)")
    for flag in ("tp", "profile-steps"):
        p.add_argument(f"--{flag}", type=_positive_int)


# command -> (module, function), imported once the arguments are parsed: a report loads no
# more than it reads (ingest/report.py), the other commands what they run (ingest/commands.py)
COMMANDS = {"import": ("commands", "run_import"), "report": ("report", "run_report"), "run": ("commands", "run_run"),
            "worker": ("commands", "run_worker_cmd"), "backfill": ("commands", "run_backfill"),
            "jobs": ("commands", "run_jobs"), "cancel": ("commands", "run_cancel"),
            "check": ("commands", "run_check"), "compare": ("commands", "run_compare"),
            "samples": ("commands", "run_samples"),
            "export": ("commands", "run_export"), "merge": ("commands", "run_merge")}


def main(argv: list[str] | None = None, db_thread: DatabaseThread | None = None) -> int:
    """The command line; `db_thread`: the thread an import hands its database work to, kept at
    the priority the process started with (ingest/__main__.py lowers the rest)."""
    args = build_parser().parse_args(argv)
    args.db_thread = db_thread
    early = args.command == "import" and _read_early(args)
    try:
        return _run(args)
    finally:
        if early:
            from .traces.trace_read import stop_early

            stop_early()  # the helper, if the import failed before its read took it


def _read_early(args) -> bool:
    """An import of one large trace file starts its reader's helper process now, before the
    import's own modules load (ingest/traces/trace_read.py `start_early`): on two cores it reads
    the trace's first pieces meanwhile."""
    from .traces.trace_read import start_early

    return start_early(args.path, import_limits(args.max_trace_mb, args.max_events))


def _run(args) -> int:
    from db.common import StoreError

    from .errors import IngestError

    module, function = COMMANDS[args.command]
    command = getattr(importlib.import_module(f".{module}", __package__), function)
    errors: tuple = (IngestError, StoreError)
    if module == "commands":  # bundles are read and written there
        from kernels.bundle import BundleError

        errors += (BundleError,)
    try:
        return command(args)
    except errors as e:
        print(f"stepwatch: error: {e}", file=sys.stderr)
        return 2


__all__ = ["main"]
