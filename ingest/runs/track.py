"""Change tracking over the database: each series (repo, engine, workload, device, variant) read
along commit order, its metrics run through detect.detect_changes, every confirmed change
explained kernel by kernel and diagnosed, and the result stored (db.series.replace_changes).
A series is named as the pages name it (db.views.list_series' columns and one variant); rows
handed back carry its stored names (db.series.stored_series: repo, engine, workload_key,
device_name, variant).

Metrics per series: tok/s (higher is better), step ms, copy share, each category's ms per
step (lower is better), and each kernel's ms per step and calls per step where the kernel is
big enough to matter (>= 1 % of a step somewhere in the series). Per-step samples come from
the run's untimed step times (its manifest) and its profiled steps; a run at the same commit
as another adds its samples to that commit's point. Those samples only find candidates
(detect.detect_changes); a change is stored when the noise model confirms it
(ingest.regress.noise, `judge_changes`): the runs are the samples, the spread the metric's own
repeats or history. So two single runs with no history never make a stored change of speed; a
kernel's calls per step is exact, and a kernel that appears or vanishes is "added" / "removed".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from db.series import (
    list_confirmations,
    list_series_runs,
    list_step_categories,
    record_confirmation_verdict,
    replace_changes,
    stored_series,
)
from db.store import open_db
from db.views import get_series_of_run, list_series

from ..priority import run_as_batch
from ..regress.detect import MIN_REL_CHANGE, Change, Point, detect_changes
from ..regress.noise import NOT_ENOUGH, estimate_spread, judge, judge_counts, step_floor
from ..regress.diagnose import RunFacts, diagnose_change
from ..regress.explain import explain_change
from ..traces.categories import COPY_CATEGORIES

PRIMARY = ("tok_per_s", "step_ms")
KERNEL_MIN_SHARE = 0.01
# A candidate with no run-to-run spread to judge it ("not enough data") is kept as suspected from this
# change up, not from the 1 % floor: the floor study (ingest/regress/BENCHMARKS.md "The floor") measured
# the floor against a spread, which such a candidate lacks, and two runs of one commit may differ by more
# than 1 % (the demo's H200 repeats: 7.21 and 7.88 ms). 3 % is the floor every suspected change had before.
SUSPECT_MIN_REL_CHANGE = 0.03


def is_bisectable(metric: str, status: str = "confirmed") -> bool:
    """Changes worth bisecting: confirmed ones (the noise model's rule; a suspected change
    would spend runs on what may be noise) of the step's speed, and structural ones that noise
    cannot fake (a kernel's calls per step, the copy share)."""
    return status == "confirmed" and (metric in PRIMARY or metric == "copy_share"
                                      or metric.startswith("kernel:calls_per_step:"))


def _facts_of(run: dict, kernels: pd.DataFrame) -> RunFacts:
    """RunFacts of a Store.get_run row (its workload is its bundle manifest's) and its kernels."""
    workload = run["workload"] or {}
    return RunFacts(step_ms=run["step_ms"], kernels=kernels, tok_per_s=run["tok_per_s"],
                    profiled_step_ms=run["step_ms_median"],
                    batch_size=run["batch_size"] or workload.get("batch_size"), layers=run["layers"],
                    device_name=run["device"] or None, peak_gbps=run["peak_gbps"], workload=workload,
                    commit=run["sha"], variant=run["variant"] or None)


def _commit_points(points: pd.DataFrame) -> pd.DataFrame:
    """One row per commit (several runs at one commit pool their samples), in commit order."""
    rows = []
    for commit_id, group in points.groupby("commit_id", sort=False):
        samples = [s for lst in group["step_ms_samples"] for s in lst] or list(group["step_ms"].dropna())
        batch = group["batch_size"].dropna()
        rows.append({"commit_id": commit_id, "sha": group["sha"].iloc[0], "seq": group["seq"].iloc[0],
                     "run_ids": list(group["run_id"]), "last_run_id": int(group["run_id"].iloc[-1]),
                     "step_ms_samples": samples, "batch_size": int(batch.iloc[0]) if len(batch) else 1})
    return pd.DataFrame(rows)


def _metric_points(commits: pd.DataFrame, per_step: pd.DataFrame, kernels: dict[int, pd.DataFrame], points=None):
    """(metric, higher_is_better, [Point], run values) for every metric of the series: the Points
    hold each commit's pooled per-step samples (the detector's candidates), the run values one
    number per run of each commit (ingest.regress.noise's sample: a run's step ms, tok/s, its
    median over profiled steps of the copy share or a category, a kernel's ms or calls per step)."""
    shas = list(commits["sha"])
    by_run = points.set_index("run_id") if points is not None else None

    def run_field(field: str, fallback=None) -> list[list[float]]:
        out = []
        for run_ids, batch in zip(commits["run_ids"], commits["batch_size"]):
            vals = []
            for r in run_ids:
                v = by_run.at[r, field] if by_run is not None and field in by_run.columns else None
                if (v is None or pd.isna(v)) and fallback is not None:
                    v = fallback(r, batch)
                if v is not None and not pd.isna(v):
                    vals.append(float(v))
            out.append(vals)
        return out

    step_ms = run_field("step_ms")
    tok = run_field("tok_per_s", lambda r, b: b * 1000.0 / by_run.at[r, "step_ms"] if by_run is not None
                    and by_run.at[r, "step_ms"] else None)
    yield "step_ms", False, [Point(s, tuple(v)) for s, v in zip(shas, commits["step_ms_samples"])], step_ms
    yield "tok_per_s", True, [Point(s, tuple(b * 1000.0 / np.asarray(v, float)) if len(v) else ())
                              for s, v, b in zip(shas, commits["step_ms_samples"], commits["batch_size"])], tok
    steps = per_step.pivot_table(index=["run_id", "step"], columns="category", values="dur_us",
                                 aggfunc="sum", fill_value=0.0) if len(per_step) else pd.DataFrame()
    totals = per_step.groupby(["run_id", "step"])["kernel_us"].first() if len(per_step) else pd.Series(dtype=float)

    def per_commit(values: pd.Series) -> tuple[list[Point], list[list[float]]]:
        out, runs = [], []
        medians = values.groupby(level=0).median() if len(values) else values
        for sha, run_ids in zip(shas, commits["run_ids"]):
            v = values[values.index.get_level_values(0).isin(run_ids)] if len(values) else values
            out.append(Point(sha, tuple(v.to_numpy(float))))
            runs.append([float(medians[r]) for r in run_ids if r in medians.index])
        return out, runs

    if len(steps):
        copy = steps[[c for c in COPY_CATEGORIES if c in steps.columns]].sum(axis=1) / totals
        yield "copy_share", False, *per_commit(copy)
        for category in steps.columns:
            yield f"category:{category}", False, *per_commit(steps[category] / 1000.0)
    # kernels: one value per run (0 where absent), for kernels worth 1 % of a step somewhere
    tables = {rid: k for rid, k in kernels.items()}
    shares = pd.concat([k.assign(run_id=rid) for rid, k in tables.items()]) if tables else pd.DataFrame()
    if len(shares):
        shares["key"] = shares["name"] + "\x1f" + shares["launcher"] + "\x1f" + shares["source"]
        big = shares.groupby("key")["share"].max()
        for key in big[big >= KERNEL_MIN_SHARE].index:
            for field in ("ms_per_step", "calls_per_step"):
                pts, runs = [], []
                for sha, run_ids in zip(shas, commits["run_ids"]):
                    vals = [float(tables[r].loc[tables[r]["key"] == key, field].sum()) if "key" in tables[r]
                            else 0.0 for r in run_ids]
                    pts.append(Point(sha, tuple(vals)))
                    runs.append(vals)
                yield f"kernel:{field}:{key}", False, pts, runs


@dataclass(frozen=True)
class SeriesData:
    """Everything the detection of one series reads from the database, so that the detection
    itself (seconds of CPU on a long series) runs with no connection open: DuckDB lets one
    process have the file at a time, and readers and writers wait for whoever holds it."""

    points: pd.DataFrame
    per_step: pd.DataFrame
    kernels: dict
    facts: dict  # run id -> RunFacts
    exact_counts: bool = True  # workload recorded, commit order known: a kernel's calls per step is exact from one run
    confirmations: tuple = ()  # db.series.list_confirmations: windows re-run interleaved (confirm.py)


def load_series(store, series: dict, seq_range: tuple[int, int] | None = None) -> SeriesData | None:
    """Read one series' runs, per-step samples and kernels; None when it spans fewer than two
    commits (nothing to compare)."""
    points = list_series_runs(store, series, seq_range)
    if points["commit_id"].nunique() < 2:
        return None
    run_ids = [int(r) for r in points["run_id"]]
    runs, kernel_rows = store.list_runs(run_ids), store.list_kernels_of_runs(run_ids)
    facts = {rid: _facts_of(runs[rid], kernel_rows[rid]) for rid in run_ids}
    kernels = {}
    for rid in run_ids:
        k = facts[rid].kernels.copy()
        k["key"] = k["name"] + "\x1f" + k["launcher"] + "\x1f" + k["source"]
        kernels[rid] = k
    # counts are exact along a known order only: a commit without its first-parent place sorts last
    exact = bool(series.get("workload_key")) and bool(points["seq"].notna().all())
    return SeriesData(points, list_step_categories(store, run_ids), kernels, facts, exact,
                      tuple(list_confirmations(store, series)))


def detect_series_changes(data: SeriesData | None) -> list[dict]:
    """Detect, explain and diagnose the changes of one series (no database); rows for
    replace_changes."""
    if data is None:
        return []
    commits = _commit_points(data.points)
    rows = []
    for metric, higher, pts, run_values in _metric_points(commits, data.per_step, data.kernels, data.points):
        for ch, verdict in judge_changes(metric, higher, pts, run_values, data.exact_counts):
            good, bad = commits.iloc[ch.last_good], commits.iloc[ch.first_bad]
            between = int(bad["seq"] - good["seq"] - 1) if pd.notna(bad["seq"]) and pd.notna(good["seq"]) else 0
            row = {"metric": metric, "direction": _direction(metric, ch, verdict),
                   "last_good_commit_id": int(good["commit_id"]), "first_bad_commit_id": int(bad["commit_id"]),
                   "last_good_run_id": int(good["last_run_id"]), "first_bad_run_id": int(bad["last_run_id"]),
                   "before_value": ch.before_median, "after_value": ch.after_median,
                   "rel_change": ch.rel_change,  # +inf for a kernel that appears
                   "p_value": ch.p_value, "commits_between": max(between, 0),
                   "noise": {"verdict": verdict.verdict, "spread": verdict.spread.sigma,
                             "spread_source": verdict.spread.source, "spread_dof": verdict.spread.dof,
                             "runs_before": verdict.n_a, "runs_after": verdict.n_b,
                             "ci_low": verdict.ci_low, "ci_high": verdict.ci_high}}
            noise = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.pop("noise").items()}
            row["explanation"] = {"noise": noise}  # how the noise model confirmed it
            if metric in PRIMARY:
                before, after = data.facts[row["last_good_run_id"]], data.facts[row["first_bad_run_id"]]
                explanation = explain_change(before.kernels, after.kernels, before.step_ms, after.step_ms)
                row["explanation"].update({"kernels": _records(explanation.kernels.head(10)),
                                           "categories": _records(explanation.categories),
                                           "unexplained_ms": explanation.unexplained_ms})
                row["diagnosis"] = [asdict(f) for f in diagnose_change(before, after, explanation, bad["sha"])]
            rows.append(row)
    return apply_confirmations(rows, data, judge_confirmations(data))


