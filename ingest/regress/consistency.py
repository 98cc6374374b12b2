"""Do a run's figures agree? Checked on every import, from figures the analysis already has.

A profile can describe other steps than the ones whose speed was measured (a step marker around
several iterations, prefill inside the window, a tok/s or batch size from another run, traces of
several devices merged into one file); its shares then still add up, and nothing in them says
so. These checks compare what must agree and say, for a run whose figures do not, which figures
disagree, by how much, and the likely reason. They use medians over the profiled steps of the
step's wall time (its first kernel's start to its last kernel's end), its GPU busy time (the
union of its kernels' intervals) and its summed kernel time, the streams the kernels ran on, and
the measured step: batch size x 1000 / the measured tok/s, or, without a tok/s, the step timed
without the profiler.

1. Summed kernel time against the step's wall time: above it only when kernels ran at the same
   time on several streams; that is said (shares of kernel time are then not shares of the step),
   not marked. On one stream kernels run one at a time, so more kernel time than wall time means
   broken timestamps: marked.
2. GPU busy time against the measured step: the GPU cannot work longer in a step than the step
   lasts, so busy time beyond the measured step means the profiled steps are not the measured
   ones: marked.
3. The profiled step against the measured step, as the tok/s each implies: marked beyond
   STEP_TOLERANCE, with the likely reason by direction (the profiler slowed a launch-bound run;
   or time outside the profiled steps' kernels). Not said again when check 2 marked the run.

A GPU step's busy time cannot exceed its wall time here: the wall time is its kernels' extent,
so that comparison is no check (it holds by construction).

Pure functions of plain values: `check_consistency(timeline, ...)` returns a JSON-ready dict.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

# On one stream kernels run one after another; Kineto's timestamps, rounded to the microsecond
# or below, can still make neighbours touch or overlap by a fraction of one. Every single-stream
# trace of tests/data (H200 captures, other projects' traces) sums to at most 1.00x its wall time.
KERNEL_OVERLAP_TOLERANCE = 0.01
# The profiler's per-kernel records cost the GPU a little: on the H200 samples the profiled
# steps' busy time was up to 2.2 % above the step timed without the profiler (fe3ea75 full-pool
# cast: 75.07 against 73.42 ms). 15 % leaves room for that and for two profiled steps against a
# median of twenty; a profile of other steps than the measured ones is off by far more (users
# report kernel time summing to 3x the inter-token latency).
BUSY_TOLERANCE = 0.15
# The profiled step against the measured one, either way: on the H200 samples under CUDA graphs
# they differed by -6 % to +4 %; host work between steps that a measured tok/s includes
# (scheduling, sampling) and the profiler's own overhead move a healthy run further. Beyond 25 %
# the two describe different steps, or a profiler that changed the run: eager runs with stacks
# recorded took 1.62x and 1.69x their timed steps, the host launching kernels at the profiler's pace.
STEP_TOLERANCE = 0.25
# below this share of the profiled step the GPU idles most of it: the host set the pace
HOST_BOUND_BUSY_SHARE = 0.5


@dataclass(frozen=True)
class Check:
    """One comparison: `check` names it, `status` is "ok", "note" (said, not a disagreement) or
    "marked" (the figures disagree); `text` says what was compared and, unless ok, why it matters."""

    check: str
    status: str
    text: str
    numbers: Mapping[str, Any] = field(default_factory=dict)


def _number(x) -> float | None:
    return float(x) if isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) else None


def _ms(x: float) -> str:
    a = abs(x)
    return f"{x:,.{0 if a >= 100 else 1 if a >= 10 else 2 if a >= 1 else 3}f} ms"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:g} %"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _measured_step(tok_per_s, batch_size, timing_ms) -> tuple[float, str, dict] | None:
    """(the measured step in ms, how it was measured in words, its numbers), or None."""
    tok, batch, timing = _number(tok_per_s), _number(batch_size), _number(timing_ms)
    if tok and tok > 0 and batch and batch > 0:
        step = batch * 1000.0 / tok
        return step, f"the {_ms(step)} step that the measured {_rate(tok)} tok/s at batch {batch:g} implies", \
            {"tok_per_s": tok, "batch_size": batch, "measured_step_ms": step}
    if timing and timing > 0:
        return timing, f"the {_ms(timing)} step timed without the profiler", {"measured_step_ms": timing}
    return None


def _kernel_time_check(t: Mapping[str, Any]) -> Check | None:
    kernel, wall, streams = _number(t.get("kernel_ms_median")), _number(t.get("wall_ms_median")), t.get("streams")
    if not kernel or not wall:
        return None
    ratio = kernel / wall
    numbers_ = {"kernel_ms_median": kernel, "wall_ms_median": wall, "ratio": ratio, "streams": streams,
                "tolerance": KERNEL_OVERLAP_TOLERANCE}
    said = f"{_ms(kernel)} of kernel time in a {_ms(wall)} step ({ratio:.2f}x, medians over the steps)"
    if ratio <= 1 + KERNEL_OVERLAP_TOLERANCE:
        return Check("kernel_time", "ok", f"Kernel time fits the step: {said}.", numbers_)
    if streams and streams > 1:
        return Check("kernel_time", "note", f"Kernels overlap on {streams} streams: {said}, so a kernel's share of "
                     "kernel time is not its share of the step.", numbers_)
    return Check("kernel_time", "marked", f"Kernel time exceeds the step on one stream, where kernels run one at a "
                 f"time: {said}, more than the {_pct(KERNEL_OVERLAP_TOLERANCE)} rounding allows; the kernels' "
                 "timestamps cannot be right (events of several devices or runs merged into one file, or a clock "
                 "that jumped).", numbers_)


def _measured_checks(t: Mapping[str, Any], measured: tuple[float, str, dict]) -> list[Check]:
    step, described, base = measured
    busy, wall = _number(t.get("busy_ms_median")), _number(t.get("wall_ms_median"))
    found = []
    if busy is not None:
        ratio = busy / step
        numbers_ = {**base, "busy_ms_median": busy, "ratio": ratio, "tolerance": BUSY_TOLERANCE}
        if ratio > 1 + BUSY_TOLERANCE:
            return [Check("busy_vs_measured", "marked", f"The GPU is busy {_ms(busy)} in each profiled step, "
                          f"{ratio:.2f}x {described}: a GPU cannot work longer in a step than the step lasts, so the "
                          "profiled steps are not the measured ones (a step marker around several iterations, "
                          "prefill in the profiled window, or a tok/s or batch size of another run).", numbers_)]
        found.append(Check("busy_vs_measured", "ok", f"The GPU is busy {_ms(busy)} in each profiled step, {ratio:.2f}x "
                           f"{described} (up to {_pct(BUSY_TOLERANCE)} more is the profiler's own cost).", numbers_))
    if wall is None or wall <= 0:
        return found
    ratio = wall / step
    numbers_ = {**base, "wall_ms_median": wall, "ratio": ratio, "tolerance": STEP_TOLERANCE}
    implied = ""
    if "tok_per_s" in base:
        numbers_["implied_tok_per_s"] = base["batch_size"] * 1000.0 / wall
        implied = f" (it implies {_rate(numbers_['implied_tok_per_s'])} tok/s against {_rate(base['tok_per_s'])})"
    said = f"The profiled step takes {_ms(wall)}{implied}, {ratio:.2f}x {described}"
    if abs(ratio - 1) <= STEP_TOLERANCE:
        found.append(Check("step_vs_measured", "ok", f"{said}.", numbers_))
    elif ratio > 1:
        why = "the profiler slowed the run"
        if busy is not None and busy < HOST_BOUND_BUSY_SHARE * wall:
            why += (f" (the GPU was busy only {_ms(busy)} of each profiled step: the host set the pace, launching "
                    "kernels while the profiler recorded them)")
        found.append(Check("step_vs_measured", "marked", f"{said}, beyond the {_pct(STEP_TOLERANCE)} allowed: {why}. "
                           "Time per step and idle time are the slowed steps'; shares of kernel time still hold.",
                           numbers_))
    else:
        found.append(Check("step_vs_measured", "marked", f"{said}, beyond the {_pct(STEP_TOLERANCE)} allowed: "
                           f"{_ms(step - wall)} of each measured step lies outside the profiled steps' kernels (host "
                           "work between steps such as scheduling and sampling, or a tok/s that counts more than "
                           "decode steps); the kernel figures explain only part of the measured step.", numbers_))
    return found


def check_consistency(timeline: Mapping[str, Any] | None, tok_per_s: float | None = None,
                      batch_size: int | None = None, timing_ms: float | None = None) -> dict:
    """The checks of the module docstring on one rank's timeline figures (ingest/traces/timeline.py)
    and the run's measured tok/s, batch size and unprofiled step time (any may be None):
    {"marked": bool, "summary": the marked checks' sentences or None, "checks": [Check...],
    "unchecked": [what could not be compared, and why]}."""
    checks: list[Check] = []
    unchecked: list[str] = []
    if timeline is None:
        unchecked.append("A CPU-only trace has no GPU timeline: its figures were not checked against one another.")
    else:
        kernel_check = _kernel_time_check(timeline)
        if kernel_check is not None:
            checks.append(kernel_check)
        measured = _measured_step(tok_per_s, batch_size, timing_ms)
        if measured is not None:
            checks += _measured_checks(timeline, measured)
        elif _number(tok_per_s):
            unchecked.append("The measured tok/s was not compared with the profiled steps: the batch size is unknown.")
        else:
            unchecked.append("No measured tok/s (`--tok-per-s`) or unprofiled timing to compare the profiled steps "
                             "with.")
    marked = [c for c in checks if c.status == "marked"]
    return {"marked": bool(marked), "summary": " ".join(c.text for c in marked) or None,
            "checks": [asdict(c) for c in checks], "unchecked": unchecked}
