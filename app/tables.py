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
                 "a_copy_share", "b_copy_share")


def as_percent(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with its share columns (SHARE_COLUMNS present in it) in percent."""
    present = [c for c in SHARE_COLUMNS if c in frame.columns]
    return frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") * 100 for c in present}) if present else frame


def _share(label: str) -> st.column_config.Column:
    return st.column_config.NumberColumn(label, format="%.1f %%")


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


def kernel_columns() -> dict:
    """The Run page's kernel table: these columns, in this order (its frame has more)."""
    return {
        "name": st.column_config.TextColumn("kernel", width="large"), "category": "category",
        "calls_per_step": st.column_config.NumberColumn("calls/step", format="%.1f"),
        "mean_us": st.column_config.NumberColumn("mean µs", format="%.2f"),
        "ms_per_step": _ms("ms/step"), "share": _share("share"),
        "gbps": st.column_config.NumberColumn("GB/s", format="%.0f"),
        "peak_fraction": _share("% of peak"), "launcher": "launcher op", "source": "source line",
        "calls": "calls", "median_us": st.column_config.NumberColumn("median µs", format="%.2f"),
        "p90_us": st.column_config.NumberColumn("p90 µs", format="%.2f"),
        "bytes_per_call": st.column_config.NumberColumn("bytes/call", format="bytes"),
    }


# the kernel diff's columns, in order: what changed and by how much first, the full name last
KERNEL_DIFF_ORDER = ["change", "delta_ms_per_step", "delta_pct", "interval", "short_name", "a_ms_per_step",
                     "b_ms_per_step", "a_calls_per_step", "b_calls_per_step", "p", "category", "launcher", "a_share",
                     "b_share", "name"]


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
