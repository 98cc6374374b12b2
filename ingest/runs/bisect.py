"""Automatic bisection: a confirmed change between two measured commits with unmeasured
first-parent commits between them gets the middle one queued (the same spec, another ref), as
`git bisect` would pick it; each result narrows the window until the first bad commit is next
to the last good one. Only runs that came from a job can be bisected (the job holds the spec).
The runs it costs are counted per series (jobs in the batch "bisect <series>").

Each step follows the noise model's rule: the change is re-detected from all runs (the commits of
each side pooled, the series' spread), and only a confirmed one is bisected further. A step whose
speed change is only suspected (no spread to judge it by) is re-run first, its two commits
interleaved on the spec's host (confirm.py, planned by the worker before the bisect)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable

import numpy as np

from db.series import stored_series
from db.store import open_db
from db.views import list_changes

from .connect import make_host
from .git import list_after
from .spec import Config, parse_rerun_spec
from .track import is_bisectable


def series_tag(change: dict) -> str:
    """The batch of a series' bisect jobs: a hash of its stored names (a list_changes row)."""
    key = json.dumps(list(stored_series(change).values()), sort_keys=True)
    return "bisect " + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def _first_parent_between(config: Config, spec, good: str, bad: str) -> list[str]:
    """Commits after `good` up to and including `bad` on bad's first-parent line, oldest first."""
    host = make_host(config.host(spec.host))
    return list_after(host, spec.repo_path or config.repos[spec.repo].path, good, bad)


def plan_bisects(db_path: str, config: Config, echo: Callable[[str], None] = lambda line: None) -> list[int]:
    """Queue the middle commit of every stored change that still has unmeasured commits between
    its last good and first bad commit; returns the new job ids.

    Three steps, so that no database connection is open while git runs (on a host, over SSH:
    seconds): read the changes and the specs of their first bad runs (one short connection),
    list the commits between with git (none), queue what is still missing (another short one,
    which checks again that no job with the same spec exists)."""
    with open_db(db_path) as store:
        windows = _read_windows(store, echo)
    planned = []
    for tag, change, spec_json, point in windows:
        spec = parse_rerun_spec(json.loads(spec_json), point, config)  # a sweep's point: that point, no sweep
        between = _first_parent_between(config, spec, change["last_good_sha"], change["first_bad_sha"])[:-1]
        if between:
            planned.append((tag, change, dataclasses.replace(spec, ref=between[(len(between) - 1) // 2]), len(between)))
    if not planned:
        return []
    queued = []
    with open_db(db_path) as store:
        for tag, change, new, n_between in planned:
            if store.find_jobs_by_spec(new.to_json(), ("queued", "running", "succeeded")):
                continue
            job_id = store.enqueue_job(new.to_json(), f"{new.describe()} ({tag})", tag)
            queued.append(job_id)
            metric = change["metric"].replace("\x1f", " | ")
            echo(f"{tag}: {metric} {change['direction']} between {change['last_good_sha'][:12]} and "
                 f"{change['first_bad_sha'][:12]} ({n_between} commits between): queued {new.ref[:12]} as job {job_id}")
    return queued


def _read_windows(store, echo: Callable[[str], None]) -> list[tuple[str, dict, str]]:
    """(series tag, change, spec of its first bad run) for each change window still to bisect,
    structural changes (deterministic) first, then the noisier speed metrics."""
    changes = list_changes(store, limit=200)
    changes = changes.loc[np.array([is_bisectable(m, s) for m, s in zip(changes["metric"], changes["status"])],
                                   dtype=bool)]
    changes = changes.assign(order=[0 if m.startswith("kernel:calls") else 1 for m in changes["metric"]])
    windows, seen = [], set()
    for change in changes.sort_values(["order", "change_id"]).to_dict(orient="records"):
        window = (series_tag(change), change["last_good_sha"], change["first_bad_sha"])
        if window in seen:
            continue
        seen.add(window)
        tag = window[0]
        if change["commits_between"] <= 0:
            runs = store.count_jobs_in_batch(tag, ("succeeded", "running"))  # the running one is done
            if runs:
                echo(f"{tag}: first bad commit {change['first_bad_sha'][:12]} isolated after {runs} bisect run(s)")
            continue
        spec_json = store.get_job_spec_of_run(int(change["first_bad_run_id"]))
        if spec_json is None:
            echo(f"{tag}: the first bad run was imported, not run by a job: cannot bisect")
            continue
        windows.append((tag, change, spec_json, store.get_run_sweep_point(int(change["first_bad_run_id"]))))
    return windows
