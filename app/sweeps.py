"""A sweep's figures and its one sentence, from db.sweeps.get_sweep_runs' frame: pure functions,
no Streamlit, no database.

- `pool_points`: one row per (commit, context, batch size, variant): the point's runs pooled as
  the noise model pools a commit (ingest.regress.noise: the geometric mean of the runs' step ms;
  tok/s with it), its per-token step time (step ms / batch size), mean copy share, and its runs.
- `judge_points`: per point, each variant against the baseline variant at the same commit: the
  speed-up (baseline step time over the variant's, both pooled) with the 95 % interval and the
  verdict of ingest.regress.noise.judge_in_series, the spread the baseline's own series' (the
  point's workload, every commit), as Compare judges a patched pair against its unpatched run.
  A run is the sample; with no repeated runs the verdict is "not enough data".
- `describe_sweep`: the sentence on top of the sweep page.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ingest.regress.noise import IMPROVEMENT, NOT_ENOUGH, REGRESSION, TOO_NOISY, WITHIN_NOISE, judge_in_series

SWEEP_FIELDS = ("active_rows", "batch_size", "context", "input_len")  # db.sweeps' (app may not import db here)


def describe_sweep_workload(workload_key: str | None) -> dict:
    """A run's workload key without the fields a sweep varies: the sweep's workload as a dict."""
    try:
        w = json.loads(workload_key or "{}")
    except ValueError:
        return {}
    return {k: v for k, v in w.items() if k not in SWEEP_FIELDS} if isinstance(w, dict) else {}


def find_sweep_of_spec(listing: pd.DataFrame, spec_sweep_id: str) -> tuple[str, str] | None:
    """(sweep_id, sha) of the sweep whose runs carry a sweep spec's id (db.sweeps.list_sweeps'
    frame, newest commit first): the newest such commit; None when no listed sweep has it."""
    for row in listing.itertuples():
        if spec_sweep_id in list(row.spec_sweep_ids):
            return row.sweep_id, row.sha
    return None


def label_context(context) -> str:
    """1024 -> '1K', 4096 -> '4K', 1000 -> '1000', missing -> 'no context'."""
    if context is None or (isinstance(context, float) and math.isnan(context)):
        return "no context"
    n = int(context)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else f"{n}"


def at_context(frame: pd.DataFrame, context) -> pd.Series:
    """The rows of a context (None: the rows that have none, runs whose workload names no context)."""
    return frame["context"].isna() if context is None or pd.isna(context) else frame["context"] == context


def pick_default_context(runs: pd.DataFrame, sha: str):
    """The context with the most points (batch size x variant) at the commit; the smaller on a tie."""
    at = runs[runs["sha"] == sha].drop_duplicates(["context", "batch_size", "variant"])
    counts = at.groupby("context", dropna=False).size()
    if counts.empty:
        return None
    best = counts.max()
    return min(c for c, n in counts.items() if n == best)


def pick_baseline(points: pd.DataFrame) -> str | None:
    """The default baseline variant: the slowest over the batch sizes every variant measured (the
    geometric mean of its pooled step ms there), so the others read as speed-ups of it."""
    if points.empty:
        return None
    variants = points["variant"].unique()
    common = points.groupby("batch_size")["variant"].nunique()
    shared = points[points["batch_size"].isin(common[common == len(variants)].index)]
    shared = shared if len(shared) else points
    return str(shared.groupby("variant")["step_ms"].apply(lambda x: float(np.mean(np.log(x)))).idxmax())


def pool_points(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (sha, short_sha, context, batch_size, variant, workload_id): runs (how many),
    run_id (the newest), step_ms (geometric mean of the runs' values), tok_per_s (geometric mean:
    tokens per step are the batch), ms_per_token (step_ms / batch_size), copy_share (mean)."""
    cols = ["sha", "short_sha", "context", "batch_size", "variant", "workload_id"]
    if runs.empty:
        return pd.DataFrame(columns=cols + ["runs", "run_id", "step_ms", "tok_per_s", "ms_per_token", "copy_share"])
    ok = runs[runs["step_ms"] > 0].assign(log_ms=lambda f: np.log(f["step_ms"]),
                                           log_tok=lambda f: np.log(f["tok_per_s"].where(f["tok_per_s"] > 0)))
    out = ok.groupby(cols, dropna=False, sort=True).agg(
        runs=("run_id", "size"), run_id=("run_id", "max"), log_ms=("log_ms", "mean"), log_tok=("log_tok", "mean"),
        copy_share=("copy_share", "mean")).reset_index()
    out["step_ms"] = np.exp(out.pop("log_ms"))
    out["tok_per_s"] = np.exp(out.pop("log_tok"))
    out["ms_per_token"] = out["step_ms"] / out["batch_size"]
    return out.sort_values(["sha", "context", "batch_size", "variant"], kind="stable").reset_index(drop=True)


