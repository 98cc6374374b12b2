"""The Run a benchmark form's fields, engine by engine; returns what was entered as a FormInput
(checked later by app.job_form.plan_jobs, never here)."""

from __future__ import annotations

import streamlit as st

from ingest.limits import MAX_REPEATS, MAX_SWEEP_POINTS
from ingest.runs.spec import WORKLOAD_MAXIMA as MAX
from ingest.runs.spec import Config
from kernels.names import KV_STRATEGIES
from kernels.names import PRESET_NAMES as PRESETS

from .job_form import FormInput

MODES = {"eager": False, "CUDA graph": True}
SWEEP_HELP = ("one value, or several separated by commas for a sweep (one run a combination, each of its own "
              "series, tied by a sweep id; at most {points} combinations, MAX_SWEEP_POINTS in ingest/limits.py)")


def _listed(column, label: str, default: str, key: str, help_text: str = "") -> str:
    """A workload field that takes one value or a list ("1, 4, 16"): the text as entered (app.job_form parses it)."""
    return column.text_input(label, value=default, key=key, help=(help_text + " " if help_text else "")
                             + SWEEP_HELP.format(points=MAX_SWEEP_POINTS))


def _common(config: Config) -> dict:
    left, middle, right = st.columns(3)
    hosts = ["local"] + sorted(h for h in config.hosts if h != "local")
    return dict(host=left.selectbox("Host", hosts, help="hosts come from the config file ($STEPWATCH_CONFIG)",
                                           key="host"),
                device=middle.radio("Device", ["cpu", "cuda"], horizontal=True, key="device"),
                timeout_s=float(right.number_input("Timeout (s)", min_value=10, max_value=86400, value=3600)))


def _commits() -> dict:
    left, middle, right = st.columns([3, 1, 1])
    return dict(commits=left.text_input("Commit or range", placeholder="HEAD, a sha, a tag, or A..B (one job a commit)",
                                              key="commits"),
                every=int(middle.number_input("Range: every K-th commit", min_value=1, value=1, key="every")),
                repeat=int(right.number_input(
                    "Repeats", min_value=1, max_value=MAX_REPEATS, value=1, key="repeat",
                    help="runs of each job, each its own process: a commit's repeats give the run-to-run spread "
                         f"its verdicts need (at most {MAX_REPEATS}, MAX_REPEATS in ingest/limits.py)")))


def ask_reference(config: Config) -> FormInput:
    common = _common(config)
    repo = st.text_input("Repository", placeholder="this checkout (stepwatch), or a name from the config's [repos]",
                         key="repo")
    commits = _commits()
    left, right = st.columns(2)
    variants = left.multiselect("KV strategies (variants)", KV_STRATEGIES, default=["full-pool-cast"], key="kv")
    modes = right.multiselect("Execution", list(MODES), default=["eager"], key="modes")
    cols = st.columns(4)
    workload = dict(
        preset=cols[0].selectbox("Preset", list(PRESETS), index=list(PRESETS).index("tiny"), key="preset"),
        batch_size=_listed(cols[1], "Batch sizes", "1", "batch_sizes", "e.g. 1, 4, 16:"),
        context=_listed(cols[2], "Context tokens (blank: the preset's)", "", "contexts",
                        f"at most {MAX['context']:,} each;"),
        profile_steps=int(cols[3].number_input("Profiled steps", min_value=1, max_value=MAX["profile_steps"], value=3,
                                                 key="profile_steps")))
    return FormInput("reference", repo=repo.strip(), variants=tuple(variants),
                     cuda_graph=tuple(MODES[m] for m in modes), workload=workload, **common, **commits)


def ask_sglang(config: Config) -> FormInput:
    common = _common(config)
    repos = sorted(config.repos)
    if not repos:
        st.caption("The config file names no [repos]; the sglang engine needs one (set $STEPWATCH_CONFIG).")
    repo = st.selectbox("Repository", repos, index=0 if repos else None)
    commits = _commits()
    left, right = st.columns(2)
    variants = left.multiselect("Variants", ["unpatched"] + sorted(config.patches), default=["unpatched"])
    modes = right.multiselect("Execution", list(MODES), default=["CUDA graph"])
    cols = st.columns(4)
    workload = dict(
        model_path=cols[0].text_input("Model path").strip(),
        load_format=cols[1].text_input("Load format", placeholder="e.g. dummy").strip(),
        kv_cache_dtype=cols[2].text_input("KV cache dtype", placeholder="e.g. fp8_e4m3").strip(),
        attention_backend=cols[3].text_input("Attention backend").strip(),
        batch_size=_listed(cols[0], "Batch sizes", "1", "batch_sizes", "e.g. 1, 8, 32:"),
        input_len=_listed(cols[1], "Input tokens", "256", "input_lens", "e.g. 1024, 4096:"),
        output_len=_listed(cols[2], "Output tokens", "32", "output_lens"),
        tp=int(cols[3].number_input("Tensor parallel", min_value=1, max_value=MAX["tp"], value=1)),
        profile_steps=int(cols[0].number_input("Profiled steps", min_value=1, max_value=MAX["profile_steps"], value=3)),
        extra_args=st.text_input("Extra server flags", placeholder="--flag --flag=value").split())
    return FormInput("sglang", repo=repo or "", variants=tuple(variants), cuda_graph=tuple(MODES[m] for m in modes),
                     workload=workload, **common, **commits)


def ask_import(config: Config) -> FormInput:
    common = _common(config)
    roots = ", ".join(config.import_roots)
    where = config.source or "no config file ($STEPWATCH_CONFIG)"
    st.caption(f"The import engine reads only under these directories ([imports] roots in {where}): {roots}"
               if roots else f"No [imports] roots are set in {where}: the import engine reads nothing "
               "until the config names the directories it may read.")
    path = st.text_input("Trace, directory of per-rank traces, or bundle", placeholder="/path/to/trace.json.gz",
                         key="path")
    left, right = st.columns(2)
    return FormInput("import", path=path, repo=left.text_input("Repository (optional)").strip(),
                     commits=right.text_input("Commit it measured (optional)").strip(), **common)
