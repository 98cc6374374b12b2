"""How tables look: column labels, units and formats, links to runs, and the kernel table's
text filter."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import streamlit as st

RUN_URL = "run?run={}"  # relative, so it works under any base URL path


def link_runs(run_ids: Iterable) -> list[str | None]:
    """A link column's values: the Run page of each run id (None where there is no run)."""
    return [RUN_URL.format(int(i)) if pd.notna(i) else None for i in run_ids]


def _link(label: str) -> st.column_config.Column:
    return st.column_config.LinkColumn(label, display_text=r"run\?run=(\d+)", width="small")


def _ms(label: str) -> st.column_config.Column:
    return st.column_config.NumberColumn(label, format="%.3f")


# Shares are fractions in the database and percent with one decimal on screen ("90.6 %"), as the
# KPI tiles, the diagnosis sentences and the trend tooltips print them: a table shows its frame
# through as_percent, which scales these columns by 100 for the "%.1f %%" format.
SHARE_COLUMNS = ("share", "copy_share", "gpu_busy_share", "peak_fraction", "a_share", "b_share",
                 "a_copy_share", "b_copy_share", "compute_fraction", "bandwidth_fraction", "a_roof_fraction",
                 "b_roof_fraction")


def as_percent(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its share columns (SHARE_COLUMNS present in it) in percent."""
    present = [c for c in SHARE_COLUMNS if c in frame.columns]
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") * 100 for c in present}) if present else frame


def _share(label: str, help: str | None = None) -> st.column_config.Column:
    return st.column_config.NumberColumn(label, format="%.1f %%", help=help)


def run_columns() -> dict:
    return {
        "open": _link("run"), "run_id": st.column_config.NumberColumn("run", format="%d"),
        "short_sha": "commit", "subject": "subject", "variant": "variant",
        "tok_per_s": st.column_config.NumberColumn("tok/s", format="%.2f"), "step_ms": _ms("step ms"),
        "copy_share": _share("copy share"), "gpu_busy_share": _share("GPU busy"),
        "committed_at": st.column_config.DatetimeColumn("committed", format="YYYY-MM-DD HH:mm"),
        "imported_at": st.column_config.DatetimeColumn("imported", format="YYYY-MM-DD HH:mm"),
        "source_path": "trace", "engine": "engine", "device": "GPU", "steps": "steps",
    }


_ROOFLINE_HELP = ("the launching op's FLOPs, modelled from its recorded shapes (2·M·N·K a GEMM), over the "
                  "kernel's time; an op's cost is spread over its kernels by their time")
_BOUND_HELP = ("compute: its intensity is past the ridge point (% compute above % BW); memory: below it; "
               "latency: under 10 % of both roofs; communication: a collective (its link has no roof here)")


def kernel_columns(attributed_by: str | None = None) -> dict:
    """The Run page's kernel table: these columns, in this order (its frame has more). With
    `attributed_by` (a graph-kernel attribution's method), the op, line and layers its graph
    kernels were attributed follow the share, in sight (the launcher and source line the trace
    itself gives, cudaGraphLaunch, stay where they are)."""
    columns = {
        "name": st.column_config.TextColumn("kernel", width="large"), "category": "category",
        "calls_per_step": st.column_config.NumberColumn("calls/step", format="%.1f"),
        "mean_us": st.column_config.NumberColumn("mean µs", format="%.2f"),
        "ms_per_step": _ms("ms/step"), "share": _share("share"),
        "gbps": st.column_config.NumberColumn("GB/s", format="%.0f"),
        "peak_fraction": _share("% of peak"),
        "tflops": st.column_config.NumberColumn("TFLOP/s", format="%.3f", help=_ROOFLINE_HELP),
        "tbps": st.column_config.NumberColumn("TB/s", format="%.3f", help="the op's modelled bytes (read + "
                                              "written) over the kernel's time"),
        "compute_fraction": _share("% compute"), "bandwidth_fraction": _share("% BW"),
        "bound": st.column_config.TextColumn("bound", help=_BOUND_HELP),
        "launcher": "launcher op", "source": "source line",
        "calls": "calls", "median_us": st.column_config.NumberColumn("median µs", format="%.2f"),
        "p90_us": st.column_config.NumberColumn("p90 µs", format="%.2f"),
        "bytes_per_call": st.column_config.NumberColumn("bytes/call", format="bytes"),
    }
    if attributed_by:
        columns["name"] = st.column_config.TextColumn("kernel", width="medium")  # room for the attribution
        columns = _insert_after(columns, "share", {
            "graph_op": st.column_config.TextColumn(
                f"op (via {attributed_by})", help="the op that launched this kernel's twin in the graph-off run"),
            "graph_source": st.column_config.TextColumn(f"source line (via {attributed_by})"),
            "graph_layers": st.column_config.TextColumn("layers", help="the layers (calls of the layer function, "
                                                        "from 0 in each step) its graph kernels ran in"),
        })
    return columns


def _insert_after(columns: dict, key: str, more: dict) -> dict:
    """`columns` with `more` placed right after `key`."""
    items = list(columns.items())
    at = [k for k, _ in items].index(key) + 1
    return dict(items[:at] + list(more.items()) + items[at:])


# the kernel diff's columns, in order: what changed and by how much first, the full name last
KERNEL_DIFF_ORDER = ["change", "delta_ms_per_step", "delta_pct", "interval", "short_name", "a_ms_per_step",
                     "b_ms_per_step", "a_calls_per_step", "b_calls_per_step", "p", "a_tflops", "b_tflops", "a_tbps",
                     "b_tbps", "a_roof_fraction", "b_roof_fraction", "category", "launcher", "a_share", "b_share",
                     "name"]


def kernel_diff_columns() -> dict:
    return {
        "change": "change", "name": st.column_config.TextColumn("full name", width="medium"),
        "short_name": st.column_config.TextColumn("kernel", width="medium", help="the name without its namespaces "
                                                  "and template arguments; the full name is the last column"),
        "delta_pct": st.column_config.NumberColumn("Δ %", format="%+.1f %%", help="B against A, of A's ms per step"),
        "interval": st.column_config.TextColumn("95 % interval", help="of Δ %: the profiled steps' spread (and the "
                                                "run-to-run spread where known)"),
        "p": st.column_config.NumberColumn("p", format="%.2g", help="Welch's t test over the profiled steps"),
        "launcher": "launcher op", "category": "category",
        "a_calls_per_step": st.column_config.NumberColumn("A calls/step", format="%.1f"),
        "b_calls_per_step": st.column_config.NumberColumn("B calls/step", format="%.1f"),
        "a_ms_per_step": _ms("A ms/step"), "b_ms_per_step": _ms("B ms/step"),
        "delta_ms_per_step": st.column_config.NumberColumn("Δ ms/step", format="%+.3f"),
        "a_share": _share("A share"), "b_share": _share("B share"),
        "a_tflops": st.column_config.NumberColumn("A TFLOP/s", format="%.3f"),
        "b_tflops": st.column_config.NumberColumn("B TFLOP/s", format="%.3f"),
        "a_tbps": st.column_config.NumberColumn("A TB/s", format="%.3f"),
        "b_tbps": st.column_config.NumberColumn("B TB/s", format="%.3f"),
        "a_roof_fraction": _share("A % of roof"),
        "b_roof_fraction": _share("B % of roof", help="the larger of the kernel's compute and bandwidth fractions "
                                                     "of the datasheet peaks: how close it runs to the roof that binds it"),
    }


def variant_matrix_columns(name_a: str, name_b: str) -> dict:
    return {
        "variant": "variant", "change": "tok/s change",
        "verdict": st.column_config.TextColumn("verdict", help="the step-time change against the runs' noise"),
        "a_tok_per_s": st.column_config.NumberColumn(f"tok/s at {name_a}", format="%.2f"),
        "b_tok_per_s": st.column_config.NumberColumn(f"tok/s at {name_b}", format="%.2f"),
        "a_step_ms": _ms(f"step ms at {name_a}"), "b_step_ms": _ms(f"step ms at {name_b}"),
        "a_copy_share": _share(f"copy share at {name_a}"), "b_copy_share": _share(f"copy share at {name_b}"),
        "run_a": _link(f"run at {name_a}"), "run_b": _link(f"run at {name_b}"),
    }


def filter_rows(table: pd.DataFrame, text: str, columns: Iterable[str]) -> pd.DataFrame:
    """Rows where any of `columns` contains `text` (case-insensitive, plain text, not a regex)."""
    text = text.strip().lower()
    if not text:
        return table
    hit = pd.Series(False, index=table.index)
    for col in columns:
        hit |= table[col].astype("string").str.lower().str.contains(text, regex=False).fillna(False)
    return table[hit]
