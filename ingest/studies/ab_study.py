"""A/B study of the verdicts (issue 30): real changes of known size on the H200, each run its own
process, through stepwatch's verdicts, asv's step detection and a conbench-style lookback z-score.

    .venv/bin/python -m ingest.studies.ab_study collect --work /tmp/ab_study [--repeats 1,3] [--changes ...]
    PYTHONPATH=/tmp/asvenv/lib/python3.11/site-packages \\
        .venv/bin/python -m ingest.studies.ab_study analyse --work /tmp/ab_study [--histories 200]
    .venv/bin/python -m ingest.studies.ab_study floors --work /tmp/ab_study [--histories 200]

The runs: the bank of ingest/studies/ab_bank.py (ingest/studies/benchmark_data/ab-h200-2026-12-02:
`kernels.bench --preset glm5 --kv KV --cuda-graph --steps 2 --layers L`, 42 processes on the lent
H200, round-robin): base (78 layers, fused) and four changes of the work a step does: layers80,
layers82, layers86 (2, 4, 8 more layers' work) and wholepool (the whole-pool cast, ~10x).

A history for (change, r): `BEFORE[r]` commits of base then `AFTER[r]` commits of the change, r runs
a commit, the runs drawn at random from the bank without replacement inside the history. r = 1
and 2 take 5 + 3 commits (the lookback spread needs 6 commits without a change, MIN_HISTORY_DIFFS);
r = 3 takes 3 + 2 (9 base and 6 changed runs: the bank has 14 base runs and 6 to 8 of each change).

collect (end to end, real processes): for each (change, r) one git repository (this checkout's
kernels/ and a file CHANGE.txt; the first changed commit edits CHANGE.txt to say what changed);
each bundle imported as its commit's run with `python -m ingest import` (a process each, into a
database of the history's own, WORK/db/NAME.duckdb); then
`ingest check --fail-on-regression` over the history and `ingest compare --json` of the last good
and first bad commits. The bundles are copied first with the workload's layer count set to 78
(the manifest's own `layers` and `workload.layers`) and imported with `--variant fused`: a code
change that adds work does not change the workload's name, so base and changed runs form one
series, as they would in a real history; the copies' `extra.ab_study` says what ran. The step
times, traces and kernels are the H200's, untouched. Results go to WORK/e2e.jsonl, one line a
history; a history already there is skipped (collect can be run in chunks).

analyse: the resampling study. Each run's value is what the importer stores and the noise model
judges: noise.run_value of its timed steps (the manifest's timing.step_ms, 20 steps); its Point
holds those steps (the detector's candidates), as ingest.runs.track builds them. For each (change, r)
`--histories` random histories (seeded), put through ingest.runs.track.judge_changes on the step
ms metric -- the function `ingest check` runs a series' metric through -- and through asv and the
lookback z; beside them a what-if (judge_stepwatch_floor: the same steps with a 1 % floor in place
of detect.MIN_REL_CHANGE, not what stepwatch does) and, with --aa-db, A/A control histories of the
same shapes from the H200 A/A study's 25 runs. floors: the same histories (and A/A controls: the
H200's, the 2-core machine's aa-idle / aa-loaded, and H200 histories across two sessions) judged by
judge_changes at each of FLOORS (0.5, 1, 2, 3 %), and each A/A study's whole history with every metric
of its series; the table of ingest/regress/BENCHMARKS.md "The floor". They are resampled from 42 real runs, not that many
independent histories: they show
how the verdicts behave on the runs this H200 really produced, not the H200's variation over days.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from db.series import list_series_runs
from db.store import open_db
from ingest.regress.detect import Point, detect_changes
from ingest.regress.noise import estimate_spread, judge, run_value, step_floor
from ingest.runs.track import _commit_points, _metric_points, judge_changes, list_tracked_series, load_series

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "ingest" / "studies" / "benchmark_data" / "ab-h200-2026-12-02"
CHANGES = ("layers80", "layers82", "layers86", "wholepool")
BEFORE = {1: 5, 2: 5, 3: 3}  # commits without the change, by runs a commit
AFTER = {1: 3, 2: 3, 3: 2}
BASE_LAYERS = 78
LOOKBACK_MIN_RUNS = 5  # the conbench-style lookback needs this many earlier runs
Z_THRESHOLD = 5.0  # conbench's default z-score threshold
ASV_THRESHOLD = 0.05  # asv's default regressions threshold
WHAT_IF_FLOOR = 0.01  # the what-if column: stepwatch with a 1 % floor in place of MIN_REL_CHANGE's 3 %
WHAT_CHANGED = {"layers80": "2 more layers of work a decode step (80 instead of 78)",
                "layers82": "4 more layers of work a decode step (82 instead of 78)",
                "layers86": "8 more layers of work a decode step (86 instead of 78)",
                "wholepool": "the KV cache read through the whole-pool cast (full-pool-cast) instead of fused"}


@dataclass(frozen=True)
class BankRun:
    bundle: str  # the bundle directory's name, e.g. 003-layers82
    config: str
    steps_ms: tuple[float, ...]  # the timed steps (manifest timing.step_ms)
    value_ms: float  # noise.run_value of them: what the importer stores and the verdicts judge


def load_bank(bundles: Path) -> dict[str, list[BankRun]]:
    """The bank's runs by config, in run order (bank.json's order, rc 0 only)."""
    meta = json.loads((DATA / "bank.json").read_text())
    out: dict[str, list[BankRun]] = {}
    for run in meta["runs"]:
        if run["rc"] != 0:
            continue
        manifest = json.loads((bundles / run["bundle"] / "manifest.json").read_text())
        steps = tuple(float(v) for v in manifest["timing"]["step_ms"])
        out.setdefault(run["config"], []).append(BankRun(run["bundle"], run["config"], steps, run_value(steps, None)))
    return out


def load_aa_runs(db: Path, repo: str = "aa-h200") -> list[BankRun]:
    """An A/A study's runs of `repo` from its database (ingest/regress/BENCHMARKS.md): the H200's 25
    (the same workload as base, main's kernels/, one process each, 2026-12-02 00:47-00:52 UTC), or
    the 2-core machine's 20 of aa-idle / aa-loaded (the reference tiny preset on CPU): the controls."""
    with open_db(db, read_only=True) as store:
        (series,) = list_tracked_series(store, repo)
        frame = list_series_runs(store, series)
    return [BankRun(f"{repo}-run-{r}", "aa", tuple(map(float, steps)), run_value(steps, None))
            for r, steps in zip(frame["run_id"], frame["step_ms_samples"])]


def draw_control(runs: list[BankRun], repeats: int, rng: np.random.Generator) -> list[list[BankRun]]:
    """An A/A history of the same shape as draw_history's, every run drawn from `runs` without replacement."""
    n = BEFORE[repeats] + AFTER[repeats]
    picked = [runs[i] for i in rng.choice(len(runs), n * repeats, replace=False)]
    return [picked[i * repeats:(i + 1) * repeats] for i in range(n)]


def unpack_bank(work: Path) -> Path:
    """bank.tar.xz unpacked under WORK/bank (once)."""
    dest = work / "bank"
    if not (dest / "000-base" / "manifest.json").exists():
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", str(DATA / "bank.tar.xz"), "-C", str(dest)], check=True)
    return dest


def draw_history(bank: dict[str, list[BankRun]], change: str, repeats: int,
                 rng: np.random.Generator) -> list[list[BankRun]]:
    """BEFORE[r] commits of base runs then AFTER[r] of the change's, `repeats` runs each, drawn
    without replacement inside the history."""
    before, after = BEFORE[repeats], AFTER[repeats]
    base = [bank["base"][i] for i in rng.choice(len(bank["base"]), before * repeats, replace=False)]
    changed = [bank[change][i] for i in rng.choice(len(bank[change]), after * repeats, replace=False)]
    return [base[i * repeats:(i + 1) * repeats] for i in range(before)] + \
        [changed[i * repeats:(i + 1) * repeats] for i in range(after)]


def judge_stepwatch(history: list[list[BankRun]], first_bad: int) -> dict:
    """The step-ms metric of the history through ingest.runs.track.judge_changes (what `ingest
    check` runs each series' metric through): confirmed (the noise model's regression or
    improvement) at the right commit, confirmed elsewhere, suspected (no spread: kept, not
    confirmed); the verdict, interval and spread of the change at the right commit."""
    points = [Point(f"c{i}", tuple(s for run in runs for s in run.steps_ms)) for i, runs in enumerate(history)]
    values = [[run.value_ms for run in runs] for runs in history]
    found = judge_changes("step_ms", False, points, values)
    out = {"right": False, "elsewhere": 0, "suspected": 0, "verdict": None}
    for ch, verdict in found:
        if not verdict.changed:
            out["suspected"] += 1
        elif ch.first_bad == first_bad and verdict.verdict == "regression":
            out.update(right=True, verdict=verdict.verdict, rel=verdict.rel, ci=(verdict.ci_low, verdict.ci_high),
                       spread=verdict.spread.sigma, source=verdict.spread.source)
        else:
            out["elsewhere"] += 1
    return out


def judge_stepwatch_floor(history: list[list[BankRun]], first_bad: int, min_rel_change: float) -> dict:
    """What-if, not what stepwatch does: judge_changes' steps for the step-ms metric (detect_changes'
    candidates, estimate_spread with their breaks and the steps' floor, judge of the segments
    around each candidate) with `min_rel_change` in place of detect.MIN_REL_CHANGE (3 %) in both
    the detector and the judge. As judge_stepwatch: right (bool), elsewhere (a count)."""
    points = [Point(f"c{i}", tuple(s for run in runs for s in run.steps_ms)) for i, runs in enumerate(history)]
    values = [[run.value_ms for run in runs] for runs in history]
    found = detect_changes(points, higher_is_better=False, min_rel_change=min_rel_change)
    floors = [f for f in (step_floor(p.samples) for p in points) if f is not None]
    spread = estimate_spread(values, [c.first_bad for c in found], float(np.median(floors)) if floors else None)
    out = {"right": False, "elsewhere": 0, "min_detectable": None, "candidate": False}
    for ch in found:
        lo, hi = ch.first_bad - ch.points_before, ch.first_bad + ch.points_after
        before = [v for vals in values[max(lo, 0):ch.last_good + 1] for v in vals]
        after = [v for vals in values[ch.first_bad:hi] for v in vals]
        verdict = judge(before, after, spread, min_rel_change=min_rel_change)
        if ch.first_bad == first_bad:
            out.update(min_detectable=verdict.min_detectable, candidate=True)
        if ch.first_bad == first_bad and verdict.verdict == "regression":
            out["right"] = True
        elif verdict.changed:
            out["elsewhere"] += 1
    return out


FLOORS = (0.005, 0.01, 0.02, 0.03)  # the minimum relative changes the floor study compares


def judge_at_floor(history: list[list[BankRun]], first_bad: int, floor: float) -> dict:
    """The step-ms metric of the history through ingest.runs.track.judge_changes, as `ingest check`
    runs it, with `floor` as the minimum relative change: confirmed at the right commit (bool),
    confirmed elsewhere (a count), and whether the detector had a candidate at the right commit."""
    points = [Point(f"c{i}", tuple(s for run in runs for s in run.steps_ms)) for i, runs in enumerate(history)]
    values = [[run.value_ms for run in runs] for runs in history]
    out = {"right": False, "elsewhere": 0}
    for ch, verdict in judge_changes("step_ms", False, points, values, min_rel_change=floor):
        if not verdict.changed:
            continue
        if ch.first_bad == first_bad and verdict.verdict == "regression":
            out["right"] = True
        else:
            out["elsewhere"] += 1
    return out


def draw_cross_session(early: list[BankRun], late: list[BankRun], repeats: int,
                       rng: np.random.Generator) -> list[list[BankRun]]:
    """An A/A history across two sessions of one host: BEFORE[r] commits of `early` runs then
    AFTER[r] of `late` ones (the same code; the H200 A/A study's runs, then the bank's base runs
    2.5 hours later): what a drift between sessions does at each floor."""
    before, after = BEFORE[repeats], AFTER[repeats]
    a = [early[i] for i in rng.choice(len(early), before * repeats, replace=False)]
    b = [late[i] for i in rng.choice(len(late), after * repeats, replace=False)]
    return [a[i * repeats:(i + 1) * repeats] for i in range(before)] + \
        [b[i * repeats:(i + 1) * repeats] for i in range(after)]


def study_floors(bank: dict[str, list[BankRun]], controls: dict[str, list[BankRun]], histories: int,
                 seed: int = 30) -> list[dict]:
    """Detection and false alarms at each of FLOORS: for each change and r, `histories` histories
    drawn as `resample` draws them (the same seeds: the same histories as its table), and for each
    A/A control (`controls`: name -> runs) histories of the same shapes; every history judged at
    every floor, so that the floors differ only in the floor. "cross-session" (when both the H200
    A/A runs and the bank are there): A/A histories whose last AFTER[r] commits come from the other
    session."""
    rows = []
    cases = [(c, None) for c in CHANGES] + [(name, runs) for name, runs in controls.items()]
    if "aa-h200" in controls:
        cases.append(("cross-session", None))
    for name, runs in cases:
        for repeats in (1, 2, 3):
            rng = np.random.default_rng([seed, (*CHANGES, "none").index(name) if name in CHANGES else 4, repeats])
            tally = {f: {"right": 0, "elsewhere": 0} for f in FLOORS}
            for _ in range(histories):
                if name in CHANGES:
                    history, first_bad = draw_history(bank, name, repeats, rng), BEFORE[repeats]
                elif name == "cross-session":
                    history, first_bad = draw_cross_session(controls["aa-h200"], bank["base"], repeats, rng), -1
                else:
                    history, first_bad = draw_control(runs, repeats, rng), -1
                for f in FLOORS:
                    out = judge_at_floor(history, first_bad, f)
                    tally[f]["right"] += out["right"]
                    tally[f]["elsewhere"] += out["elsewhere"] > 0
            rows.append({"case": name, "repeats": repeats, "histories": histories, "tally": tally})
    return rows


def format_floors(bank: dict[str, list[BankRun]], controls: dict[str, list[BankRun]], rows: list[dict]) -> str:
    sizes = measured_changes(bank)
    head = " | ".join(f"{100 * f:g} %: right / elsewhere" for f in FLOORS)
    lines = [f"| case | runs | r | commits | histories | {head} |", "| --- | ---: | ---: | ---: | ---: |"
             + " ---: |" * len(FLOORS)]
    for row in rows:
        c, r, n = row["case"], row["repeats"], row["histories"]
        label = f"{c} ({100 * sizes[c][1]:+.1f} %)" if c in CHANGES else f"A/A {c}"
        count = len(bank[c]) if c in CHANGES else len(controls["aa-h200"]) + len(bank["base"]) \
            if c == "cross-session" else len(controls[c])
        cells = " | ".join(f"{100 * t['right'] / n:.1f} % / {100 * t['elsewhere'] / n:.1f} %"
                           for t in row["tally"].values())
        lines.append(f"| {label} | {count} | {r} | {BEFORE[r]} + {AFTER[r]} | {n} | {cells} |")
    return "\n".join(lines) + "\n"


FULL_HEAD = ("| A/A history | commits | metrics | " + " | ".join(f"{100 * f:g} %: confirmed (metrics)" for f in FLOORS)
             + " |\n| --- | ---: | ---: |" + " --- |" * len(FLOORS) + "\n")


def study_full_histories(db: Path, repos: tuple[str, ...]) -> str:
    """Each A/A study's whole history (every metric of its series: step ms, tok/s, copy share,
    categories, kernels' ms and calls per step, as `ingest check` judges them) at each floor: the
    confirmed changes there are false alarms; counts are judged exactly at every floor."""
    lines = []
    with open_db(db, read_only=True) as store:
        loaded = {repo: load_series(store, s) for repo in repos for s in list_tracked_series(store, repo)}
    for repo, data in loaded.items():
        commits = _commit_points(data.points)
        metrics = list(_metric_points(commits, data.per_step, data.kernels, data.points))
        cells = []
        for f in FLOORS:
            found = [m for m, higher, pts, values in metrics
                     for ch, v in judge_changes(m, higher, pts, values, data.exact_counts, min_rel_change=f)
                     if v.changed]
            cells.append(f"{len(found)} ({', '.join(sorted(set(found)))[:120] or '-'})")
        lines.append(f"| {repo} | {len(commits)} | {len(metrics)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def judge_asv(per_commit_ms: list[float], first_bad: int) -> dict:
    """asv's step detection over the per-commit values (the median of a commit's runs, unweighted),
    regressions beyond asv's default 5 %: at the right commit (the step from first_bad - 1 to
    first_bad) or elsewhere."""
    from asv.step_detect import detect_regressions, detect_steps

    _, _, regressions = detect_regressions(detect_steps(per_commit_ms), threshold=ASV_THRESHOLD)
    spots = [(before, after) for before, after, *_ in regressions or []]
    right = (first_bad - 1, first_bad) in spots
    return {"right": right, "elsewhere": len(spots) - right}


def judge_lookback(history_ms: list[list[float]], first_bad: int) -> dict:
    """conbench-style lookback z: each commit's mean log run value against the mean and sd of all
    earlier runs' log values (each run a point of the history, at least LOOKBACK_MIN_RUNS),
    flagged beyond |z| > Z_THRESHOLD. Right: the first bad commit flagged; elsewhere: a commit
    before it flagged (after it the history holds the change, and conbench would flag those too)."""
    flagged = []
    for i in range(1, len(history_ms)):
        earlier = np.log([v for vals in history_ms[:i] for v in vals])
        if earlier.size < LOOKBACK_MIN_RUNS:
            continue
        sd = float(np.std(earlier, ddof=1))
        z = (float(np.mean(np.log(history_ms[i]))) - float(np.mean(earlier))) / sd if sd > 0 else 0.0
        if abs(z) > Z_THRESHOLD:
            flagged.append(i)
    return {"right": first_bad in flagged,
            "elsewhere": sum(i < first_bad for i in flagged) if first_bad >= 0 else len(flagged)}


def resample(bank: dict[str, list[BankRun]], histories: int, seed: int = 30,
             control: list[BankRun] | None = None) -> list[dict]:
    """For each change and r in 1, 2, 3: `histories` random histories through the three judges;
    with `control` (the A/A runs) also A/A histories of the same shapes ("none": every confirmed
    change, asv regression or flagged commit is a false alarm, counted under "elsewhere")."""
    rows = []
    for change in (*CHANGES, *(("none",) if control else ())):
        for repeats in (1, 2, 3):
            rng = np.random.default_rng([seed, (*CHANGES, "none").index(change), repeats])
            tally = {k: 0 for k in ("sw_right", "sw_floor1_right", "sw_floor1_elsewhere", "sw_floor1_no_candidate",
                                    "sw_elsewhere", "sw_suspected", "asv_right", "asv_elsewhere", "z_right",
                                    "z_elsewhere")}
            sources: dict[str, int] = {}
            detectable: list[float] = []
            for _ in range(histories):
                history = draw_history(bank, change, repeats, rng) if change != "none" else \
                    draw_control(control, repeats, rng)
                first_bad = BEFORE[repeats] if change != "none" else -1
                sw = judge_stepwatch(history, first_bad)
                ms = [[run.value_ms for run in runs] for runs in history]
                asv = judge_asv([float(np.median(v)) for v in ms], first_bad)
                z = judge_lookback(ms, first_bad)
                tally["sw_right"] += sw["right"]
                what_if = judge_stepwatch_floor(history, first_bad, WHAT_IF_FLOOR)
                tally["sw_floor1_right"] += what_if["right"]
                tally["sw_floor1_elsewhere"] += what_if["elsewhere"] > 0
                tally["sw_floor1_no_candidate"] += not what_if["candidate"]
                if what_if["min_detectable"] is not None:
                    detectable.append(what_if["min_detectable"])
                tally["sw_elsewhere"] += sw["elsewhere"] > 0
                tally["sw_suspected"] += sw["suspected"] > 0
                if sw["right"]:
                    sources[sw["source"]] = sources.get(sw["source"], 0) + 1
                tally["asv_right"] += asv["right"]
                tally["asv_elsewhere"] += asv["elsewhere"] > 0
                tally["z_right"] += z["right"]
                tally["z_elsewhere"] += z["elsewhere"] > 0
            rows.append({"change": change, "repeats": repeats, "histories": histories, **tally, "sources": sources,
                         "min_detectable": float(np.median(detectable)) if detectable else None})
    return rows


def measured_changes(bank: dict[str, list[BankRun]]) -> dict[str, tuple[float, float]]:
    """Each config's median run value (ms) and its change against base."""
    base = float(np.median([r.value_ms for r in bank["base"]]))
    return {c: (float(np.median([r.value_ms for r in runs])), float(np.median([r.value_ms for r in runs])) / base - 1)
            for c, runs in bank.items()}


def format_resample(bank: dict[str, list[BankRun]], rows: list[dict], control: list[BankRun] | None = None) -> str:
    bank = {**bank, **({"none": control} if control else {})}
    sizes = measured_changes(bank)
    spread = {c: 100 * float(np.std(np.log([r.value_ms for r in runs]), ddof=1)) for c, runs in bank.items()}
    lines = ["| change (measured) | runs in bank (sd) | r | commits | histories | stepwatch: confirmed at the right "
             "commit | stepwatch: confirmed elsewhere | stepwatch: suspected | what-if, 1 % floor: right / "
             "elsewhere / no candidate there (smallest change it could call) | asv: right | asv: elsewhere | "
             "lookback z: right | lookback z: elsewhere |", "| --- | ---: |" + " ---: |" * 11]
    for row in rows:
        c, r, n = row["change"], row["repeats"], row["histories"]
        pct = lambda k: f"{100 * row[k] / n:.1f} %"
        mdc = f"{100 * row['min_detectable']:.1f} %" if row["min_detectable"] is not None else "-"
        no_candidate = "-" if c == "none" else pct("sw_floor1_no_candidate")
        label = "none: A/A" if c == "none" else f"{c} ({100 * sizes[c][1]:+.1f} %)"
        lines.append(f"| {label} | {len(bank[c])} ({spread[c]:.2f} %) | {r} | "
                     f"{BEFORE[r]} + {AFTER[r]} | {n} | {pct('sw_right')} | {pct('sw_elsewhere')} | "
                     f"{pct('sw_suspected')} | {pct('sw_floor1_right')} / {pct('sw_floor1_elsewhere')} / "
                     f"{no_candidate} ({mdc}) | {pct('asv_right')} | {pct('asv_elsewhere')} | {pct('z_right')} | "
                     f"{pct('z_elsewhere')} |")
    base = bank["base"]
    lines.append(f"\nbase: {len(base)} runs, median {sizes['base'][0]:.3f} ms, sd {spread['base']:.2f} % "
                 f"(log run values); spread source of the confirmed changes: "
                 f"{ {(row['change'], row['repeats']): row['sources'] for row in rows} }")
    return "\n".join(lines) + "\n"


# --- end to end --------------------------------------------------------------------------------

def _git(path: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "ab", "GIT_AUTHOR_EMAIL": "ab@example.com",
           "GIT_COMMITTER_NAME": "ab", "GIT_COMMITTER_EMAIL": "ab@example.com"}
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(path: Path, change: str, before: int, after: int) -> list[str]:
    """A repository of this checkout's kernels/ in before + after commits: the first `before` change
    only note.txt, commit `before` edits CHANGE.txt to say what changed, the rest note.txt again."""
    if path.exists():
        shutil.rmtree(path)
    shutil.copytree(ROOT / "kernels", path / "kernels", ignore=shutil.ignore_patterns("__pycache__", "results"))
    (path / "CHANGE.txt").write_text("base: glm5, 78 layers, fused KV\n")
    _git(path, "init", "-q", "-b", "main")
    for n in range(before + after):
        if n == before:
            (path / "CHANGE.txt").write_text(f"{change}: {WHAT_CHANGED[change]}\n")
            message = f"b{n}: {WHAT_CHANGED[change]}"
        else:
            (path / "note.txt").write_text(f"commit {n}\n")
            message = f"b{n}: nothing in the code changes"
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", message)
    total = before + after
    return [_git(path, "rev-parse", f"main~{total - 1 - n}") for n in range(total)]


def relabel_bundle(src: Path, dest: Path, config: str) -> Path:
    """A copy of a bank bundle whose manifest names the base workload's layer count (see the module
    docstring); the step times, traces and kernels are the run's own."""
    if not (dest / "manifest.json").exists():
        shutil.copytree(src, dest)
        manifest = json.loads((src / "manifest.json").read_text())
        measured = manifest["workload"]["layers"]
        manifest["layers"] = BASE_LAYERS
        manifest["workload"]["layers"] = BASE_LAYERS
        manifest["extra"]["ab_study"] = {"config": config, "layers_run": measured, "variant_run": manifest["variant"]}
        (dest / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return dest


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ingest", *args], cwd=ROOT, capture_output=True, text=True)


def run_history(work: Path, bank_dir: Path, bank: dict[str, list[BankRun]], change: str, repeats: int,
                seed: int = 30) -> dict:
    """One history end to end (see the module docstring); its result for e2e.jsonl."""
    rng = np.random.default_rng([seed, 99, CHANGES.index(change), repeats])
    history = draw_history(bank, change, repeats, rng)
    name = f"ab-{change}-r{repeats}"
    repo = work / "repos" / name
    shas = make_repo(repo, change, BEFORE[repeats], AFTER[repeats])
    db = work / "db" / f"{name}.duckdb"  # one a history: a history cut short is started again from nothing
    db.parent.mkdir(parents=True, exist_ok=True)
    for old in db.parent.glob(f"{name}.duckdb*"):
        old.unlink()
    t0 = time.monotonic()
    for sha, runs in zip(shas, history):
        for run in runs:
            bundle = relabel_bundle(bank_dir / run.bundle, work / "relabelled" / run.bundle, run.config)
            out = _cli("import", str(bundle), "--repo", name, "--commit", sha, "--repo-path", str(repo),
                       "--variant", "fused", "--db", str(db))
            if out.returncode != 0:
                raise SystemExit(f"import of {bundle} into {name} failed: {out.stderr[-1000:]}")
    import_s = time.monotonic() - t0
    first_bad = BEFORE[repeats]
    check = _cli("check", "--repo", name, "--repo-path", str(repo), "--range", f"{shas[0]}..{shas[-1]}",
                 "--db", str(db), "--fail-on-regression")
    compare = _cli("compare", shas[first_bad - 1], shas[first_bad], "--repo", name, "--db", str(db), "--json")
    try:
        comparisons = json.loads(compare.stdout)["comparisons"]
    except (ValueError, KeyError):
        comparisons = [{"error": compare.stderr[-500:]}]
    return {"history": name, "change": change, "repeats": repeats, "shas": shas, "first_bad": shas[first_bad],
            "runs": [[r.bundle for r in runs] for runs in history],
            "values_ms": [[round(r.value_ms, 4) for r in runs] for runs in history],
            "imports": sum(len(r) for r in history), "import_s": round(import_s, 1),
            "check_rc": check.returncode, "check": check.stdout, "check_err": check.stderr[-500:],
            "compare_rc": compare.returncode, "compare": comparisons}


def read_check_rows(check_md: str) -> list[dict]:
    """The rows of `ingest check`'s Markdown table (one a change card's lead metric): metric, change,
    evidence and the first bad commit's short sha."""
    rows = []
    for line in check_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 7 and cells[1] not in ("metric", "---"):
            sha = cells[6].split("`")[1] if cells[6].count("`") >= 2 else ""
            rows.append({"metric": cells[1], "change": cells[4], "evidence": cells[5], "first_bad": sha})
    return rows


def _short_metric(metric: str) -> str:
    """kernel:ms_per_step:NAME... -> kernel:ms_per_step (the kernel names run to hundreds of characters)."""
    return ":".join(metric.split(":")[:2]) if metric.startswith("kernel:") else metric


def format_e2e(results: Path) -> str:
    """The end-to-end histories as a Markdown table (one row a history)."""
    lines = ["| history | commits x runs | imports (s) | check: exit; tok/s or step time confirmed at the right "
             "commit; other confirmed rows there; confirmed rows elsewhere | check's rows (evidence) | "
             "compare last good -> first bad: verdict, change (95 % "
             "interval), spread (source) |", "| --- | --- | ---: | --- | --- | --- |"]
    histories = sorted((json.loads(line) for line in results.read_text().splitlines()),
                       key=lambda h: (h["repeats"], CHANGES.index(h["change"])))
    for h in histories:
        rows = [r for r in read_check_rows(h["check"]) if r["evidence"].startswith(("confirmed", "exact"))]
        at = [bool(r["first_bad"]) and h["first_bad"].startswith(r["first_bad"]) for r in rows]
        right = any(a and r["metric"] in ("tok_per_s", "step_ms") for a, r in zip(at, rows))
        kernels_right = sum(a and r["metric"] not in ("tok_per_s", "step_ms") for a, r in zip(at, rows))
        found = sorted({f"{_short_metric(r['metric'])} {r['change']}, {r['evidence']}" for r in rows})
        evidence = "; ".join(found) or \
            (h["check"].splitlines()[2] if len(h["check"].splitlines()) > 2 else h["check_err"][-200:])
        c = h["compare"][0]
        if "verdict" in c:
            cmp_ = (f"{c['verdict']}, {100 * c['rel_change']:+.1f} % ({100 * c['ci_low']:+.1f} to "
                    f"{100 * c['ci_high']:+.1f} %), {100 * c['spread']:.2f} % ({c['spread_source']}, "
                    f"{c['spread_dof']:g} dof), runs {len(c['runs_a'])} vs {len(c['runs_b'])}")
        else:
            cmp_ = f"error: {c.get('error', '')[:120]}"
        shape = f"{len(h['runs'])} x {len(h['runs'][0])}"
        lines.append(f"| {h['history']} | {shape} | {h['imports']} ({h['import_s']:.0f}) | exit {h['check_rc']}, "
                     f"{'yes' if right else 'no'}; {kernels_right}; {len(rows) - sum(at)} | {evidence} | {cmp_} |")
    return "\n".join(lines) + "\n"


def collect(work: Path, changes: tuple[str, ...], repeats: tuple[int, ...], budget_s: float) -> None:
    work.mkdir(parents=True, exist_ok=True)
    bank_dir = unpack_bank(work)
    bank = load_bank(bank_dir)
    results = work / "e2e.jsonl"
    done = {json.loads(line)["history"] for line in results.read_text().splitlines()} if results.exists() else set()
    began = time.monotonic()
    for r in repeats:
        for change in changes:
            if f"ab-{change}-r{r}" in done:
                continue
            if time.monotonic() - began > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping before ab-{change}-r{r}", flush=True)
                return
            row = run_history(work, bank_dir, bank, change, r)
            with results.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{row['history']}: {row['imports']} imports in {row['import_s']:.0f} s, check exit "
                  f"{row['check_rc']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ingest.studies.ab_study")
    p.add_argument("what", choices=("collect", "analyse", "e2e", "floors"))
    p.add_argument("--work", default="/tmp/ab_study", type=Path)
    p.add_argument("--changes", default=",".join(CHANGES))
    p.add_argument("--repeats", default="1,3")
    p.add_argument("--budget-s", type=float, default=780.0, help="collect: start no history after this long")
    p.add_argument("--histories", type=int, default=200)
    p.add_argument("--aa-db", type=Path, default=Path("/tmp/aa_study/h200.duckdb"),
                   help="analyse: the H200 A/A study's database (its 25 runs are the control; skipped if absent)")
    p.add_argument("--aa-cpu-db", type=Path, default=Path("/tmp/aa_study/aa.duckdb"),
                   help="floors: the 2-core A/A study's database (aa-idle, aa-loaded; skipped if absent)")
    args = p.parse_args(argv)
    if args.what == "collect":
        collect(args.work, tuple(args.changes.split(",")), tuple(int(r) for r in args.repeats.split(",")),
                args.budget_s)
    elif args.what == "floors":
        bank = load_bank(unpack_bank(args.work))
        controls, full = {}, []
        for db, repos in ((args.aa_db, ("aa-h200",)), (args.aa_cpu_db, ("aa-idle", "aa-loaded"))):
            if db.exists():
                copy = args.work / f"floors-{db.name}"
                shutil.copy(db, copy)
                controls.update({repo: load_aa_runs(copy, repo) for repo in repos})
                full.append(study_full_histories(copy, repos))
        print(format_floors(bank, controls, study_floors(bank, controls, args.histories)))
        sessions = {name: float(np.median([r.value_ms for r in runs])) for name, runs in
                    (("aa-h200", controls.get("aa-h200")), ("bank base", bank["base"])) if runs}
        print("medians of the sessions (ms): " + ", ".join(f"{k} {v:.4f}" for k, v in sessions.items()) + "\n")
        print(FULL_HEAD + "".join(full), end="")
    elif args.what == "e2e":
        print(format_e2e(args.work / "e2e.jsonl"), end="")
    else:
        bank = load_bank(unpack_bank(args.work))
        control = None
        if args.aa_db.exists():
            copy = args.work / "aa-h200-copy.duckdb"
            shutil.copy(args.aa_db, copy)
            control = load_aa_runs(copy)
        print(format_resample(bank, resample(bank, args.histories, control=control), control), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
