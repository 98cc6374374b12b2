"""Re-runs that confirm: a suspected change (a tok/s or step-time change the noise model could not
judge: no run-to-run spread) in a series whose runs the worker can make again gets its last good
commit A and first bad commit B re-run interleaved, A B A B ... (CONFIRM_PAIRS pairs), on the host
of the first bad run's spec, as Chromium's Pinpoint and `asv continuous` do: one host, the two
commits alternating, so a drift of the host's load falls on both sides. Once the re-runs are in,
change tracking (track.judge_confirmations) judges the change from all the runs of A and B pooled,
with ingest.regress.noise.judge and the spread their repeats now give, and marks it confirmed
("confirmed by 4 interleaved re-runs on local") or dismissed ("not confirmed by re-runs: within
noise"). A run that was only imported (no spec) cannot be re-run: its change stays at most
suspected, and the card says why.

It cannot loop: a window (series, last good, first bad commit) is re-run once, ever (the
confirmations table); runs of a confirmation's own jobs never queue confirmations; a series gets
at most MAX_CONFIRMATIONS_PER_SERIES windows re-run. Bisect (bisect.py) bisects confirmed changes
only, so a suspected speed change is bisected once its re-runs confirm it.

Two short connections, as bisect's: read what to confirm, then queue it (the queue transaction
checks again that the window has no confirmation)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Callable

import numpy as np

from db.series import list_confirmations, list_job_batches_of_runs, queue_confirmation, stored_series
from db.store import open_db
from db.views import get_series_of_run, list_changes

from ..limits import CONFIRM_PAIRS, MAX_CONFIRMATIONS_PER_SERIES
from .spec import Config, RunSpec, parse_rerun_spec
from .track import PRIMARY

BATCH_PREFIX = "confirm "


def is_confirmation_batch(batch: str | None) -> bool:
    """Whether a job's batch is a confirmation's re-runs."""
    return bool(batch) and batch.startswith(BATCH_PREFIX)


def confirmation_tag(change: dict) -> str:
    """The batch of one window's re-runs: a hash of its series' stored names and both commits."""
    key = json.dumps([list(stored_series(change).values()), change["last_good_sha"], change["first_bad_sha"]],
                     sort_keys=True)
    return BATCH_PREFIX + hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


def interleave(spec: RunSpec, good_sha: str, bad_sha: str, pairs: int = CONFIRM_PAIRS) -> list[RunSpec]:
    """The re-run specs in queue order: A B A B ... (`pairs` of each), the spec's host and workload,
    each pinned to its commit's sha."""
    a, b = dataclasses.replace(spec, ref=good_sha), dataclasses.replace(spec, ref=bad_sha)
    return [s for _ in range(pairs) for s in (a, b)]


def plan_confirmations(db_path: str, config: Config, run_ids: list[int],
                       echo: Callable[[str], None] = lambda line: None) -> list[int]:
    """Queue the interleaved re-runs of every suspected tok/s or step-time change in the series of
    `run_ids` (the runs just imported) that has none yet; returns the new job ids. Runs of a
    confirmation's own jobs are left out: their series' changes are judged, never re-run again."""
    with open_db(db_path) as store:
        batches = list_job_batches_of_runs(store, run_ids)
        own = [r for r in run_ids if not is_confirmation_batch(batches.get(int(r)))]
        keys = {_series_key(s) for s in (get_series_of_run(store, int(r)) for r in own) if s is not None}
        if not keys:
            return []
        changes = list_changes(store, limit=200)
        changes = changes.loc[np.array([_series_key(c) in keys for c in changes.to_dict(orient="records")], dtype=bool)]
        windows = _read_windows(store, changes, config, echo)
    queued = []
    if not windows:
        return queued
    with open_db(db_path) as store:
        for change, spec in windows:
            tag = confirmation_tag(change)
            specs = interleave(spec, change["last_good_sha"], change["first_bad_sha"])
            jobs = [(s.to_json(), f"{s.describe()} (re-run {i + 1}/{len(specs)}, {tag})") for i, s in enumerate(specs)]
            ids = queue_confirmation(store, change, int(change["last_good_commit_id"]),
                                     int(change["first_bad_commit_id"]), spec.host, tag, jobs)
            if ids is None:
                continue
            queued += ids
            echo(f"{tag}: suspected {change['metric']} {change['direction']} {change['rel_change']:+.1%} between "
                 f"{change['last_good_sha'][:12]} and {change['first_bad_sha'][:12]}: queued {len(ids)} interleaved "
                 f"re-runs on {spec.host} as jobs {ids[0]}..{ids[-1]}")
    return queued


def _series_key(series: dict) -> str:
    """One variant of a series, by its stored names (a list_changes row, or get_series_of_run's)."""
    return json.dumps(stored_series(series), sort_keys=True, default=str)


def _read_windows(store, changes, config: Config, echo: Callable[[str], None]) -> list[tuple[dict, RunSpec]]:
    """(change, the spec of its first bad run) for each suspected speed window to re-run: one a
    window, while its series has fewer than MAX_CONFIRMATIONS_PER_SERIES confirmations."""
    suspected = changes[(changes["status"] == "suspected") & changes["metric"].isin(PRIMARY)]
    windows, seen, counts = [], set(), {}
    for change in suspected.sort_values("change_id").to_dict(orient="records"):
        window = (change["series_id"], change["last_good_sha"], change["first_bad_sha"])
        if window in seen:
            continue
        seen.add(window)
        if change["series_id"] not in counts:
            counts[change["series_id"]] = {(c["last_good_commit_id"], c["first_bad_commit_id"])
                                           for c in list_confirmations(store, change)}
        done = counts[change["series_id"]]
        if (change["last_good_commit_id"], change["first_bad_commit_id"]) in done:
            continue
        if len(done) >= MAX_CONFIRMATIONS_PER_SERIES:
            echo(f"{confirmation_tag(change)}: its series had {len(done)} windows re-run "
                 f"(MAX_CONFIRMATIONS_PER_SERIES): this one stays suspected")
            continue
        spec_json = store.get_job_spec_of_run(int(change["first_bad_run_id"]))
        point = store.get_run_sweep_point(int(change["first_bad_run_id"]))  # a sweep's point: re-run that point
        spec = parse_rerun_spec(json.loads(spec_json), point, config) if spec_json is not None else None
        if spec is None or spec.engine == "import":
            echo(f"{confirmation_tag(change)}: the first bad run was imported, not run from a spec: "
                 "it cannot be re-run, the change stays suspected")
            continue
        done.add((change["last_good_commit_id"], change["first_bad_commit_id"]))
        windows.append((change, spec))
    return windows
