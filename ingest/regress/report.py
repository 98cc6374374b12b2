"""`python -m ingest check`: the changes of a commit range as Markdown, for CI logs and PRs."""

from __future__ import annotations

import json

PRIMARY = ("tok_per_s", "step_ms")
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


def format_markdown(rows: list[dict], commits: dict[int, dict], range_spec: str) -> str:
    """rows: analyse_series rows with their series fields; commits: commit_id -> facts."""
    regressions = [r for r in rows if r["metric"] in PRIMARY and r["direction"] == "regression"]
    lines = [f"## stepwatch check `{range_spec}`", ""]
    if not rows:
        lines.append("No confirmed change in any series over this range.")
        return "\n".join(lines) + "\n"
    lines.append(f"**{len(regressions)} confirmed regression(s)** of tok/s or step time; "
                 f"{len(rows)} confirmed change(s) in all metrics.")
    lines += ["", "| series | metric | before | after | change | p | first bad commit | unmeasured between |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    order = sorted(rows, key=lambda r: (r["metric"] not in PRIMARY, r["direction"] != "regression",
                                        -abs(r["rel_change"])))
    for r in order[:40]:
        bad = commits.get(r["first_bad_commit_id"], {})
        metric = r["metric"].split("\x1f")[0]
        lines.append(f"| {_series_label(r)} | {metric} | {_value(r['metric'], r['before_value'])} | "
                     f"{_value(r['metric'], r['after_value'])} | {r['rel_change']:+.1%} ({r['direction']}) | "
                     f"{r['p_value']:.2g} | `{str(bad.get('sha', '?'))[:12]}` {bad.get('subject') or ''} | "
                     f"{r['commits_between']} |")
    if len(order) > 40:
        lines.append(f"| ... {len(order) - 40} more | | | | | | | |")
    for r in regressions:
        lines += ["", f"### {_series_label(r)}: {r['metric']} {r['rel_change']:+.1%}", ""]
        for finding in r.get("diagnosis") or []:
            lines.append(f"- {finding['text']}")
    return "\n".join(lines) + "\n"
