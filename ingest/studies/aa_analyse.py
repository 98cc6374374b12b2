"""The analysis half of ingest.studies.aa_study (see its docstring): reads the A/A runs and
returns the study's Markdown. Kept apart so that `collect` loads nothing of the detector.

For each repository (A/A history, one series):
- every pair of its runs through the noise model exactly as `ingest compare` judges it
  (ingest.commands.compare_sides, in this process: 276 pairs a series), and the consecutive
  pairs and the same-sha repeats also as real `python -m ingest compare` processes;
- its whole history through a real `python -m ingest check --fail-on-regression` process, and
  through change tracking in this process (the rows check prints) for the counts;
- the same run values through asv's step detection (asv.step_detect.detect_steps and
  detect_regressions with asv's default 5 % threshold, the installed asv package: run the
  analysis with PYTHONPATH naming its site-packages if it is not in this venv) and through a
  conbench-style lookback z-score (each commit's value against the mean and sd of all earlier
  ones, at least 5, flagged beyond |z| > 5, conbench's default threshold).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd

from db.store import open_db
from db.views import get_run_spread, get_step_samples, list_repo_runs
from ingest.regress.detect import Point, detect_changes
from ingest.regress.uncertainty import CHANGED, compare_samples
from ingest.commands import compare_sides
from ingest.regress.report import is_confirmed
from ingest.runs.track import analyse_series, list_tracked_series

ROOT = Path(__file__).resolve().parents[2]
LOOKBACK_MIN = 5
Z_THRESHOLD = 5.0  # conbench's default z-score threshold
ASV_THRESHOLD = 0.05  # asv's default regressions threshold


def _runs(store, repo: str):
    return list_repo_runs(store, repo)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ingest", *args], cwd=ROOT, capture_output=True, text=True)


def asv_steps(values: list[float]) -> dict:
    """asv's step detection over the per-commit values (step ms: higher is worse, as asv's times)."""
    try:
        from asv.step_detect import detect_regressions, detect_steps
    except ImportError:
        return {"available": False}
    steps = detect_steps(values)
    _, _, regressions = detect_regressions(steps, threshold=ASV_THRESHOLD)
    return {"available": True, "segments": len(steps), "regressions": len(regressions or [])}


def lookback_z(values: list[float]) -> dict:
    """conbench-style: each point against the distribution of all points before it (>= LOOKBACK_MIN)."""
    flagged, worst = 0, 0.0
    logs = np.log(values)
    for i in range(LOOKBACK_MIN, len(values)):
        prev = logs[:i]
        sd = float(np.std(prev, ddof=1))
        z = (logs[i] - float(np.mean(prev))) / sd if sd > 0 else 0.0
        worst = max(worst, abs(z))
        flagged += abs(z) > Z_THRESHOLD
    return {"flagged": int(flagged), "tested": max(0, len(values) - LOOKBACK_MIN), "max_abs_z": worst}


def analyse(work: Path, repos: tuple[str, ...] = ("aa-idle", "aa-loaded"), db_name: str = "aa.duckdb") -> str:
    db = work / f"analysis-{db_name}"
    shutil.copy(work / db_name, db)  # the collector may still hold the original
    shas = json.loads((work / "shas.json").read_text())
    out = ["| host | runs (commits) | spread (source) | pairs judged | changed | repeat | too noisy | within "
           "noise | not enough | CLI pairs: changed | check: confirmed / suspected, exit | asv regressions | "
           "lookback z flagged (max abs z) |", "| --- |" + " ---: |" * 12]
    details = []
    for repo in repos:
        with open_db(db, read_only=True) as store:
            runs = _runs(store, repo)
            counts: dict[str, int] = {}
            spread = None
            variant_of = {r[0]: r[3] for r in runs}
            series_of = {r[0]: r[4] for r in runs}
            for (ra, sa, va, *_), (rb, sb, vb, *_) in combinations(runs, 2):
                side = lambda r, s, v: {"runs": pd.DataFrame([{"run_id": r, "sha": s, "variant": variant_of[r],
                                                                "series": series_of[r], "step_ms": v}]),
                                        "commit": False, "label": f"run {r}"}
                (c,) = compare_sides(store, side(ra, sa, va), side(rb, sb, vb))
                spread = spread or (c["spread"], c["spread_source"], c["spread_dof"])
                counts[c["verdict"]] = counts.get(c["verdict"], 0) + 1
            series = list_tracked_series(store, repo)
            rows = [r for s in series for r in analyse_series(store, s)]
        # real processes: consecutive pairs and the same-sha repeats
        cli_pairs = list(zip(runs, runs[1:]))
        cli_changed, cli_verdicts = 0, {}
        for (ra, *_), (rb, *_) in cli_pairs:
            res = _cli("compare", str(ra), str(rb), "--db", str(db), "--json", "--fail-on-regression")
            verdict = json.loads(res.stdout)["comparisons"][0]["verdict"] if res.returncode in (0, 1) else "error"
            cli_verdicts[verdict] = cli_verdicts.get(verdict, 0) + 1
            cli_changed += verdict in ("regression", "improvement")
        check = _cli("check", "--repo", repo, "--repo-path", str(work / repo), "--range",
                     f"{shas[repo][0]}..{shas[repo][-1]}", "--db", str(db), "--fail-on-regression")
        confirmed = sum(is_confirmed(r) for r in rows)
        by_commit: dict[str, list[float]] = {}
        for _, sha, v, *_ in runs:
            by_commit.setdefault(sha, []).append(v)
        per_commit = [float(np.median(v)) for v in by_commit.values()]
        asv = asv_steps(per_commit)
        z = lookback_z(per_commit)
        changed = counts.get("regression", 0) + counts.get("improvement", 0)
        sigma, source, dof = spread
        out.append(f"| {repo} | {len(runs)} ({len(by_commit)}) | {100 * sigma:.1f} % ({source}, {dof:g} dof) | "
                   f"{sum(counts.values())} | {changed} | {counts.get('repeat, within noise', 0)} | "
                   f"{counts.get('too noisy', 0)} | {counts.get('within noise', 0)} | {counts.get('not enough data', 0)} | "
                   f"{cli_changed} of {len(cli_pairs)} | {confirmed} / {len(rows) - confirmed}, exit "
                   f"{check.returncode} | {asv.get('regressions', 'n/a')} | {z['flagged']} of {z['tested']} "
                   f"({z['max_abs_z']:.1f}) |")
        values = ", ".join(f"{v:.1f}" for v in per_commit)
        details.append(f"- {repo}: per-commit step ms {values}; CLI verdicts {cli_verdicts}; check's first line: "
                       f"{check.stdout.splitlines()[2] if len(check.stdout.splitlines()) > 2 else check.stdout!r}; "
                       f"changes: {sorted({(r['metric'].split(chr(31))[0], r['direction'], is_confirmed(r)) for r in rows})}")
    return "\n".join(out + [""] + details) + "\n"


def baseline(work: Path, repos: tuple[str, ...] = ("aa-idle", "aa-loaded"), db_name: str = "aa.duckdb") -> str:
    """The same pairs and histories through the verdicts of before issue 30: the rank test on the
    steps of one run a side (ingest.regress.uncertainty.compare_samples, the spread from repeats
    only), and the detector's own confirmation (detect.detect_changes over the step-ms points)."""
    db = work / f"analysis-{db_name}"
    lines = ["| host | pairs | old Compare 'changed' | old detector: confirmed step-ms changes |", "| --- | ---: | ---: | ---: |"]
    with open_db(db, read_only=True) as store:
        for repo in repos:
            runs = _runs(store, repo)
            samples = {r[0]: get_step_samples(store, r[0])["ms"] for r in runs}
            spread = get_run_spread(store, runs[0][0])
            changed = sum(compare_samples(samples[a[0]], samples[b[0]], spread=spread["spread"],
                                          spread_pairs=spread["pairs"]).verdict == CHANGED
                          for a, b in combinations(runs, 2))
            by_commit: dict[str, list[float]] = {}
            for r in runs:
                by_commit.setdefault(r[1], []).extend(samples[r[0]])
            found = detect_changes([Point(s, tuple(v)) for s, v in by_commit.items()], higher_is_better=False)
            lines.append(f"| {repo} | {len(runs) * (len(runs) - 1) // 2} | {changed} | {len(found)} "
                         f"({', '.join(f'{c.rel_change:+.0%}' for c in found)}) |")
    return "\n".join(lines) + "\n"
