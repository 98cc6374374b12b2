"""How tables look: column labels, units and formats, links to runs, and the kernel table's
text filter."""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import streamlit as st

from ingest.regress.diagnose import shorten_kernel_name

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
                 "b_roof_fraction", "compute_fraction_shown", "bw_fraction_shown")


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
                  "kernel's time; an op's cost is spread over its kernels by their time; blank: no FLOPs "
                  "(a copy or cast) or no cost model")
_TBPS_HELP = ("bytes read and written per second: the op's modelled bytes where it has a cost model, else the "
              "bytes the trace or the bundle records for it (a memcpy's, a cast's known size); blank: unknown")
_BW_HELP = "the TB/s as a share of the datasheet's HBM bandwidth (blank for a copy to or from the host)"
_BOUND_HELP = ("compute: its intensity is past the ridge point (% compute above % BW); memory: below it; "
               "latency: under 10 % of both roofs; communication: a collective (its link has no roof here)")
# printf formats that keep three significant digits, so a small rate is never printed as "0.000"
RATE_FORMAT = "%.3g"
CALLS_FORMAT = "%.4g"  # 78 calls per step, not "78.0"; 1.5 where a kernel runs every other step


def build_kernel_table(kernels: pd.DataFrame) -> pd.DataFrame:
    """The Run page's kernel table from Store.list_kernels' frame: its share columns in percent
    (as_percent), and one figure a column where the store has two sources: `tbps_shown` and
    `bw_fraction_shown` are the modelled TB/s and fraction of HBM bandwidth where the op has a
    cost model, else the recorded bytes' (gbps / 1000, peak_fraction), and `bytes_per_call_shown`
    the bytes they rest on (so that bytes/call over mean µs is the TB/s shown); `tflops_shown` and
    `compute_fraction_shown` are blank (NaN) for a kernel without FLOPs (a cast's 0 TFLOP/s is
    no rate); `short_name` is the name without namespaces and template arguments."""
    table = kernels.copy()
    table["short_name"] = [shorten_kernel_name(str(n)) for n in table["name"]]
    modelled = pd.to_numeric(table["tbps"], errors="coerce")
    has_model = modelled.notna() & (modelled > 0)
    recorded = pd.to_numeric(table["gbps"], errors="coerce") / 1e3
    table["tbps_shown"] = modelled.where(has_model, recorded)
    table["bytes_per_call_shown"] = pd.to_numeric(table["model_bytes_per_call"], errors="coerce").where(
        has_model, pd.to_numeric(table["bytes_per_call"], errors="coerce"))
    table["bw_fraction_shown"] = pd.to_numeric(table["bandwidth_fraction"], errors="coerce").where(
        has_model, pd.to_numeric(table["peak_fraction"], errors="coerce"))
    flops = pd.to_numeric(table["tflops"], errors="coerce")
    table["tflops_shown"] = flops.where(flops > 0)
    table["compute_fraction_shown"] = pd.to_numeric(table["compute_fraction"], errors="coerce").where(flops > 0)
    return as_percent(table)


def kernel_columns(attributed_by: str | None = None) -> dict:
    """The Run page's kernel table (build_kernel_table's frame): these columns, in this order
    (its frame has more). What a kernel costs and how close it runs to its roofs first, so that
    they are in sight at 1280 px; where it comes from, its spread and its full name after. With
    `attributed_by` (a graph-kernel attribution's method), the op, line and layers its graph
    kernels were attributed follow the share, in sight (a graph replay's kernels have no op shapes,
    so their rates are mostly blank) (the launcher and source line the trace
    itself gives, cudaGraphLaunch, stay where they are)."""
    columns = {
        "short_name": st.column_config.TextColumn("kernel", width="medium", help="the name without its namespaces "
                                                  "and template arguments; the full name is the last column"),
        "share": _share("share"), "ms_per_step": _ms("ms/step"),
        "calls_per_step": st.column_config.NumberColumn("calls/step", format=CALLS_FORMAT),
        "mean_us": st.column_config.NumberColumn("mean µs", format="%.2f"),
        "tflops_shown": st.column_config.NumberColumn("TFLOP/s", format=RATE_FORMAT, help=_ROOFLINE_HELP),
        "tbps_shown": st.column_config.NumberColumn("TB/s", format=RATE_FORMAT, help=_TBPS_HELP),
        "compute_fraction_shown": _share("% compute", help="the TFLOP/s as a share of the datasheet's peak for the "
                                         "op's input type"),
        "bw_fraction_shown": _share("% BW", help=_BW_HELP),
        "bound": st.column_config.TextColumn("bound", help=_BOUND_HELP),
        "category": "category", "launcher": "launcher op", "source": "source line",
        "calls": st.column_config.NumberColumn("calls", format="%d"),
        "median_us": st.column_config.NumberColumn("median µs", format="%.2f"),
        "p90_us": st.column_config.NumberColumn("p90 µs", format="%.2f"),
        "bytes_per_call_shown": st.column_config.NumberColumn("bytes/call", format="bytes", help="the bytes the "
                                                              "TB/s rests on: modelled, else recorded"),
        "name": st.column_config.TextColumn("full name", width="large"),
    }
    if attributed_by:
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
