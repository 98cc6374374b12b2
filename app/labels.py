"""Words and numbers as the dashboard shows them: a workload key as a readable line, a commit as
a short sha and subject, shares as percentages. Pure functions, no Streamlit."""

from __future__ import annotations

import json
import math
from pathlib import PurePath

# workload fields named in a series' one-line description, in this order; the preset or the
# model comes first, and the shape fields a preset implies (heads, hidden, ...) are left out
_SHOWN = (("batch_size", "batch {}"), ("context", "context {}"), ("input_len", "input {}"),
          ("output_len", "output {}"), ("tp", "TP {}"), ("kv_cache_dtype", "KV {}"),
          ("attention_backend", "{} attention"), ("load_format", "{} weights"))


def describe_workload(workload_key: str | None) -> str:
    """`{"preset": "glm5", "batch_size": 1, "context": 2048, "cuda_graph": true, ...}` ->
    'glm5 · batch 1 · context 2048 · CUDA graph'."""
    if not isinstance(workload_key, str) or not workload_key:
        return "no workload recorded"
    try:
        w = json.loads(workload_key)
    except ValueError:
        return workload_key
    if not isinstance(w, dict):
        return workload_key
    parts = [w.get("preset") or (PurePath(w["model_path"]).name if w.get("model_path") else "workload")]
    parts += [fmt.format(w[k]) for k, fmt in _SHOWN if w.get(k) not in (None, "") and not (k == "tp" and w[k] == 1)]
    if "cuda_graph" in w:
        parts.append("CUDA graph" if w["cuda_graph"] else "eager")
    if w.get("device") == "cpu":
        parts.append("CPU")
    return " · ".join(parts)


def describe_series(repo: str, engine: str, device: str, workload_key: str | None) -> str:
    """'glm5 · batch 1 · context 2048 · CUDA graph — reference on NVIDIA H200 (stepwatch)'"""
    return (f"{describe_workload(workload_key)} — {engine or 'unknown engine'} on {device or 'unknown GPU'}"
            f" ({repo or 'no repo'})")


def describe_run(run_id: int, short_sha: str | None, variant: str | None, workload_key: str | None) -> str:
    """'run 5 · 3cf1671 · fused · glm5 · batch 1 · context 2048 · CUDA graph'"""
    return (f"run {run_id} · {short_sha or 'no commit'} · {variant or 'no variant'} · "
            f"{describe_workload(workload_key)}")


def label_commit(short_sha: str, subject: str | None, width: int = 38) -> str:
    """'3bee539 kernels: whole-row gather-cast (512+6…'"""
    subject = (subject or "").strip()
    if len(subject) > width:
        subject = subject[: width - 1] + "…"
    return f"{short_sha} {subject}".strip()


def format_percent(share: float | None, digits: int = 1) -> str:
    return "—" if share is None or (isinstance(share, float) and math.isnan(share)) else f"{share * 100:.{digits}f} %"


def format_number(value: float | None, digits: int = 2, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}{' ' + unit if unit else ''}"


def format_rel(rel: float) -> str:
    """A relative change as people say it: '+9.6 %', '-89.8 %', and from doubling on a factor,
    '9.6x' (not '+860.0 %')."""
    return f"{1 + rel:,.1f}x" if rel >= 1 else f"{rel * 100:+.1f} %"


def format_change(a: float | None, b: float | None) -> str:
    """'+9.6 %' (or '9.6x') from a to b, or '—' when either is missing or a is zero."""
    if a is None or b is None or a == 0 or any(isinstance(v, float) and math.isnan(v) for v in (a, b)):
        return "—"
    return format_rel((b - a) / a)


def describe_graph_attribution(summary: dict | None) -> str | None:
    """How a run's CUDA-graph kernels got their op, line and layer, in one sentence (None when
    no mapping was given): 'Kernels replayed from CUDA graphs: 1,638 of 1,638 attributed ...'."""
    if not summary:
        return None
    share = "" if summary.get("time_share") is None else f", {100 * summary['time_share']:.1f} % of their time"
    text = (f"Kernels replayed from CUDA graphs have no launching op or Python line in the trace: "
            f"{summary['matched']:,} of {summary['kernels']:,} were given the op, line and layer of their twin "
            f"in a {summary['method']} (a graph-off run of the same workload){share}; "
            f"{summary['unmatched']:,} stayed unmatched.")
    if summary.get("layer_frame"):
        text += f" A layer is the call of `{summary['layer_frame']}` it ran in, counted from 0 in each step."
    return text