# the metrics a confirmation's verdict speaks for: a dismissed window drops them; structural facts
# (a kernel's calls per step, a kernel added or removed) are exact and stay
def _judged_by_runs(row: dict) -> bool:
    return not row["metric"].startswith("kernel:calls_per_step:") and row["direction"] not in ("added", "removed")


def judge_confirmations(data: SeriesData | None) -> list[dict]:
    """The verdict on each confirmation of the series whose re-runs are all in and that is not yet
    judged: all the step-time runs of its last good commit A against those of its first bad commit
    B, pooled (ingest.regress.noise.judge), with the series' spread (its repeats: the re-runs give
    them). {"confirmation_id", "state": confirmed | dismissed | failed (no runs to judge, or no
    spread: re-runs that failed), "verdict", "summary"} each. Pure."""
    if data is None or not data.confirmations:
        return []
    commits = _commit_points(data.points)
    by_run = data.points.set_index("run_id")
    values = [[float(by_run.at[r, "step_ms"]) for r in run_ids if pd.notna(by_run.at[r, "step_ms"])]
              for run_ids in commits["run_ids"]]
    floors = [f for f in (step_floor(s) for s in commits["step_ms_samples"]) if f is not None]
    spread = estimate_spread(values, floor=float(np.median(floors)) if floors else None)
    where = {int(c): i for i, c in enumerate(commits["commit_id"])}
    judged = []
    for cf in data.confirmations:
        if cf["state"] != "queued" or cf["pending"]:
            continue
        i, j = where.get(int(cf["last_good_commit_id"])), where.get(int(cf["first_bad_commit_id"]))
        verdict = judge(values[i] if i is not None else [], values[j] if j is not None else [], spread)
        if verdict.changed:
            state = "confirmed"
        elif verdict.verdict == NOT_ENOUGH:
            state = "failed"
        else:
            state = "dismissed"
        judged.append({"confirmation_id": int(cf["confirmation_id"]), "state": state, "verdict": verdict.verdict,
                       "summary": verdict.describe()})
    return judged


