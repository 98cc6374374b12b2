"""The limits the command line names (and `--help` shows): what a trace may hold, and how many
attempts a job gets. A module of its own so that parsing the command line loads nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ReadLimits:
    """What a trace may hold before it is refused; each refusal names its limit. Memory is
    bounded by these, not by the input: the largest piece held is max_piece_bytes, the columns
    grow with the events kept (at most max_events)."""

    max_bytes: int = 16 << 30  # uncompressed JSON; `ingest import --max-trace-mb` raises it
    max_inflation: float = 200.0  # uncompressed / compressed of a .json.gz, checked past 256 MB
    max_events: int = 20_000_000  # ~13 GB of JSON, ~0.9 GB of columns; `--max-events` raises it
    max_name_chars: int = 65_536  # an event name (a templated kernel name is a few thousand)
    max_piece_bytes: int = 16 << 20  # one event, or the gap between two events
    # whitespace before the first event (before the object, around `"traceEvents": [`): Kineto
    # writes a newline and a few spaces (the 162 MB H200 capture: 3 bytes); 16 MB of it took 28 s
    # to read before the skip was made linear, and a 4 MB gzip of 4 GB of spaces never ended
    max_padding_bytes: int = 16 << 20


DEFAULT_LIMITS = ReadLimits()


def import_limits(max_trace_mb: int, max_events: int) -> ReadLimits:
    """The limits of `ingest import --max-trace-mb MB --max-events N`."""
    return replace(DEFAULT_LIMITS, max_bytes=max_trace_mb << 20, max_events=max_events)


MAX_ATTEMPTS = 2  # a job's attempts when its worker dies: one retry (ingest/runs/survival.py)

# Runs of each job that one request queues (the form's repeat count, `ingest run --repeat`,
# `ingest backfill --repeat`): repeats give a commit its run-to-run spread (ingest/regress/noise.py);
# 2-3 a commit detect a 5 % change on the H200 (ingest/regress/BENCHMARKS.md), 30 is Pinpoint's order
# of re-runs a commit, and more from one click would flood the queue.
MAX_REPEATS = 30

# An import draws a progress bar on a terminal only once it has run this long (short ones stay
# silent); STEPWATCH_PROGRESS_AFTER_S overrides it (ingest/traces/progress.py)
PROGRESS_AFTER_S = 2.0

# What `ingest merge` takes from an export (db/exchange.py MergeChecks; each refusal names its limit).
# A merge holds the export's tables in memory while it checks them: a table of 5 M kernel rows is
# ~1.5 GB. A run's rows in one table: 64 ranks x 1,000 profiled steps x 15 categories is 960 k
# step_categories rows, the most a run made by `ingest run` can have (WORKLOAD_MAXIMA).
MERGE_MAX_TABLE_ROWS = 5_000_000  # rows of one table of an export; merge a larger history in parts (--repo)
MERGE_MAX_RUN_ROWS = 1_000_000  # rows of one run in one table (steps, step_categories, kernel_stats, rank_stats)
MERGE_MAX_TEXT_CHARS = 65_536  # a text field (a kernel's name: as ReadLimits.max_name_chars)
MERGE_MAX_JSON_CHARS = 1 << 20  # a JSON field (a workload, a manifest, notes, a diagnosis)

# -- files a user hands in: --rules, --patterns, --config and run spec files (ingest/user_files.py)
# Only regular files are read (a FIFO would block, /dev/zero never ends: on b4995d3 it grew to
# 3.4-3.7 GB before MemoryError), at most this many bytes: the built-in catalogs are 3-5 KB
# (categories.toml, patterns.toml), a config of 50 hosts ~10 KB, so 1 MB is 200x the largest seen
USER_FILE_MAX_BYTES = 1 << 20
# how deep tables and arrays may nest in such a file: a spec's deepest field is 3 levels
# (workload.<key>.<list>); a 600-deep TOML made tomllib raise RecursionError (a traceback)
USER_FILE_MAX_DEPTH = 32

# -- re-runs that confirm a suspected change (ingest/runs/confirm.py): its last good and first bad
# commit re-run interleaved, A B A B, on the spec's host (Pinpoint, `asv continuous`). With the
# original run a side, 2 pairs make 3 runs a commit: 4 degrees of freedom of repeats, twice
# noise.MIN_SPREAD_DOF, so the pooled runs always carry their own spread
CONFIRM_PAIRS = 2
# confirmations a series gets at most, ever (each one window, re-run once): a re-run moves a change
# point at most so often before the series is left to people; 4 windows are 16 runs
MAX_CONFIRMATIONS_PER_SERIES = 4

# -- sweeps (ingest/runs/spec.py SweepSpec): a spec whose workload lists batch sizes / lengths is one
# run a combination. The H200 sweep is bs 1-128 in powers of two (8 values) x 2 contexts = 16
# points a variant; SGLang's nightly one-batch runs list 3-6 batch sizes x 1-3 input lengths. 64 points
# is 4x the largest of these: a sweep of an SGLang model runs them in ONE process (the model loaded
# once), whose timeout_s bounds the whole sweep, and 64 reference jobs at ~1-2 min each are an hour.
MAX_SWEEP_POINTS = 64  # combinations of one sweep (the product of its lists' lengths)
MAX_SWEEP_VALUES = 16  # values of one listed field (1 to 32K in powers of two is 16)
