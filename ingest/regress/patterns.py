"""The pattern catalog: rules as data (patterns.toml beside this module, and a user's file), each
a set of conditions on what a run stores and a sentence to say when they hold.

A catalog is parsed from TOML text (`parse_catalog`), checked field by field: every problem is a
PatternError naming the file, the pattern and the field. `find_patterns` then evaluates a catalog
on one run, rows in and findings out, without I/O:

1. Each pattern looks at one subject. "kernel": every row of one rank's kernel table; "step":
   the step's GPU timeline (busy time against the step time, kernel count and median length);
   "host_sync": host calls that wait for the GPU between two launches of one step, and the GPU
   idle time they leave; "communication": communication kernels' time in which no other kernel
   runs. The timeline figures are measured at import (ingest/traces/timeline.py).
2. A pattern's conditions are minimums and maximums on the subject's figures, regexes on a kernel
   row's name, category, launcher, source and launching ops' input dtypes (and on another row's of
   the same category: `elsewhere_input_dtypes`), and `per_layer` (calls per step a whole multiple
   of the layer count). All must hold. A condition on a figure the run does not have (its layer
   count, its workload's live KV bytes, a kernel's bytes per call or input dtypes, a GPU timeline)
   cannot be decided: when no row meets all the conditions but some meet all those that can be
   decided, the pattern is listed as not evaluated, with why, rather than passed over as if it
   had not fired.
3. A pattern that holds gives a finding: its sentence filled in with the subject's figures, the
   kernels involved, and the milliseconds per step at stake (the kernel's ms per step; the step's
   idle time; the idle time after host syncs; the exposed communication). A kernel pattern gives
   one finding per matching row, the largest first, at most MAX_KERNEL_FINDINGS (the last says
   how many more matched). Findings are sorted by the time at stake, largest first.
"""

from __future__ import annotations

import math
import numbers
import re
import string
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import re2

from . import RegressError
from .diagnose import (CAST_BYTES, KV_BYTES, RunFacts, _describe_kernel, _fmt_bytes, _fmt_count, _fmt_ms, _fmt_pct,
                       _fmt_rate, _from_source, _per_layer_words, _sentence_start, _times_per_layer, by_size,
                       column_sum, kernel_rows, shorten_kernel_name, size_key)

DEFAULT_CATALOG = Path(__file__).with_name("patterns.toml")
MAX_KERNEL_FINDINGS = 3  # findings one kernel pattern gives, the largest kernels first
SUBJECTS = ("kernel", "step", "host_sync", "communication")
# A pattern's regexes are RE2's (google-re2): matched in time linear in the text, so a regex from
# a user's --patterns file cannot backtrack for ever ('(a+)+$' on 60 a's and a '!' hung b4995d3's
# `re`); RE2 refuses backreferences and lookarounds, which kernel names never needed.
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.case_sensitive = False
_RE2_OPTIONS.log_errors = False  # its own stderr log: the PatternError's one line says it
_REGEX_FIELDS = ("name", "category", "launcher", "source")  # regexes on a kernel row's own text
# regexes on the launching ops' input dtypes: this row's, and another row's of the same category
_DTYPE_FIELDS = ("input_dtypes", "elsewhere_input_dtypes")
# the number conditions of each subject: field -> (figure it bounds, upper bound of its range)
_LIMITS: dict[str, dict[str, tuple[str, float]]] = {
    "kernel": {"min_calls_per_step": ("calls_per_step", math.inf), "max_calls_per_step": ("calls_per_step", math.inf),
               "min_share": ("share", 1.0), "min_ms_per_step": ("ms_per_step", math.inf),
               "min_bytes_per_call": ("bytes_per_call", math.inf), "max_bytes_per_call": ("bytes_per_call", math.inf),
               "min_live_ratio": ("live_ratio", math.inf), "max_peak_fraction": ("peak_fraction", 1.0)},
    "step": {"max_busy_share": ("busy_share", 1.0), "min_kernels_per_step": ("kernels_per_step", math.inf),
             "max_kernel_us_median": ("kernel_us_median", math.inf)},
    "host_sync": {"min_calls_per_step": ("calls_per_step", math.inf), "min_idle_share": ("idle_share", 1.0)},
    "communication": {"min_exposed_share": ("exposed_share", 1.0), "min_exposed_ms": ("exposed_ms", math.inf)},
}
_FIGURES = {
    "kernel": ("kernel", "calls_per_step", "layers", "per_layer", "share", "ms_per_step", "from_source",
               "bytes_per_call", "live_bytes", "live_ratio", "gbps", "peak_fraction", "input_dtypes", "elsewhere"),
    "step": ("step_ms", "busy_ms", "idle_ms", "busy_share", "idle_share", "kernels_per_step", "kernel_us_median"),
    "host_sync": ("calls", "calls_per_step", "idle_ms", "idle_share", "profiled_step_ms"),
    "communication": ("kernels", "comm_ms", "exposed_ms", "exposed_share", "profiled_step_ms", "streams", "waiting"),
}