def apply_confirmations(rows: list[dict], data: SeriesData, judged: list[dict]) -> list[dict]:
    """The change rows less those a confirmation dismissed: at a window whose interleaved re-runs
    came out within noise (or too noisy), the rows the runs judge (speed, copy share, categories,
    a kernel's ms) go; a kernel's exact facts (calls per step, added, removed) stay. How the
    others were confirmed is the confirmations table's, joined where pages read changes
    (db.views). Pure."""
    states = {j["confirmation_id"]: j["state"] for j in judged}
    dismissed = {(int(cf["last_good_commit_id"]), int(cf["first_bad_commit_id"])) for cf in data.confirmations
                 if states.get(cf["confirmation_id"], cf["state"]) == "dismissed"}
    return [r for r in rows if not ((r["last_good_commit_id"], r["first_bad_commit_id"]) in dismissed
                                    and _judged_by_runs(r))]


def judge_changes(metric: str, higher: bool, points: list[Point], run_values: list[list[float]],
                  exact_counts: bool = True, min_rel_change: float = MIN_REL_CHANGE):
    """The detector's candidate changes of one metric that the noise model (ingest.regress.noise)
    confirms, with its verdict: the runs of the segment before against those after (each run one
    sample, the commits of a segment pooled), the spread from the metric's own repeats, else its
    own history with the detector's change points left out, the steps of a run only its floor.
    A kernel's calls per step is a count: exact (judge_counts). A kernel that appears or vanishes
    (its calls per step from or to 0) is kept whatever the noise: "added" / "removed". A candidate
    with no spread to judge it against ("not enough data": single runs, a short history) is kept
    as *suspected* when it is at least SUSPECT_MIN_REL_CHANGE (its noise verdict says so; pages,
    `ingest check` and bisect tell it apart); one within noise, below the floor or too noisy to
    judge is dropped. `min_rel_change`: the floor of every
    measured (not counted) metric, the detector's and the judge's (ingest/studies/ab_study.py
    measures it at other values)."""
    count = metric.startswith("kernel:calls_per_step:")
    # (a series with no workload recorded may lump different work together: its counts go to the detector)
    found = (count and exact_counts and find_count_changes(points, run_values, higher)) or detect_changes(
        points, higher_is_better=higher, min_rel_change=min_rel_change)
    if not found:
        return []
    # the floor: a run's own steps (a kernel's points hold one value a run, no steps)
    floors = [] if metric.startswith("kernel:") else [f for f in (step_floor(p.samples) for p in points) if f is not None]
    spread = None if count else estimate_spread(run_values, [c.first_bad for c in found],
                                                float(np.median(floors)) if floors else None)
    kept = []
    for ch in found:
        lo, hi = ch.first_bad - ch.points_before, ch.first_bad + ch.points_after
        before = [v for vals in run_values[max(lo, 0):ch.last_good + 1] for v in vals]
        after = [v for vals in run_values[ch.first_bad:hi] for v in vals]
        if metric.startswith("kernel:") and (not any(before) or not any(after)):
            verdict = judge_counts([float(bool(v)) for v in before], [float(bool(v)) for v in after])
        elif count:
            verdict = judge_counts(before, after, higher_is_better=higher)
        else:
            verdict = judge(before, after, spread, higher_is_better=higher, min_rel_change=min_rel_change)
        suspected = verdict.verdict == NOT_ENOUGH and not abs(ch.rel_change) < SUSPECT_MIN_REL_CHANGE
        if verdict.changed or suspected:  # the latter kept as "suspected"
            kept.append((ch, verdict))
    return kept


