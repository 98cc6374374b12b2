"""`python -m ingest`: import traces and bundles into the database, and report on runs."""

from __future__ import annotations

import argparse
import json
import sys

from db.store import DEFAULT_DB, StoreError, open_db
from kernels.bundle import BundleError

from .categories import load_rule_chain
from .errors import IngestError
from .importer import ImportOptions, prepare_import
from .report import build_report, format_report


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ingest", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

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

    rep = sub.add_parser("report", help="print a run's figures")
    rep.add_argument("run_id", type=_positive_int, metavar="RUN_ID")
    rep.add_argument("--db", default=DEFAULT_DB, help=f"database file (default {DEFAULT_DB})")
    rep.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    rep.add_argument("--rank", type=int, default=0, help="which rank's kernels (default 0)")
    rep.add_argument("--top", type=_positive_int, default=15, help="kernels in the table (default 15)")
    return p


def run_import(args) -> int:
    rules = load_rule_chain(args.rules)
    opts = ImportOptions(repo=args.repo, commit=args.commit, variant=args.variant, layers=args.layers,
                         tok_per_s=args.tok_per_s, steps=args.steps)
    record = prepare_import(args.path, rules, opts)  # all reading and checking happens here
    with open_db(args.db) as store:
        run_id, created = store.insert_run(record)
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"import": run_import, "report": run_report}[args.command](args)
    except (IngestError, BundleError, StoreError) as e:
        print(f"stepwatch: error: {e}", file=sys.stderr)
        return 2


__all__ = ["main"]