def _fmt_us(us: float) -> str:
    return f"{us:,.0f} us" if us >= 100 else f"{us:.1f} us" if us >= 10 else f"{us:.2f} us"


def _fmt_ratio(x: float) -> str:
    return f"{x:,.0f}x" if x >= 10 else f"{x:.1f}x"


FORMATS: dict[str, Callable[[float], str]] = {"ms": _fmt_ms, "us": _fmt_us, "pct": _fmt_pct, "bytes": _fmt_bytes,
                                              "count": _fmt_count, "rate": _fmt_rate, "x": _fmt_ratio}


class PatternError(RegressError):
    """A catalog that cannot be used; the message names the file, the pattern and the field."""


@dataclass(frozen=True)
class Pattern:
    id: str
    subject: str
    sentence: str
    regexes: Mapping[str, Any]  # kernel row field -> RE2 regex (re2._Regexp) searched in it
    limits: Mapping[str, float]  # condition field (min_share, ...) -> bound
    per_layer: bool = False
    origin: str = ""  # "FILE: pattern N (id)", for messages


# ---------------------------------------------------------------------------------------------
# Reading a catalog


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _check_sentence(where: str, subject: str, sentence) -> str:
    if not isinstance(sentence, str) or not sentence.strip():
        raise PatternError(f"{where} field 'sentence' must be a non-empty string")
    try:
        pieces = list(string.Formatter().parse(sentence))
    except ValueError as e:
        raise PatternError(f"{where} field 'sentence' is not a template ({e}): write a literal brace as {{{{ or }}}}") \
            from None
    for _, figure, spec, conversion in pieces:
        if figure is None:
            continue
        if figure not in _FIGURES[subject]:
            raise PatternError(f"{where} field 'sentence' names {{{figure}}}, not a figure of a {subject} pattern "
                               f"(its figures: {', '.join(_FIGURES[subject])})")
        if conversion or (spec and spec not in FORMATS):
            raise PatternError(f"{where} field 'sentence': {{{figure}:{spec}}} has no format {spec!r} "
                               f"(formats: {', '.join(FORMATS)})")
    return sentence


def _read_pattern(origin: str, index: int, body, seen: dict[str, int]) -> Pattern:
    where = f"{origin}: pattern {index}"
    if not isinstance(body, dict):
        raise PatternError(f"{where} is not a table (write it as [[pattern]] with fields)")
    pid = body.get("id")
    if not isinstance(pid, str) or not re.fullmatch(r"[a-z][a-z0-9-]*", pid):
        raise PatternError(f"{where} field 'id' must be a lower-case word (letters, digits, '-')")
    if pid in seen:
        raise PatternError(f"{where} field 'id': {pid!r} is pattern {seen[pid]}'s already")
    seen[pid] = index
    where = f"{where} ({pid})"
    subject = body.get("subject")
    if subject not in SUBJECTS:
        raise PatternError(f"{where} field 'subject' must be one of {', '.join(SUBJECTS)}")
    regex_fields = _REGEX_FIELDS + _DTYPE_FIELDS if subject == "kernel" else ()
    known = {"id", "subject", "sentence", *_LIMITS[subject], *regex_fields, *(("per_layer",) if regex_fields else ())}
    unknown = sorted(set(body) - known)
    if unknown:
        raise PatternError(f"{where} has unknown field(s) {', '.join(unknown)} (a {subject} pattern takes: "
                           f"{', '.join(sorted(known - {'id', 'subject', 'sentence'}))})")
    regexes = {}
    for key in regex_fields:
        if key in body:
            if not isinstance(body[key], str):
                raise PatternError(f"{where} field '{key}' must be a string (a regex)")
            try:
                regexes[key] = re2.compile(body[key], _RE2_OPTIONS)
            except re2.error as e:
                problem = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else e
                raise PatternError(f"{where} field '{key}' is not a valid regex ({problem}; RE2 syntax)") from None
    limits = {}
    for key, (_, top) in _LIMITS[subject].items():
        if key in body:
            value = body[key]
            if not _is_number(value) or not 0 <= value <= top:
                bound = "from 0 to 1" if top == 1.0 else "of 0 or more"
                raise PatternError(f"{where} field '{key}' must be a number {bound}")
            limits[key] = float(value)
    per_layer = body.get("per_layer", False)
    if not isinstance(per_layer, bool):
        raise PatternError(f"{where} field 'per_layer' must be true or false")
    if not regexes and not limits and not per_layer:
        raise PatternError(f"{where} has no condition: it would fire on every run")
    return Pattern(pid, subject, _check_sentence(where, subject, body.get("sentence")), regexes, limits, per_layer,
                   where)


