"""`python -m ingest check`: the changes of a commit range as Markdown, for CI logs and PRs.

One event, one row: the changes of one series at one change point (last good, first bad commit)
are grouped, headed by tok/s (else step ms, else copy share), with the kernels that appeared or
vanished there ("added" / "removed", never an improvement or regression of their own) and the
kernel and category changes the noise model confirmed against their own series' noise. A change
is *confirmed* when ingest.regress.noise confirmed it (runs as samples, the series' own spread);
one with no spread to judge it by is *suspected* and fails no gate."""

from __future__ import annotations

import json

from .diagnose import shorten_kernel_name

PRIMARY = ("tok_per_s", "step_ms")
_HEAD_ORDER = ("tok_per_s", "step_ms", "copy_share")
_UNITS = {"tok_per_s": "tok/s", "step_ms": "ms", "copy_share": ""}


def _series_label(row: dict) -> str:
    try:
        w = json.loads(row["workload_key"]) if row.get("workload_key") else {}
    except ValueError:
        w = {}
    what = w.get("preset") or w.get("model_path") or "?"
    mode = " graph" if w.get("cuda_graph") else ""
    return f"{row['engine']} {what}{mode} bs{w.get('batch_size', '?')} `{row['variant']}` on {row['device_name'] or 'cpu'}"


def _value(metric: str, v: float) -> str:
    if metric == "copy_share":
        return f"{100 * v:.1f} %"
    return f"{v:.4g} {_UNITS.get(metric, 'ms')}".strip()


def noise_of(row: dict) -> dict:
    """The noise model's judgement stored with a change ({} for one stored before it)."""
    return ((row.get("explanation") or {}).get("noise")) or {}


def is_confirmed(row: dict) -> bool:
    """Confirmed by the noise model (a regression or improvement beyond the series' spread)."""
    return noise_of(row).get("verdict") in ("regression", "improvement")


def is_confirmed_regression(row: dict) -> bool:
    """What fails `ingest check --fail-on-regression`: a confirmed tok/s or step-time regression."""
    return row["metric"] in PRIMARY and row["direction"] == "regression" and is_confirmed(row)


def _evidence(row: dict) -> str:
    n = noise_of(row)
    runs = f"{n.get('runs_before', '?')} vs {n.get('runs_after', '?')} runs"
    if row["direction"] in ("added", "removed") or n.get("spread_source") == "exact":
        return f"exact ({runs})"
    if is_confirmed(row):
        spread = n.get("spread")
        return f"confirmed ({runs}, spread {100 * spread:.1f} % from {n.get('spread_source')})" if spread is not None \
            else f"confirmed ({runs})"
    return f"suspected: not enough data ({runs}, no run-to-run spread)"


def _kernel_name(metric: str) -> str:
    return shorten_kernel_name(metric.split(":", 2)[2].split("\x1f")[0])


def group_events(rows: list[dict]) -> list[dict]:
    """{"head", "others", "kernels"} per (series, last good, first bad commit), in the rows' order."""
    events: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (json.dumps({k: r.get(k) for k in ("repo", "engine", "workload_key", "device_name", "variant")},
                          sort_keys=True, default=str), r["last_good_commit_id"], r["first_bad_commit_id"])
        events.setdefault(key, []).append(r)
    out = []
    for group in events.values():
        group = sorted(group, key=lambda r: _HEAD_ORDER.index(r["metric"]) if r["metric"] in _HEAD_ORDER else 9)
        head = group[0]
        others = [r for r in group[1:] if not r["metric"].startswith("kernel:")
                  and (r["metric"] in _HEAD_ORDER or is_confirmed(r))]
        kernels, seen = [], set()
        for r in group:
            if r is head or not r["metric"].startswith("kernel:"):
                continue
            if r["direction"] in ("added", "removed") or is_confirmed(r):
                word = r["direction"] if r["direction"] in ("added", "removed") else \
                    f"{r['direction']} {r['rel_change']:+.1%}"
                text = f"{_kernel_name(r['metric'])} {word}"
                if text not in seen:
                    seen.add(text)
                    kernels.append(text)
        out.append({"head": head, "others": others, "kernels": kernels})
    return out


def format_markdown(rows: list[dict], commits: dict[int, dict], range_spec: str) -> str:
    """rows: analyse_series rows with their series fields; commits: commit_id -> facts."""
    regressions = [r for r in rows if is_confirmed_regression(r)]
    lines = [f"## stepwatch check `{range_spec}`", ""]
    if not rows:
        lines.append("No change in any series over this range (none confirmed, none suspected).")
        return "\n".join(lines) + "\n"
    events = group_events(rows)
    suspected = sum(not is_confirmed(r) and r["direction"] not in ("added", "removed") for r in rows)
    lines.append(f"**{len(regressions)} confirmed regression(s)** of tok/s or step time; {len(events)} event(s), "
                 f"{len(rows)} change(s) in all metrics, {suspected} of them only suspected (no run-to-run spread "
                 "to judge them by: repeat the runs).")
    lines += ["", "| series | metric | before | after | change | evidence | first bad commit | unmeasured between "
              "| also there |", "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | --- |"]
    order = sorted(events, key=lambda e: (not is_confirmed_regression(e["head"]), e["head"]["metric"] not in PRIMARY,
                                          -abs(e["head"]["rel_change"])))
    for e in order[:40]:
        r = e["head"]
        bad = commits.get(r["first_bad_commit_id"], {})
        metric = r["metric"].split("\x1f")[0]
        also = "; ".join([f"{o['metric']} {o['rel_change']:+.1%}" for o in e["others"]] + e["kernels"][:6])
        lines.append(f"| {_series_label(r)} | {metric} | {_value(r['metric'], r['before_value'])} | "
                     f"{_value(r['metric'], r['after_value'])} | {r['rel_change']:+.1%} ({r['direction']}) | "
                     f"{_evidence(r)} | `{str(bad.get('sha', '?'))[:12]}` {bad.get('subject') or ''} | "
                     f"{r['commits_between']} | {also} |")
    if len(order) > 40:
        lines.append(f"| ... {len(order) - 40} more | | | | | | | | |")
    for r in regressions:
        lines += ["", f"### {_series_label(r)}: {r['metric']} {r['rel_change']:+.1%}", ""]
        for finding in r.get("diagnosis") or []:
            lines.append(f"- {finding['text']}")
    return "\n".join(lines) + "\n"