def judge_points(runs: pd.DataFrame, sha: str, context, baseline: str) -> pd.DataFrame:
    """Per batch size at the commit and context, each other variant against `baseline` (see the
    module docstring): batch_size, variant, baseline_run_id, run_id (the newest of each side),
    baseline_runs, runs, baseline_step_ms, step_ms (pooled), speedup (baseline / variant step
    time), speedup_low, speedup_high (95 % interval; missing without a spread), verdict, spread
    (its sentence), copy shares of both sides; by variant, then batch size. Points the baseline
    did not measure are left out."""
    here = runs[(runs["sha"] == sha) & at_context(runs, context)]
    rows = []
    for bs, at in here.groupby("batch_size", sort=True):
        base = at[at["variant"] == baseline]
        if base.empty:
            continue
        workload = base["workload_id"].iloc[0]
        history = runs[(runs["workload_id"] == workload) & (runs["variant"] == baseline)]
        series = list(zip(history["commit_id"], history["step_ms"]))
        for variant, side in at[at["variant"] != baseline].groupby("variant", sort=True):
            v = judge_in_series(series, base["step_ms"].tolist(), side["step_ms"].tolist())
            speedup = v.value_a / v.value_b if v.value_a and v.value_b else None
            low = 1 / (1 + v.ci_high) if v.ci_high is not None else None
            high = 1 / (1 + v.ci_low) if v.ci_low is not None and v.ci_low > -1 else None
            rows.append({"batch_size": int(bs), "variant": variant, "baseline": baseline,
                         "baseline_run_id": int(base["run_id"].max()), "run_id": int(side["run_id"].max()),
                         "baseline_runs": v.n_a, "runs": v.n_b, "baseline_step_ms": v.value_a, "step_ms": v.value_b,
                         "speedup": speedup, "speedup_low": low, "speedup_high": high, "verdict": v.verdict,
                         "spread": v.spread.describe(), "baseline_copy_share": float(base["copy_share"].mean()),
                         "copy_share": float(side["copy_share"].mean())})
    columns = ["batch_size", "variant", "baseline", "baseline_run_id", "run_id", "baseline_runs", "runs",
               "baseline_step_ms", "step_ms", "speedup", "speedup_low", "speedup_high", "verdict", "spread",
               "baseline_copy_share", "copy_share"]
    return pd.DataFrame(rows, columns=columns).sort_values(["variant", "batch_size"], kind="stable").reset_index(
        drop=True)


def format_speedup(speedup: float) -> tuple[str, str]:
    """(ratio, direction): 11.9 -> ('11.9x', 'faster'), 0.8 -> ('1.25x', 'slower')."""
    ratio, word = (speedup, "faster") if speedup >= 1 else (1 / speedup, "slower")
    return (f"{ratio:.2f}x" if ratio < 1.5 else f"{ratio:.1f}x"), word


def _list_ratios(points: pd.DataFrame, baseline: str | None = None) -> str:
    """'11.9x faster than B at bs 1, 6.1x at bs 32 and 1.25x slower at bs 256' (the word when it
    changes; 'than B' after the first, with a baseline)."""
    parts, last = [], None
    for p in points.itertuples():
        ratio, word = format_speedup(p.speedup)
        than = f" than {baseline}" if baseline and not parts else ""
        parts.append(f"{ratio}{'' if word == last else ' ' + word}{than} at bs {p.batch_size}")
        last = word
    return _join(parts)


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _list_sizes(points: pd.DataFrame) -> str:
    return "bs " + _join([str(b) for b in points["batch_size"]])


def describe_sweep(verdicts: pd.DataFrame, context, short_sha: str) -> str:
    """One sentence a variant (judge_points' frame): 'fused is 11.9x faster than full-pool-cast at
    bs 1 and 2.6x at bs 128 (context 1K, at 0bc00a5); within noise at bs 4.' The speed-ups stated
    as such are the points changed beyond noise; the others are named by their verdict, with the
    measured ratio where there was not enough data to judge it."""
    where = f"context {label_context(context)}, at {short_sha}"
    if verdicts.empty:
        return f"No variant was measured beside the baseline at any batch size ({where})."
    sentences = []
    for variant, mine in verdicts.groupby("variant", sort=True):
        mine = mine.dropna(subset=["speedup"]).sort_values("batch_size")
        baseline = mine["baseline"].iloc[0] if len(mine) else "the baseline"
        changed = mine[mine["verdict"].isin([IMPROVEMENT, REGRESSION])]
        enough = mine[mine["verdict"] == NOT_ENOUGH]
        head = (f"{variant} is {_list_ratios(changed, baseline)} ({where})" if len(changed)
                else f"{variant} measured {_list_ratios(mine, baseline)} ({where})" if len(enough) == len(mine)
                else f"{variant} is not faster or slower than {baseline} beyond noise at any batch size ({where})")
        tails = []
        noise = mine[mine["verdict"] == WITHIN_NOISE]
        if len(noise):
            tails.append(f"within noise at {_list_sizes(noise)}")
        noisy = mine[mine["verdict"] == TOO_NOISY]
        if len(noisy):
            tails.append(f"too noisy to tell at {_list_sizes(noisy)}")
        if len(enough) == len(mine):
            tails.append("not enough data for a verdict at any point: one run a point, so the run-to-run spread is "
                         "unknown (repeat a point to know it)")
        elif len(enough):
            tails.append(f"not enough data at {_list_sizes(enough)} (measured {_list_ratios(enough)}; "
                         "no repeated runs there)")
        sentences.append(head + "".join(f"; {t}" for t in tails) + ".")
    return " ".join(sentences)