def parse_catalog(text: str, origin: str) -> list[Pattern]:
    """The patterns of one catalog file's text (`origin` names the file in messages)."""
    try:
        body = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PatternError(f"{origin}: not valid TOML ({e})") from None
    other = sorted(set(body) - {"pattern"})
    if other:
        raise PatternError(f"{origin}: unknown table or field(s) {', '.join(other)} "
                           "(a catalog holds [[pattern]] tables)")
    patterns = body.get("pattern")
    if not isinstance(patterns, list) or not patterns:
        raise PatternError(f"{origin}: no [[pattern]] tables")
    seen: dict[str, int] = {}
    return [_read_pattern(origin, i, p, seen) for i, p in enumerate(patterns, 1)]


def combine_catalogs(builtin: list[Pattern], user: list[Pattern]) -> list[Pattern]:
    """The built-in patterns with the user's: a user pattern replaces the built-in one of its id."""
    replaced = {p.id: p for p in user}
    return [replaced.pop(p.id, p) for p in builtin] + list(replaced.values())


# ---------------------------------------------------------------------------------------------
# Evaluating a catalog on one run


def _number(x) -> float | None:
    return float(x) if _is_number(x) else None


def _render(pattern: Pattern, figures: Mapping[str, Any]) -> str:
    out = []
    for literal, figure, spec, _ in string.Formatter().parse(pattern.sentence):
        out.append(literal)
        if figure is None:
            continue
        value = figures.get(figure)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            out.append("unknown")
        elif spec:
            out.append(FORMATS[spec](float(value)))
        else:
            out.append(_fmt_count(value) if isinstance(value, float) else str(value))
    return _sentence_start("".join(out))


def _within(pattern: Pattern, figures: Mapping[str, Any]) -> bool:
    """Whether every min_/max_ condition holds (a missing figure fails it)."""
    for key, bound in pattern.limits.items():
        value = _number(figures.get(_LIMITS[pattern.subject][key][0]))
        if value is None or (value < bound if key.startswith("min_") else value > bound):
            return False
    return True


def _finding(pattern: Pattern, figures: Mapping[str, Any], stake_ms: float, kernels: list[str], **extra) -> dict:
    """A finding: the sentence, what is at stake, the kernels, and the numeric figures it was made of."""
    numbers_ = {k: _number(v) for k, v in figures.items()
                if v is None or isinstance(v, numbers.Real) and not isinstance(v, bool)}
    return {"pattern": pattern.id, "subject": pattern.subject, "text": _render(pattern, figures),
            "ms_per_step": float(stake_ms), "kernels": kernels, "numbers": numbers_, **extra}


def live_kv_bytes(workload: Mapping[str, Any] | None, batch_size: int | None = None) -> float | None:
    """Bytes of the KV rows a decode step reads in one layer, read as FP8 and written as BF16:
    the batch's active rows (active_rows, else batch x (context + 1)) x kv_dim x 3; None unknown."""
    w = workload or {}
    kv_dim, active = _number(w.get("kv_dim")), _number(w.get("active_rows"))
    batch, context = _number(batch_size or w.get("batch_size")), _number(w.get("context"))
    if active is None and batch and context is not None:
        active = batch * (context + 1)
    return active * kv_dim * (KV_BYTES + CAST_BYTES) if active and kv_dim else None


def _text(value: Any) -> str:
    """A text cell as text: a missing one (None, NaN) as ""."""
    return "" if value is None or isinstance(value, float) and math.isnan(value) else str(value)


def _elsewhere(pattern: Pattern, index: int, rows: list[dict[str, Any]]) -> str | None:
    """"bfloat16 (6 other gemm kernels, 4.92 ms per step)": the other rows of the category of row
    `index` whose input dtypes match the pattern's elsewhere_input_dtypes; None when none does."""
    regex = pattern.regexes.get("elsewhere_input_dtypes")
    if regex is None:
        return None
    category = rows[index]["category"]
    hits = [r for i, r in enumerate(rows) if i != index and r["category"] == category
            and (text := _text(r.get("input_dtypes"))) and regex.search(text) is not None]
    if not hits:
        return None
    names = " | ".join(sorted({r["input_dtypes"] for r in hits}))
    n = len(hits)
    return (f"{names} ({n} other {category} kernel{'s' if n > 1 else ''}, "
            f"{_fmt_ms(column_sum(hits, 'ms_per_step'))} per step)")


