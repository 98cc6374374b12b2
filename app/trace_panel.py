"""The Run page's Trace section: the run's own trace files (app/traces.py proves them), one picked
at a time on a multi-rank run, to download or to open in Perfetto (app/perfetto.py)."""

from __future__ import annotations

import re

import streamlit as st
import streamlit.components.v1 as components

from app.markdown_text import format_markdown
from app.perfetto import PERFETTO_INLINE_MB
from app.perfetto import perfetto_button_html
from app.traces import TraceGone, download_name, list_trace_files, read_bytes_later, read_verified_bytes

# why the hand-off opens the whole trace: what the database keeps of a step
WHOLE_TRACE = ("Perfetto opens the whole trace, not one step: stepwatch keeps each step's length and kernels but "
               "not where the step starts in the trace, so it cannot cut a step's window out of the file honestly. "
               "In Perfetto, a step is one ProfilerStep#N slice on the CPU thread (where the trace has them).")


def describe_size(size_bytes: int) -> str:
    """'178 MB', '9.5 MB', '840 kB': a file's size as a caption says it."""
    if size_bytes >= 100e6:
        return f"{size_bytes / 1e6:,.0f} MB"
    return f"{size_bytes / 1e6:.1f} MB" if size_bytes >= 1e6 else f"{size_bytes / 1e3:,.0f} kB"


def pick_rank_file(names: list[str], rank: int) -> str:
    """The trace file of `rank` among a run's files, by the name its writer gives it (SGLang's and
    Kineto's `...-TP-1-...`, `rank1`), else the first."""
    pattern = re.compile(rf"(?:TP|rank)[-_]?{int(rank)}(?!\d)", re.IGNORECASE)
    return next((n for n in names if pattern.search(n)), names[0])


def show_traces(run_id: int, run: dict, rank: int = 0) -> None:
    """The run's trace files that are provably its own: a picker when it has several (one per rank),
    the picked file's download, and its Open in Perfetto button when it is small enough to travel
    with the page (else a line saying why there is none); one line for each file that is gone."""
    traces, gone = list_trace_files(run["trace_root"], run["trace_digests"])
    for why in gone:
        st.caption(format_markdown("Trace no longer available: {}.", why))
    if not traces:
        return
    by_name = {t.name: t for t in traces}
    names = list(by_name)
    name = names[0]
    if len(traces) > 1:  # one file at a time (the rank shown above first), not a button pair per rank
        name = st.selectbox(f"Trace file ({len(traces)}, one per rank)", names, key="trace_file",
                            index=names.index(pick_rank_file(names, rank)),
                            format_func=lambda n: f"{n} ({describe_size(by_name[n].size_bytes)})")
    trace = by_name[name]
    saved_as = download_name(run_id, run["sha"], run["variant"], trace.name)
    st.download_button(format_markdown("Download {}", saved_as), read_bytes_later(trace), file_name=saved_as,
                       mime="application/octet-stream", icon=":material/download:", key=f"trace_{trace.path}")
    if trace.size_bytes <= PERFETTO_INLINE_MB << 20:
        try:
            components.html(perfetto_button_html(read_verified_bytes(trace), f"stepwatch {saved_as}", saved_as),
                            height=46)
        except TraceGone as e:
            st.caption(format_markdown("Trace no longer available: {}.", e))
            return
        st.caption(f"Open in Perfetto sends the trace from this page to ui.perfetto.dev in a new tab (your browser "
                   f"to Perfetto's page, nothing uploaded; traces up to {PERFETTO_INLINE_MB} MB); or open the "
                   "downloaded file there (Open trace file). " + WHOLE_TRACE)
    else:
        st.caption(format_markdown(
            "No Open in Perfetto button: this trace is {}, over the {} MB that the button can carry (it sends the "
            "trace inside this page, a third bigger). Download it and open it at ui.perfetto.dev (Open trace file).",
            describe_size(trace.size_bytes), PERFETTO_INLINE_MB) + " " + WHOLE_TRACE)