def find_count_changes(points: list[Point], run_values: list[list[float]], higher: bool) -> list[Change] | None:
    """A count's change points (a kernel's calls per step), exactly: wherever consecutive measured
    commits' values differ (78 -> 79 calls is a change: a count has no noise, so no relative floor
    applies), each commit's runs agreeing. None when some commit's runs disagree (then the detector
    decides, with its floor). A rank test cannot rank one value a side; a count needs none: one run
    at each end suffices."""
    measured = [(i, v) for i, v in enumerate(run_values) if v]
    if any(max(v) != min(v) for _, v in measured):
        return None
    levels = [(i, v[0]) for i, v in measured]
    cuts = [k for k in range(1, len(levels)) if levels[k][1] != levels[k - 1][1]]
    bounds = [0, *cuts, len(levels)]
    changes = []
    for j, k in enumerate(cuts):
        (good, before), (bad, after) = levels[k - 1], levels[k]
        rel = (after - before) / abs(before) if before else math.copysign(math.inf, after - before)
        worse = after < before if higher else after > before
        n_before, n_after = k - bounds[j], bounds[j + 2] - k
        changes.append(Change(
            last_good=good, first_bad=bad, last_good_commit=points[good].commit, first_bad_commit=points[bad].commit,
            before_median=float(before), after_median=float(after), rel_change=rel,
            direction="regression" if worse else "improvement", p_value=0.0, points_before=n_before,
            points_after=n_after, samples_before=sum(len(run_values[i]) for i, _ in levels[bounds[j]:k]),
            samples_after=sum(len(run_values[i]) for i, _ in levels[k:bounds[j + 2]]),
            last_good_samples=len(run_values[good]), first_bad_samples=len(run_values[bad]), noise=0.0,
            noise_source="exact", log_scale=False))
    return changes