def _kernel_figures(row: Mapping[str, Any], facts: RunFacts, live: float | None,
                    elsewhere: str | None) -> dict[str, Any]:
    calls = float(row["calls_per_step"])
    times = _times_per_layer(calls, facts.layers)
    bytes_per_call = _number(row.get("bytes_per_call"))
    return {"kernel": _describe_kernel(row), "calls_per_step": calls, "layers": facts.layers,
            "per_layer": _per_layer_words(times) if times else None, "share": _number(row.get("share")),
            "ms_per_step": float(row["ms_per_step"]), "from_source": _from_source(row),
            "bytes_per_call": bytes_per_call, "live_bytes": live,
            "live_ratio": bytes_per_call / live if bytes_per_call is not None and live else None,
            "gbps": _number(row.get("gbps")), "peak_fraction": _number(row.get("peak_fraction")),
            "input_dtypes": row.get("input_dtypes") or None, "elsewhere": elsewhere}


_UNKNOWN = {"layers": "the layer count is unknown (import with --layers N)",
            "input_dtypes": "input dtypes are unknown (a CUDA-graph replay, a kernel launched outside an op, or a "
                            "trace without record_shapes)",
            "live_bytes": "the live KV bytes are unknown (a bundle's workload gives kv_dim and the active rows)",
            "bytes_per_call": "bytes per call are unknown (a CUDA-graph replay, a kernel launched outside an op, or "
                              "a trace without record_shapes)"}


def _kernel_holds(pattern: Pattern, figures: Mapping[str, Any]) -> bool | set[str]:
    """False when a condition fails on this row; True when all hold; else the figures the run
    lacks to decide the rest (keys of _UNKNOWN)."""
    unknown: set[str] = set()
    if any(k in pattern.regexes for k in _DTYPE_FIELDS):
        dtypes = figures["input_dtypes"]
        if dtypes is None:
            unknown.add("input_dtypes")
        else:
            if "input_dtypes" in pattern.regexes and not pattern.regexes["input_dtypes"].search(dtypes):
                return False
            if "elsewhere_input_dtypes" in pattern.regexes and figures["elsewhere"] is None:
                return False
    if pattern.per_layer:
        if not figures["layers"]:
            unknown.add("layers")
        elif figures["per_layer"] is None:
            return False
    for key, bound in pattern.limits.items():
        figure = _LIMITS["kernel"][key][0]
        value = _number(figures.get(figure))
        if value is None and figure in ("bytes_per_call", "live_ratio"):
            unknown |= {k for k in ("bytes_per_call", "live_bytes") if figures[k] is None}
        elif value is None or (value < bound if key.startswith("min_") else value > bound):
            return False
    return unknown or True


def _kernel_findings(pattern: Pattern, facts: RunFacts, rows: list[dict[str, Any]]) -> tuple[list[dict], str | None]:
    """One finding per kernel row (`rows`: facts.kernels' rows, kernel_rows) that meets every
    condition. When none does but some meet every condition the run can decide, the pattern is
    not evaluated, and the reason is returned."""
    keep = [i for i, row in enumerate(rows)
            if all(regex.search(_text(row.get(key))) is not None
                   for key, regex in pattern.regexes.items() if key in _REGEX_FIELDS)]
    live = live_kv_bytes(facts.workload, facts.batch_size)
    matched, undecided = [], []
    for i in sorted(keep, key=lambda i: size_key(rows[i])):
        row = rows[i]
        figures = _kernel_figures(row, facts, live, _elsewhere(pattern, i, rows))
        holds = _kernel_holds(pattern, figures)
        if holds is True:
            matched.append(_finding(pattern, figures, figures["ms_per_step"], [str(row["name"])]))
        elif holds:
            undecided.append(holds)
    if len(matched) > MAX_KERNEL_FINDINGS:
        more = len(matched) - MAX_KERNEL_FINDINGS
        matched = matched[:MAX_KERNEL_FINDINGS]
        matched[-1]["more_kernels"] = more
    if matched or not undecided:
        return matched, None
    n, lacking = len(undecided), set().union(*undecided)
    return [], (f"{n} kernel{'s' if n > 1 else ''} meet{'' if n > 1 else 's'} its other conditions, but "
                + "; ".join(_UNKNOWN[k] for k in _UNKNOWN if k in lacking))


