"""A run's four headline figures as metric tiles, optionally with the change from another run."""

from __future__ import annotations

import streamlit as st

from .charts import rank_balance_chart, rank_balance_parts
from .labels import format_change, format_number, format_percent


def _points(a: float | None, b: float | None) -> str | None:
    """A share's change in percentage points ('+1.2 pp'), None when either is missing."""
    return None if a is None or b is None else f"{(b - a) * 100:+.1f} pp"


# the copy categories of ingest/traces/categories.py (COPY_CATEGORIES; tests/test_app_run.py checks
# they agree), named here because app/ does not import the trace reader
COPY_CATEGORIES = ("cast", "memcpy")


def label_step_tile(run: dict) -> str:
    """The Step ms tile's label, saying which step it is: timed without the profiler (the
    bundle's timing) or the profiled steps' median, which the diagnosis and the charts use."""
    return "Step ms, no profiler" if run.get("timing_ms_median") is not None else "Step ms, profiled"


def select_rank_figures(run: dict, rank: int, figures: dict) -> dict:
    """The run's row as the tiles read it, for another rank than its first: that rank's profiled
    median step and its copy and busy shares (views.get_rank_figures); tok/s stays the job's."""
    return {**run, "step_ms": figures["step_ms_median"], "step_ms_median": figures["step_ms_median"],
            "copy_share": figures["copy_share"], "gpu_busy_share": figures["gpu_busy_share"],
            "timing_ms_median": None, "timing_ms_p10": None, "timing_ms_p90": None, "rank_shown": rank}


def show_run_kpis(run: dict, baseline: dict | None = None, verdict: str | None = None,
                  step_label: str = "Step ms") -> None:
    """tok/s, step ms, copy-kernel share and GPU busy share; with a baseline, each tile shows the
    change from it (green when better: more tok/s, less step time, less copying). With the
    step-time verdict of the pair (ingest.regress.noise), the tok/s and step tiles say
    when their change is within noise or unsupported, and are then not coloured."""
    base = baseline or {}
    delta = baseline is not None
    # the words of ingest.regress.noise, not imported from it: that loads SciPy and ruptures,
    # which the Run page does not need
    flag = {"within noise": " · within noise", "not enough data": " · not enough data",
            "repeat, within noise": " · repeat, within noise", "too noisy": " · too noisy to judge",
            "below the floor": " · below the floor",
            "changed": "", "regression": "", "improvement": ""}.get(verdict or "", "")
    tiles = st.columns(4)
    tiles[0].metric("Decode tok/s", format_number(run["tok_per_s"]), border=True,
                    delta_color="off" if flag else "normal",
                    delta=format_change(base.get("tok_per_s"), run["tok_per_s"]) + flag if delta else None)
    spread = (f"p10–p90 {run['timing_ms_p10']:.3f}–{run['timing_ms_p90']:.3f} ms without the profiler; "
              if run["timing_ms_p10"] is not None else "")
    tiles[1].metric(step_label, format_number(run["step_ms"], 3), border=True,
                    delta_color="off" if flag else "inverse",
                    delta=format_change(base.get("step_ms"), run["step_ms"]) + flag if delta else None,
                    help=f"{spread}median profiled step {run['step_ms_median']:.3f} ms")
    tiles[2].metric("Copy-kernel share", format_percent(run["copy_share"]), border=True, delta_color="inverse",
                    delta=_points(base.get("copy_share"), run["copy_share"]) if delta else None,
                    help="cast and memcpy kernels' share of all kernel time")
    tiles[3].metric("GPU busy share", format_percent(run["gpu_busy_share"]), border=True, delta_color="off",
                    delta=_points(base.get("gpu_busy_share"), run["gpu_busy_share"]) if delta else None,
                    help="share of the step's wall time in which some kernel ran")
    if run.get("rank_shown") is not None:
        st.caption(f"Rank {run['rank_shown']}'s own figures: its median profiled step, its copy-kernel and GPU busy "
                   "shares. Decode tok/s is the job's, all ranks together.")


def show_rank_balance(rank_stats) -> None:
    """A multi-rank run: each rank's step split into compute, communication and waiting for the
    last rank, the rank the others wait for, and the figures as a table."""
    if rank_stats is None or rank_stats.empty:
        return
    st.subheader("Ranks")
    st.altair_chart(rank_balance_chart(rank_balance_parts(rank_stats)))
    if rank_stats["last_arrivals"].notna().all() and rank_stats["collectives"].max() > 0:
        last = rank_stats.loc[rank_stats["last_arrivals"].idxmax()]
        st.caption(f"Rank {int(last['rank'])} reaches {int(last['last_arrivals'])} of {int(last['collectives'])} "
                   "collectives last (the run's notes above say which rank keeps the others waiting longest: not "
                   "always the one most often last). Waiting is the time from a rank's start of a "
                   "collective to the last rank's start (clocks aligned on the collectives' ends).")
    st.dataframe(rank_stats, hide_index=True, column_config={
        "device_name": st.column_config.TextColumn("GPU"),
        "step_ms_median": st.column_config.NumberColumn("step ms", format="%.3f"),
        "busy_ms_median": st.column_config.NumberColumn("busy ms/step", format="%.3f"),
        "comm_ms_median": st.column_config.NumberColumn("communication ms/step", format="%.3f"),
        "wait_ms_median": st.column_config.NumberColumn("waiting ms/step", format="%.3f"),
        "between_steps_ms": st.column_config.NumberColumn("between steps ms", format="%.3f"),
        "last_arrivals": st.column_config.NumberColumn("last arrivals"),
    })
