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


DEFAULT_LIMITS = ReadLimits()


def import_limits(max_trace_mb: int, max_events: int) -> ReadLimits:
    """The limits of `ingest import --max-trace-mb MB --max-events N`."""
    return replace(DEFAULT_LIMITS, max_bytes=max_trace_mb << 20, max_events=max_events)


MAX_ATTEMPTS = 2  # a job's attempts when its worker dies: one retry (ingest/runs/survival.py)

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