def _step_findings(pattern: Pattern, facts: RunFacts, t: Mapping[str, Any]) -> list[dict]:
    busy = _number(t.get("busy_ms_median"))
    if busy is None or not facts.step_ms:
        return []
    step = float(facts.step_ms)
    idle = max(step - busy, 0.0)
    # the kernels the host launched one by one: those replayed from a graph cost no launch
    # (timelines stored before the count existed give every kernel)
    launched = "launched_per_step" if "launched_per_step" in t else "kernels_per_step"
    median = "launched_us_median" if "launched_us_median" in t else "kernel_us_median"
    figures = {"step_ms": step, "busy_ms": busy, "idle_ms": idle, "busy_share": busy / step,
               "idle_share": idle / step, "kernels_per_step": _number(t.get(launched)),
               "kernel_us_median": _number(t.get(median))}
    return [_finding(pattern, figures, idle, [])] if _within(pattern, figures) else []


def _host_sync_findings(pattern: Pattern, t: Mapping[str, Any]) -> list[dict]:
    profiled, idle = _number(t.get("wall_ms_median")), _number(t.get("host_sync_idle_ms_per_step")) or 0.0
    syncs = t.get("host_syncs") or []
    if not profiled or not syncs:
        return []
    calls = ", ".join(f"`{s['name']}` ({_fmt_count(round(s['calls_per_step'], 1))} a step)" for s in syncs)
    figures = {"calls": calls, "calls_per_step": _number(t.get("host_syncs_per_step")), "idle_ms": idle,
               "idle_share": idle / profiled, "profiled_step_ms": profiled}
    if not _within(pattern, figures):
        return []
    return [_finding(pattern, figures, idle, [], host_calls=[{k: s[k] for k in ("name", "calls_per_step",
                                                                              "idle_ms_per_step")} for s in syncs])]


def _communication_findings(pattern: Pattern, rows: list[dict[str, Any]], t: Mapping[str, Any],
                            waiting: tuple[int, float, int] | None) -> list[dict]:
    profiled, exposed = _number(t.get("wall_ms_median")), _number(t.get("comm_exposed_ms_median"))
    comm = by_size([row for row in rows if row["category"] == "communication"])
    if not profiled or exposed is None or not comm:
        return []
    streams = t.get("streams") or 1
    names = [str(row["name"]) for row in comm]
    said = ", ".join(f"`{shorten_kernel_name(n)}`" for n in names[:3]) + (f" and {len(names) - 3} more"
                                                                           if len(names) > 3 else "")
    figures = {"kernels": said, "comm_ms": _number(t.get("comm_ms_median")), "exposed_ms": exposed,
               "exposed_share": exposed / profiled, "profiled_step_ms": profiled,
               "streams": "all kernels on one stream" if streams == 1 else f"kernels on {streams} streams",
               "waiting": ""}
    if waiting is not None:
        rank, wait_ms, last_rank = waiting
        if last_rank != rank and wait_ms > 0:
            figures["waiting"] = (f"; of that, rank {rank} waits {_fmt_ms(min(wait_ms, exposed))} a step in "
                                  f"collectives that rank {last_rank} reaches last: balancing the ranks wins that, "
                                  "overlap does not")
    return [_finding(pattern, figures, exposed, names)] if _within(pattern, figures) else []


def find_patterns(catalog: list[Pattern], facts: RunFacts, timeline: Mapping[str, Any] | None,
                  waiting: tuple[int, float, int] | None = None) -> dict:
    """The catalog's findings on one run: `facts` (its kernel rows of one rank, layer count,
    workload, step time), `timeline` (that rank's GPU timeline figures; None for a CPU-only trace)
    and `waiting` ((this rank, its median wait per step in collectives in ms, the rank the others
    wait for), for a multi-rank run). Returns {"findings": [...], "not_evaluated": [{"pattern",
    "why"}]} (module docstring); each finding is {pattern, subject, text, ms_per_step, kernels,
    numbers}."""
    findings: list[dict] = []
    not_evaluated: list[dict] = []
    rows = kernel_rows(facts.kernels)
    for pattern in catalog:
        if pattern.subject == "kernel":
            found, why = _kernel_findings(pattern, facts, rows)
        elif timeline is None:
            found, why = [], "a CPU-only trace has no GPU timeline"
        elif pattern.subject == "step":
            found, why = _step_findings(pattern, facts, timeline), None
        elif pattern.subject == "host_sync":
            found, why = _host_sync_findings(pattern, timeline), None
        else:
            found, why = _communication_findings(pattern, rows, timeline, waiting), None
        findings += found
        if why:
            not_evaluated.append({"pattern": pattern.id, "why": why})
    findings.sort(key=lambda f: -f["ms_per_step"])
    return {"findings": findings, "not_evaluated": not_evaluated}