def _direction(metric: str, ch, verdict) -> str:
    """regression / improvement; a kernel that appears or vanishes is "added" / "removed"."""
    if metric.startswith("kernel:") and (ch.before_median == 0 or ch.after_median == 0):
        return "added" if ch.before_median == 0 else "removed"
    return verdict.verdict if verdict.changed else ch.direction


def analyse_series(store, series: dict, seq_range: tuple[int, int] | None = None) -> list[dict]:
    """Detect, explain and diagnose the changes of one series; returns rows for replace_changes."""
    return detect_series_changes(load_series(store, series, seq_range))


def _records(frame: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v.item() if hasattr(v, "item") else v)
             for k, v in row.items()} for row in frame.to_dict(orient="records")]


_SERIES_NAMES = ("repo", "engine", "device", "workload_id", "workload_key")


def list_tracked_series(store, repo: str | None = None) -> list[dict]:
    """Each variant of each series (of one repository, or of all), named as pages name it, in
    the order of their stored names (repo, engine, workload key, GPU, variant; missing last)."""
    named = {}
    for row in list_series(store, repo).to_dict(orient="records"):
        for variant in row["variants"]:
            series = {**{k: row[k] for k in _SERIES_NAMES}, "variant": variant}
            named[tuple(series.values())] = series  # once, also where a series' runs differ in batch size
    return sorted(named.values(), key=lambda s: [(v is None, v or "") for v in stored_series(s).values()])


def track_changes(store, repo: str | None = None, seq_range: tuple[int, int] | None = None,
                  only: Iterable[dict] | None = None) -> list[dict]:
    """Re-detect the changes of every series (or `only` these, named as list_tracked_series
    names them) and store them; returns the stored rows with their series' stored names."""
    series_rows = list(only) if only is not None else list_tracked_series(store, repo)
    found = []
    for s in series_rows:
        data = load_series(store, s, seq_range)
        rows = detect_series_changes(data)
        write_series_changes(store, s, rows, judge_confirmations(data) if seq_range is None else [])
        found += [{**stored_series(s), **r} for r in rows]
    return found


def follow_runs(db_path: str, run_ids: list[int], db_call: Callable | None = None) -> list[dict]:
    """Re-detect the changes of the series new runs joined and store them, each series once
    however many of its runs arrived (a job's one run, or the fleet worker's every few seconds):
    read (one short connection), detect (none open, at batch priority: ingest/priority.py),
    write (a short one a series). `db_call` runs the database steps (a command's DatabaseThread);
    by default they run here. Returns the stored rows."""
    return _follow(db_path, lambda store: _series_of_runs(store, run_ids), db_call)


def follow_series(db_path: str, series: dict, db_call: Callable | None = None) -> list[dict]:
    """follow_runs for one series named as list_tracked_series names it (a series that `ingest
    merge` added runs to, or whose commit order it learnt)."""
    return _follow(db_path, lambda store: [series], db_call)


def _follow(db_path: str, pick: Callable, db_call: Callable | None) -> list[dict]:
    call = db_call or (lambda fn, *args: fn(*args))
    found = []
    for series, data in call(_load_series, db_path, pick):
        rows = run_as_batch(detect_series_changes, data)  # seconds of CPU on a loaded machine
        call(_write_changes, db_path, series, rows, judge_confirmations(data))
        found += [{**stored_series(series), **r} for r in rows]
    return found


def _series_of_runs(store, run_ids: list[int]) -> list[dict]:
    """The distinct series the runs belong to (runs without a commit have none)."""
    named = [get_series_of_run(store, run_id) for run_id in run_ids]
    return list({json.dumps(stored_series(s), sort_keys=True, default=str): s for s in named if s is not None}.values())


def _load_series(db_path: str, pick: Callable) -> list[tuple[dict, SeriesData | None]]:
    # (not read-only: DuckDB refuses a read-only attachment beside the read-write one that a
    # worker's heartbeat thread may hold in the same process)
    with open_db(db_path) as store:
        return [(series, load_series(store, series)) for series in pick(store)]


def write_series_changes(store, series: dict, rows: list[dict], judged: list[dict]) -> None:
    """Store a series' changes and the verdicts of its confirmations that are now judged."""
    replace_changes(store, series, rows)
    for j in judged:
        record_confirmation_verdict(store, j["confirmation_id"], j["state"], j["verdict"], j["summary"])


def _write_changes(db_path: str, series: dict, rows: list[dict], judged: list[dict]) -> None:
    with open_db(db_path) as store:
        write_series_changes(store, series, rows, judged)
