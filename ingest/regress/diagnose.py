"""Short sentences with their numbers about a run, a change between two runs, or a patch.

Each finding is a `Finding(kind, text, numbers, kernel)`: `text` is one plain sentence (Markdown
backticks around code locations), `numbers` holds every figure the sentence quotes under a name
with its unit, so the dashboard can lay them out and a Markdown report can print the text.

For a run: which kernels take most of the step; calls per step against the layer count ("once
per layer"); bytes per call against the device's peak bandwidth; bytes per call against the
workload's KV pool and weight matrices; a dtype cast of data that does not change between steps;
and the step time and tok/s that would remain without the kernel. For a change: the headline
metric's move at the commit and the kernels that explain it. For a patched/unpatched pair: what
the patch adds, removes and changes, and whether it still helps.

Pure functions of plain values and per-kernel tables (columns as stepwatch stores them:
name, category, launcher, source, calls_per_step, ms_per_step, bytes_per_call, gbps,
peak_fraction): a DataFrame read from the database, or an import's columnar table
(ingest/traces/table.py, anything with `columns` and `to_dicts()`), so that the import's
diagnosis loads no pandas. A run's findings read its rows as dicts (`kernel_rows`).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from . import RegressError
from .explain import Explanation, explain_change

MATCH_TOLERANCE = 0.05  # bytes per call within 5 % of a pool or weight matrix "is" that tensor
WEIGHT_BYTES = 2  # weights are taken as BF16
KV_BYTES = 1  # the KV pool is taken as FP8
CAST_BYTES = 2  # and cast to BF16
_NEEDED = ("name", "category", "launcher", "source", "calls_per_step", "ms_per_step", "bytes_per_call")
# A step whose kernels add up to less than this share of it waits on the host, not on a kernel: said first
HOST_BOUND_KERNEL_SHARE = 0.20
# A kernel name in a sentence is cut past this many characters (a Tensile GEMM's name runs to 600)
MAX_SHORT_NAME_CHARS = 60
# Without the kernel a step would be less than this much shorter: it does not set the pace
NEGLIGIBLE_SPEEDUP = 1.01
_GRAPH_LAUNCHERS = re.compile(r"(cuda|hip)GraphLaunch")
_TIMES = {1: "once", 2: "twice"}


@dataclass(frozen=True)
class Finding:
    """One sentence and the numbers it quotes. `kind` says which rule made it (summary,
    per_layer, bandwidth, no_bytes, kv_pool, weight_matrix, static_cast, without_kernel,
    change, change_kernel, unexplained, patch, patch_kernel); `kernel` is the full kernel name
    the sentence is about, if any."""

    kind: str
    text: str
    numbers: Mapping[str, Any] = field(default_factory=dict)
    kernel: str | None = None

    def __post_init__(self):  # plain Python values (no numpy scalars), so that asdict() serialises
        plain = {k: v.item() if hasattr(v, "item") and not isinstance(v, str) else v for k, v in self.numbers.items()}
        object.__setattr__(self, "numbers", plain)


@dataclass(frozen=True, eq=False)
class RunFacts:
    """What diagnosis needs to know about one run.

    `step_ms` is the step time to reason about (the clean timing median when the run has one;
    the profiled steps are slower); `kernels` holds one rank's per-kernel rows, whose ms per step
    come from the profiled steps. One basis for shares: a kernel's share is its `share` column
    (of all kernel time, as the kernel table and the copy-kernel share count it); a kernel's
    weight in the step is its ms per step over `profiled_step_ms` (the profiled steps' median),
    never over the timed step, which the profiler did not slow down."""

    step_ms: float
    kernels: Any  # one rank's kernel rows: a DataFrame, or a table with `columns` and `to_dicts()`
    profiled_step_ms: float | None = None
    tok_per_s: float | None = None
    batch_size: int | None = None
    layers: int | None = None
    device_name: str | None = None
    peak_gbps: float | None = None
    workload: Mapping[str, Any] | None = None
    commit: str | None = None
    variant: str | None = None
    kernels_from_cpu_ops: bool = False  # a CPU-only trace: its "kernels" are the host's ops


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def facts_from_record(record, rank: int | None = None) -> RunFacts:
    """RunFacts from an imported run (`ingest.traces.importer.prepare_import`'s RunRecord, or any object
    with its attribute names): the timing median as the step time when there is one, and the
    rows of `rank` (default: the lowest rank)."""
    kernels = record.kernel_stats
    if "rank" in kernels.columns and len(kernels):
        kernels = kernels[kernels["rank"] == (kernels["rank"].min() if rank is None else rank)]
        if hasattr(kernels, "reset_index"):  # a DataFrame's rows numbered afresh
            kernels = kernels.reset_index(drop=True)
    timing = getattr(record, "timing_ms_median", None)
    step_ms = timing if _is_number(timing) and timing > 0 else record.step_ms_median
    workload = getattr(record, "workload", None) or {}
    return RunFacts(
        step_ms=step_ms, kernels=kernels, tok_per_s=getattr(record, "tok_per_s", None),
        profiled_step_ms=record.step_ms_median,
        batch_size=getattr(record, "batch_size", None) or workload.get("batch_size"),
        layers=getattr(record, "layers", None) or workload.get("layers"),
        device_name=getattr(record, "device_name", None), peak_gbps=getattr(record, "peak_gbps", None),
        workload=workload, commit=getattr(record, "commit", None), variant=getattr(record, "variant", None),
        kernels_from_cpu_ops=bool(getattr(record, "kernels_from_cpu_ops", False)),
    )


# ---------------------------------------------------------------------------------------------
# Formatting


def _fmt_ms(ms: float) -> str:
    a = abs(ms)
    digits = 0 if a >= 100 else 1 if a >= 10 else 2 if a >= 1 else 3
    return f"{ms:,.{digits}f} ms"


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            v = n / size
            return f"{v:,.0f} {unit}" if v >= 100 else f"{v:.1f} {unit}" if v >= 10 else f"{v:.2f} {unit}"
    return f"{n:,.0f} B"


def _fmt_pct(fraction: float) -> str:
    """'90.4 %': one decimal, as the KPI tiles and tables print shares ('100 %' and beyond whole)."""
    p = 100 * fraction
    return f"{p:.0f} %" if abs(p) >= 100 else f"{p:.1f} %"


def _sentence_start(text: str) -> str:
    """Upper-case the first letter, unless the sentence starts with a unit such as tok/s."""
    return text if text.startswith("tok/s") else text[:1].upper() + text[1:]


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def _fmt_count(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _short_commit(commit: str | None) -> str | None:
    if commit and re.fullmatch(r"[0-9a-f]{12,40}", commit):
        return commit[:7]
    return commit


def shorten_kernel_name(name: str) -> str:
    """`void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(...)...>(...)`
    -> `unrolled_elementwise_kernel<direct_copy_kernel_cuda>`; plain names stay as they are."""
    text = re.sub(r"^std::enable_if<.*?>::type\s+", "", name.removeprefix("void ").strip())  # a return type
    text = text.replace("(anonymous namespace)::", "")  # at::native::(anonymous namespace)::vectorized_layer_norm_kernel
    head, _, rest = text.partition("<")
    scopes = head.split("(")[0].split("::")
    # a kernel named plainly `kernel` keeps its namespace: `gemvx::kernel`
    head = ("::".join(scopes[-2:]) if scopes[-1] == "kernel" and len(scopes) > 1 else scopes[-1]) or text[:60]
    if len(head) > MAX_SHORT_NAME_CHARS:  # a generated name (Tensile's Cijk_..._WG64_4_1): its start, cut
        return head[:MAX_SHORT_NAME_CHARS - 1] + "…"
    if not rest:
        return head
    for arg in rest.split(","):
        arg = arg.strip()
        if re.fullmatch(r"[\d\s]*", arg):
            continue
        if "::" in arg or "(" in arg:
            functor = arg.split("(")[0].split("<")[0].split("::")[-1]
            if re.fullmatch(r"[A-Za-z_]\w*", functor):
                return f"{head}<{functor}>"
        break
    return head


def _describe_kernel(row: Mapping[str, Any]) -> str:
    """"the cast kernel `unrolled_elementwise_kernel<direct_copy_kernel_cuda>` (aten::copy_)"."""
    category = row.get("category") or ""
    text = f"the {category} kernel `{shorten_kernel_name(str(row['name']))}`" if category else \
        f"kernel `{shorten_kernel_name(str(row['name']))}`"
    launcher = row.get("launcher") or ""
    attributed = row.get("graph_op") or ""
    if "::" in launcher:
        text += f" ({launcher})"
    elif "::" in attributed:  # a CUDA-graph kernel given its op by a mapping trace (graph_attribution.py)
        text += f" ({attributed}, by the mapping trace)"
    return text


def _from_source(row: Mapping[str, Any]) -> str:
    """', from `file.py(12): f`'; for a CUDA-graph kernel given its line by a mapping trace, that line."""
    attributed = row.get("graph_source") or ""
    if attributed:
        return f", from `{attributed}` (by the mapping trace)"
    source = row.get("source") or ""
    if source and _GRAPH_LAUNCHERS.fullmatch(str(row.get("launcher") or "")):
        # every kernel of a replay has the replay's line (cuda_graph_runner.py(1333): replay): say what it is
        return ", replayed from a CUDA graph"
    return f", from `{source}`" if source else ""


def _times_per_layer(calls_per_step: float, layers: int | None) -> int | None:
    """N when calls per step is N times the layer count (N >= 1), else None."""
    if not layers or not _is_number(calls_per_step) or calls_per_step <= 0:
        return None
    ratio = calls_per_step / layers
    n = round(ratio)
    return n if n >= 1 and abs(ratio - n) < 1e-6 * max(1, n) + 1e-9 else None


def _per_layer_words(n: int) -> str:
    return f"{_TIMES.get(n, f'{n} times')} per layer"


# ---------------------------------------------------------------------------------------------
# What a kernel's bytes per call could be


@dataclass(frozen=True)
class KnownTensor:
    """A tensor of the workload that a kernel's bytes per call can be compared with."""

    kind: str  # "kv_pool" or "weight_matrix"
    nbytes: int
    text: str
    whole_pool: bool = False


def _int(workload: Mapping[str, Any], key: str) -> int | None:
    v = workload.get(key)
    return int(v) if _is_number(v) and v > 0 and float(v).is_integer() else None


def list_known_tensors(workload: Mapping[str, Any] | None) -> list[KnownTensor]:
    """The tensors a decode step of this workload could move in one call, with their bytes:
    one layer's whole FP8 KV pool (read, written as BF16, or cast: both), the batch's active
    KV rows cast, and the BF16 weight matrices its dims define."""
    w = workload or {}
    found: list[KnownTensor] = []
    pool, kv_dim = _int(w, "pool_tokens"), _int(w, "kv_dim")
    if pool and kv_dim:
        shape = f"{pool:,} x {kv_dim:,}"
        elems = pool * kv_dim
        found += [
            KnownTensor("kv_pool", elems * (KV_BYTES + CAST_BYTES),
                    f"the whole {shape} FP8 KV pool of a layer, read as FP8 and written as BF16", True),
            KnownTensor("kv_pool", elems * KV_BYTES, f"the whole {shape} FP8 KV pool of a layer", True),
            KnownTensor("kv_pool", elems * CAST_BYTES, f"the whole {shape} KV pool of a layer in BF16", True),
        ]
    active = _int(w, "active_rows")
    if active is None and _int(w, "batch_size") and _int(w, "context"):
        active = w["batch_size"] * (w["context"] + 1)
    if active and kv_dim:
        found.append(KnownTensor("kv_pool", active * kv_dim * (KV_BYTES + CAST_BYTES),
                             f"the batch's {active:,} KV rows of {kv_dim:,} dims, read as FP8 and written as BF16"))
    hidden, heads, inter, lora = (_int(w, k) for k in ("hidden", "heads", "intermediate", "kv_lora_rank"))
    matrices = []  # (rows, cols, name)
    if hidden and heads and kv_dim:
        matrices.append((heads * kv_dim + kv_dim, hidden, "q + latent KV projection"))
    if hidden and heads and lora:
        matrices.append((hidden, heads * lora, "o projection"))
    if hidden and inter:
        matrices += [(2 * inter, hidden, "gate_up projection"), (hidden, inter, "down projection")]
    by_size: dict[int, list[tuple[int, int, str]]] = {}
    for rows, cols, name in matrices:
        by_size.setdefault(rows * cols * WEIGHT_BYTES, []).append((rows, cols, name))
    for nbytes, group in by_size.items():
        rows, cols, _ = group[0]
        names = " or ".join(name for _, _, name in group)
        found.append(KnownTensor("weight_matrix", nbytes, f"a {rows:,} x {cols:,} BF16 weight matrix ({names})"))
    return found


def _match_tensor(bytes_per_call: float, tensors: list[KnownTensor]) -> tuple[KnownTensor, float] | None:
    """The known tensor closest to `bytes_per_call`, if within MATCH_TOLERANCE, and the
    relative difference."""
    if not _is_number(bytes_per_call) or bytes_per_call <= 0 or not tensors:
        return None
    best = min(tensors, key=lambda t: abs(bytes_per_call / t.nbytes - 1))
    off = bytes_per_call / best.nbytes - 1
    return (best, off) if abs(off) <= MATCH_TOLERANCE else None


# ---------------------------------------------------------------------------------------------
# A run


def kernel_rows(kernels: Any) -> list[dict[str, Any]]:
    """A kernel table's rows as dicts by column name, in its order: an import's table (`to_dicts()`)
    or a DataFrame (`to_dict("records")`)."""
    to_dicts = getattr(kernels, "to_dicts", None)
    return to_dicts() if callable(to_dicts) else kernels.to_dict(orient="records")


def column_sum(rows: list[dict[str, Any]], column: str) -> float:
    """The sum of a column over rows, NaN and None as 0, added as pandas' Series.sum adds (NumPy)."""
    values = np.array([row.get(column) for row in rows], dtype=float)
    return float(np.where(np.isnan(values), 0.0, values).sum())


def size_key(row: Mapping[str, Any]) -> tuple[int, float]:
    """A row's place by ms per step: largest first, missing last (with sorted(), which keeps rows of
    equal value in their order: DataFrame.sort_values("ms_per_step", ascending=False, kind="stable"))."""
    v = row.get("ms_per_step")
    return (1, 0.0) if v is None or v != v else (0, -v)


def by_size(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows by ms per step, largest first (size_key)."""
    return sorted(rows, key=size_key)


def _check_facts(facts: RunFacts, what: str) -> None:
    if not _is_number(facts.step_ms) or facts.step_ms <= 0:
        raise RegressError(f"{what}: step_ms {facts.step_ms!r} must be a positive number of milliseconds")
    columns = getattr(facts.kernels, "columns", None)
    if columns is None or not (callable(getattr(facts.kernels, "to_dicts", None)) or hasattr(facts.kernels, "iloc")):
        raise RegressError(f"{what}: kernels must be a table of kernel rows (a DataFrame, or an import's table), "
                           f"got {type(facts.kernels).__name__}")
    missing = [c for c in _NEEDED if c not in columns]
    if missing:
        raise RegressError(f"{what}: kernel rows lack column(s) {', '.join(missing)}")
    if "rank" in columns and len(ranks := set(np.asarray(facts.kernels["rank"]).tolist())) > 1:
        raise RegressError(f"{what}: kernel rows of {len(ranks)} ranks; pass one rank's rows")


def _tok_per_s_at(facts: RunFacts, step_ms: float) -> float | None:
    """tok/s at a given step time: batch size x 1000 / ms, or the run's tok/s scaled."""
    if step_ms <= 0:
        return None
    if facts.batch_size:
        return facts.batch_size * 1000.0 / step_ms
    if _is_number(facts.tok_per_s):
        return facts.tok_per_s * facts.step_ms / step_ms
    return None


def _run_tok_per_s(facts: RunFacts) -> float | None:
    return facts.tok_per_s if _is_number(facts.tok_per_s) else _tok_per_s_at(facts, facts.step_ms)


def _bandwidth_findings(row: Mapping[str, Any], facts: RunFacts) -> list[Finding]:
    name = str(row["name"])
    bytes_per_call = row.get("bytes_per_call")
    if not _is_number(bytes_per_call):
        if row.get("input_dtypes"):  # its op's shapes are in the trace: the op launched more than this kernel
            model = row.get("model_bytes_per_call")
            share = (f"; the roofline gives it its op's bytes in proportion to its time, {_fmt_bytes(model)} per call"
                     if _is_number(model) else "")
            return [Finding("no_bytes", "Its own bytes per call are not known: its op launched other kernels "
                            "beside it (a workspace memset, a split-K reduction), so the op's bytes are not its "
                            f"alone{share}.", {}, name)]
        return [Finding("no_bytes", "Its bytes per call are unknown: the trace has no op shapes for it (a "
                        "CUDA-graph replay, a kernel launched outside an op, or record_shapes off); an eager "
                        "capture with record_shapes gives them.", {}, name)]
    # the rate and the fraction of peak are the import's (ingest/traces/analyse.aggregate): all the
    # calls' bytes over their time, and none for a copy to or from host memory
    gbps, fraction = row.get("gbps"), row.get("peak_fraction")
    numbers = {"bytes_per_call": float(bytes_per_call)}
    text = f"It moves {_fmt_bytes(bytes_per_call)} per call"
    if _is_number(gbps):
        numbers["gbps"] = float(gbps)
        text += f" at {_fmt_rate(gbps)} GB/s"  # 0.42 GB/s, not "0 GB/s"
        if _is_number(facts.peak_gbps) and facts.peak_gbps > 0 and _is_number(fraction):
            numbers.update(peak_gbps=float(facts.peak_gbps), peak_fraction=float(fraction))
            device = f"the {facts.device_name}'s" if facts.device_name else "the device's"
            text += f": {_fmt_pct(fraction)} of {device} {facts.peak_gbps:,.0f} GB/s peak"
    return [Finding("bandwidth", text + ".", numbers, name)]


def _tensor_findings(row: Mapping[str, Any], facts: RunFacts) -> list[Finding]:
    name = str(row["name"])
    match = _match_tensor(row.get("bytes_per_call"), list_known_tensors(facts.workload))
    if match is None:
        return []
    tensor, off = match
    numbers = {"bytes_per_call": float(row["bytes_per_call"]), "tensor_bytes": tensor.nbytes,
               "relative_difference": off}
    closeness = "exactly" if abs(off) < 1e-9 else "within 0.1 %" if abs(off) < 1e-3 else f"{_fmt_pct(abs(off))} apart"
    found = [Finding(tensor.kind, f"{_fmt_bytes(row['bytes_per_call'])} per call is {tensor.text}: "
                     f"{tensor.nbytes:,} bytes, {closeness}.", numbers, name)]
    if tensor.whole_pool and row.get("category") == "cast":
        found.append(_static_cast_finding(row, facts, tensor))
    return found


def _static_cast_finding(row: Mapping[str, Any], facts: RunFacts, tensor: KnownTensor) -> Finding:
    w = facts.workload or {}
    pool, kv_dim = int(w["pool_tokens"]), int(w["kv_dim"])
    written = facts.batch_size or _int(w, "batch_size") or 1
    numbers: dict[str, Any] = {"pool_rows": pool, "rows_written_per_step": written}
    text = (f"It casts data that does not change between steps: a decode step writes {written:,} new "
            f"row{'s' if written != 1 else ''} per layer into this {pool:,}-row pool, yet the whole pool is "
            f"cast again every step")
    active = _int(w, "active_rows") or (written * (w["context"] + 1) if _int(w, "context") else None)
    if active:
        needed = active * kv_dim * (KV_BYTES + CAST_BYTES)
        numbers.update(active_rows=active, active_fraction=active / pool, needed_bytes_per_call=needed,
                       bytes_ratio=float(row["bytes_per_call"]) / needed)
        text += (f"; the batch reads {active:,} rows ({_fmt_pct(active / pool)} of the pool), so casting only "
                 f"those would move {_fmt_bytes(needed)} per call instead of {_fmt_bytes(row['bytes_per_call'])} "
                 f"({row['bytes_per_call'] / needed:,.0f}x less), or attention could read the FP8 rows directly")
    return Finding("static_cast", text + ".", numbers, str(row["name"]))


def _without_finding(row: Mapping[str, Any], facts: RunFacts) -> Finding:
    """The step without this kernel: the timed step less the kernel's part of the profiled step
    (its ms per profiled step over the profiled step), so both figures share one basis."""
    name, ms = str(row["name"]), float(row["ms_per_step"])
    profiled = _profiled_step_ms(facts)
    part = ms / profiled
    if part >= 1:
        return Finding("without_kernel", f"Its {_fmt_ms(ms)} per step is not less than the {_fmt_ms(profiled)} "
                       "profiled step: the kernel figures and the step time come from different measurements.",
                       {"ms_per_step": ms, "step_ms": profiled}, name)
    remaining = facts.step_ms * (1 - part)
    numbers = {"step_ms": facts.step_ms, "step_ms_without": remaining, "speedup": facts.step_ms / remaining,
               "part_of_profiled_step": part}
    if facts.step_ms / remaining < NEGLIGIBLE_SPEEDUP:
        return Finding("without_kernel", f"If this kernel went away and nothing else changed, a step would be "
                       f"{100 * part:.2g} % shorter ({_fmt_ms(remaining)}): it does not set the step's pace.",
                       numbers, name)
    text = f"If this kernel went away and nothing else changed, a step would take {_fmt_ms(remaining)} instead of " \
           f"{_fmt_ms(facts.step_ms)}"
    tok_without, tok_now = _tok_per_s_at(facts, remaining), _run_tok_per_s(facts)
    if tok_without is not None:
        numbers["tok_per_s_without"] = tok_without
        text += f": {_fmt_rate(tok_without)} tok/s"
        if tok_now is not None:
            numbers["tok_per_s"] = tok_now
            text += f" instead of {_fmt_rate(tok_now)}"
    text += f" ({facts.step_ms / remaining:.1f}x)"
    if (facts.workload or {}).get("cuda_graph") is False:
        launches = float(column_sum(kernel_rows(facts.kernels), "calls_per_step") - float(row["calls_per_step"]))
        numbers["kernel_launches_per_step_without"] = launches
        text += (f"; an upper bound: the run is eager, and with {_fmt_count(launches)} kernel launches per step "
                 "left, the CPU may set the pace instead (CUDA graphs avoid that)")
    return Finding("without_kernel", text + ".", numbers, name)


def _profiled_step_ms(facts: RunFacts) -> float:
    """The step the kernels' ms per step were measured in: the profiled steps' median."""
    p = facts.profiled_step_ms
    return p if _is_number(p) and p > 0 else facts.step_ms


def _kernel_share(row: Mapping[str, Any], facts: RunFacts) -> float:
    """The kernel's share of all kernel time (the kernel table's `share`), else of the profiled step."""
    share = row.get("share")
    return float(share) if _is_number(share) else float(row["ms_per_step"]) / _profiled_step_ms(facts)


def diagnose_kernel(row: Mapping[str, Any], facts: RunFacts) -> list[Finding]:
    """Every rule about one kernel row of a run: share of the step, calls per layer, bandwidth,
    which tensor its bytes are, a static cast, and the run without it."""
    name = str(row["name"])
    ms, calls = float(row["ms_per_step"]), float(row["calls_per_step"])
    share, profiled = _kernel_share(row, facts), _profiled_step_ms(facts)
    findings = [Finding("summary", f"{_sentence_start(_describe_kernel(row))} takes {_fmt_pct(share)} of all "
                        f"kernel time: {_fmt_ms(ms)} of each {_fmt_ms(profiled)} profiled step{_from_source(row)}.",
                        {"ms_per_step": ms, "step_ms": facts.step_ms, "profiled_step_ms": profiled,
                         "share_of_kernel_time": share}, name)]
    n = _times_per_layer(calls, facts.layers)
    if n is not None:
        findings.append(Finding("per_layer", f"It runs {_fmt_count(calls)} times per step: {_per_layer_words(n)} "
                                f"({facts.layers} layers).",
                                {"calls_per_step": calls, "layers": facts.layers, "times_per_layer": n}, name))
    findings += _bandwidth_findings(row, facts)
    findings += _tensor_findings(row, facts)
    findings.append(_without_finding(row, facts))
    return findings


def _host_bound_findings(kernels: list[dict[str, Any]], facts: RunFacts) -> list[Finding]:
    """The first finding when the kernels add up to under HOST_BOUND_KERNEL_SHARE of the profiled step:
    the GPU is busy at most that share (their sum, an upper bound where kernels overlap), so no kernel
    sets the step's pace. Not for a CPU-only trace's ops, which are the host's own work."""
    profiled = _profiled_step_ms(facts)
    kernel_ms = column_sum(kernels, "ms_per_step")
    if facts.kernels_from_cpu_ops or not profiled > 0 or not kernel_ms < HOST_BOUND_KERNEL_SHARE * profiled:
        return []
    launches = column_sum(kernels, "calls_per_step")
    return [Finding("host_bound", f"The GPU is busy at most {_fmt_pct(kernel_ms / profiled)} of each "
                    f"{_fmt_ms(profiled)} profiled step: its {_fmt_count(launches)} kernels a step take "
                    f"{_fmt_ms(kernel_ms)}, so the step waits on the host (Python, data loading, launches, "
                    "synchronisation), not on a kernel; the kernels below do not set its pace.",
                    {"kernel_ms_per_step": kernel_ms, "profiled_step_ms": profiled, "busy_share_at_most":
                     kernel_ms / profiled, "kernels_per_step": launches})]


def diagnose_run(facts: RunFacts, min_share: float = 0.10, max_kernels: int = 3) -> list[Finding]:
    """Findings about the kernels that take at least `min_share` of the step (at most
    `max_kernels` of them, largest first; the largest one whatever its share)."""
    _check_facts(facts, "run")
    kernels = by_size(kernel_rows(facts.kernels))
    if not kernels:
        return []
    least = min_share * _profiled_step_ms(facts)
    top = [row for row in kernels if row["ms_per_step"] >= least][:max_kernels] or kernels[:1]
    findings = _host_bound_findings(kernels, facts)
    for row in top:
        findings += diagnose_kernel(row, facts)
    return findings


# ---------------------------------------------------------------------------------------------
# A change between two runs, and a patched/unpatched pair


def _headline_metric(before: RunFacts, after: RunFacts) -> tuple[str, float, float, bool]:
    """(label, before, after, higher is better): tok/s when both runs have it, else step ms."""
    tb, ta = _run_tok_per_s(before), _run_tok_per_s(after)
    if tb is not None and ta is not None:
        return "tok/s", tb, ta, True
    return "step time", before.step_ms, after.step_ms, False


def _kernel_change_sentence(row: Mapping[str, Any], facts_after: RunFacts, facts_before: RunFacts,
                            where: str) -> Finding:
    """"<kernel> went from 0 to 78 calls per step there (once per layer): +67.7 ms per step, 98 % of
    the change; it moves 855 MB per call at 21 % of peak bandwidth, from `file.py(1): f`"."""
    name = str(row["name"])
    cb, ca = float(row["calls_per_step_before"]), float(row["calls_per_step_after"])
    mb, ma = float(row["ms_per_step_before"]), float(row["ms_per_step_after"])
    delta = ma - mb
    numbers: dict[str, Any] = {"calls_per_step_before": cb, "calls_per_step_after": ca,
                               "ms_per_step_before": mb, "ms_per_step_after": ma, "delta_ms_per_step": delta}
    if cb != ca:
        text = f"{_describe_kernel(row)} went from {_fmt_count(cb)} to {_fmt_count(ca)} calls per step{where}"
        n = _times_per_layer(ca if ca else cb, facts_after.layers if ca else facts_before.layers)
        if n is not None:
            text += f" ({_per_layer_words(n)})"
            numbers["times_per_layer"] = n
        text += f": {'+' if delta >= 0 else '-'}{_fmt_ms(abs(delta))} per step"
    else:
        text = (f"{_describe_kernel(row)} went from {_fmt_ms(mb)} to {_fmt_ms(ma)} per step{where} "
                f"({_fmt_count(ca)} calls per step on both sides)")
    fraction = row.get("fraction_of_change")
    if _is_number(fraction):
        numbers["fraction_of_change"] = fraction
        if fraction < 0:  # the kernel moved against the step: a negative share of it reads as nonsense
            text += ", opposite to the step's change (other time moved further the other way)"
        elif fraction > 1.05:
            text += f", more than the whole change ({fraction:.1f}x it: other time moved the other way)"
        else:
            text += f", {_fmt_pct(min(fraction, 1.0))} of the change"
    bytes_per_call = row.get("bytes_per_call_after" if ca else "bytes_per_call_before")
    peak_fraction = row.get("peak_fraction_after" if ca else "peak_fraction_before")
    if _is_number(bytes_per_call):
        numbers["bytes_per_call"] = bytes_per_call
        text += f"; it moves {_fmt_bytes(bytes_per_call)} per call"
        if _is_number(peak_fraction):
            numbers["peak_fraction"] = peak_fraction
            text += f" at {_fmt_pct(peak_fraction)} of peak bandwidth"
    text += _from_source(row)
    return Finding("change_kernel", _sentence_start(text) + ".", numbers, name)


def _explaining_rows(explanation: Explanation, min_fraction: float, top: int):
    k = explanation.kernels
    delta_step = abs(explanation.delta_step_ms)
    big = k["delta_ms_per_step"].abs() >= max(min_fraction * delta_step, 1e-9)
    rows = k[big | (k["delta_calls_per_step"] != 0) & (k["delta_ms_per_step"].abs() >= 0.01 * delta_step)]
    return rows.head(top)


def diagnose_change(before: RunFacts, after: RunFacts, explanation: Explanation | None = None,
                    commit: str | None = None, min_fraction: float = 0.10, top: int = 3) -> list[Finding]:
    """The headline change between the last good run (`before`) and the first bad one (`after`)
    at `commit` (default: the after run's), then the kernels that explain most of it (each with
    at least `min_fraction` of the step-time change, or whose calls per step changed; at most
    `top`), each with its bytes, bandwidth and source, and what it matches in the workload."""
    _check_facts(before, "before")
    _check_facts(after, "after")
    if explanation is None:
        explanation = explain_change(before.kernels, after.kernels, before.step_ms, after.step_ms)
    label, vb, va, higher_is_better = _headline_metric(before, after)
    rel = va / vb - 1
    at = _short_commit(commit or after.commit)
    where = f" at commit {at}" if at else ""
    verb = "rose" if rel > 0 else "fell" if rel < 0 else "stayed"
    unit = (lambda v: f"{_fmt_rate(v)} tok/s") if label == "tok/s" else _fmt_ms
    amount = f"{1 + rel:,.1f}x" if rel >= 1 else _fmt_pct(abs(rel))  # "rose 9.6x", not "rose 860 %"
    text = f"{_sentence_start(label)} {verb} {amount}{where} ({unit(vb)} -> {unit(va)}"
    if label == "tok/s":
        text += f"; step time {_fmt_ms(before.step_ms)} -> {_fmt_ms(after.step_ms)}"
    worse = rel < 0 if higher_is_better else rel > 0
    numbers = {"metric": label, "before": vb, "after": va, "relative_change": rel,
               "step_ms_before": before.step_ms, "step_ms_after": after.step_ms,
               "direction": "regression" if worse else "improvement"}
    findings = [Finding("change", text + ").", numbers)]
    there = " there" if at else ""
    for _, row in _explaining_rows(explanation, min_fraction, top).iterrows():
        row = row.to_dict()
        findings.append(_kernel_change_sentence(row, after, before, there))
        side = after if row["calls_per_step_after"] else before
        bytes_key = "bytes_per_call_after" if row["calls_per_step_after"] else "bytes_per_call_before"
        match_row = {"name": row["name"], "category": row["category"], "bytes_per_call": row.get(bytes_key)}
        findings += _tensor_findings(match_row, side)
    findings += _unexplained_findings(explanation)
    return findings


def _unexplained_findings(explanation: Explanation) -> list[Finding]:
    delta_step, kernel_delta = explanation.delta_step_ms, explanation.kernel_delta_ms
    if delta_step == 0 or abs(explanation.unexplained_ms) < 0.25 * abs(delta_step):
        return []
    numbers = {"delta_step_ms": delta_step, "kernel_delta_ms": kernel_delta,
               "unexplained_ms": explanation.unexplained_ms}
    if abs(kernel_delta) > abs(delta_step):
        text = (f"Kernel time changed by {_fmt_ms(kernel_delta)} per step but the step only by {_fmt_ms(delta_step)}: "
                "on the faster side the GPU is not the limit (CPU launches or idle gaps take the rest).")
    else:
        text = (f"The kernels account for {_fmt_ms(kernel_delta)} of the {_fmt_ms(delta_step)} step-time change; "
                "the rest is outside kernels (CPU-side time, launches, idle gaps).")
    return [Finding("unexplained", text, numbers)]


def diagnose_patch(unpatched: RunFacts, patched: RunFacts, explanation: Explanation | None = None,
                   min_speedup: float = 0.03, commit: str | None = None, top: int = 5) -> list[Finding]:
    """What a patch changes at one commit (kernels removed, added, changed; the step time on
    both sides) and whether it still helps: speedup (unpatched ms / patched ms - 1) at least
    `min_speedup`."""
    _check_facts(unpatched, "unpatched")
    _check_facts(patched, "patched")
    if explanation is None:
        explanation = explain_change(unpatched.kernels, patched.kernels, unpatched.step_ms, patched.step_ms)
    speedup = unpatched.step_ms / patched.step_ms - 1
    at = _short_commit(commit or patched.commit or unpatched.commit)
    names = f" ({patched.variant} against {unpatched.variant})" if patched.variant and unpatched.variant else ""
    text = (f"{'At commit ' + at + ' the' if at else 'The'} patch{names} takes a step from "
            f"{_fmt_ms(unpatched.step_ms)} to {_fmt_ms(patched.step_ms)}")
    numbers: dict[str, Any] = {"step_ms_unpatched": unpatched.step_ms, "step_ms_patched": patched.step_ms,
                               "speedup": speedup, "min_speedup": min_speedup, "helps": speedup >= min_speedup}
    tok_u, tok_p = _run_tok_per_s(unpatched), _run_tok_per_s(patched)
    if tok_u is not None and tok_p is not None:
        numbers.update(tok_per_s_unpatched=tok_u, tok_per_s_patched=tok_p)
        text += f" ({_fmt_rate(tok_u)} -> {_fmt_rate(tok_p)} tok/s)"
    if speedup >= min_speedup:
        text += (f": {unpatched.step_ms / patched.step_ms:.2f}x as fast, so it still helps "
                 f"(at least {min_speedup * 100:g} % needed).")
    elif speedup >= 0:
        text += (f": only {_fmt_pct(speedup)} faster, less than the {_fmt_pct(min_speedup)} it must gain; "
                 "it no longer helps.")
    else:
        text += f": {_fmt_pct(-speedup)} slower; the patch makes decode worse."
    findings = [Finding("patch", text, numbers)]
    k = explanation.kernels
    threshold = max(0.01 * unpatched.step_ms, 1e-6)
    shown = k[(k["status"] != "changed") | (k["delta_ms_per_step"].abs() >= threshold)].head(top)
    for _, row in shown.iterrows():
        row = row.to_dict()
        findings.append(_patch_kernel_sentence(row))
    return findings


def _patch_kernel_sentence(row: Mapping[str, Any]) -> Finding:
    status = row["status"]
    cb, ca = float(row["calls_per_step_before"]), float(row["calls_per_step_after"])
    mb, ma = float(row["ms_per_step_before"]), float(row["ms_per_step_after"])
    numbers = {"status": status, "calls_per_step_unpatched": cb, "calls_per_step_patched": ca,
               "ms_per_step_unpatched": mb, "ms_per_step_patched": ma, "delta_ms_per_step": ma - mb}
    kernel = _describe_kernel(row)
    if status == "removed":
        text = f"It removes {kernel}: {_fmt_count(cb)} calls and {_fmt_ms(mb)} per step{_from_source(row)}."
    elif status == "added":
        text = f"It adds {kernel}: {_fmt_count(ca)} calls and {_fmt_ms(ma)} per step{_from_source(row)}."
    else:
        text = f"It changes {kernel} from {_fmt_ms(mb)} to {_fmt_ms(ma)} per step"
        text += f" ({_fmt_count(cb)} -> {_fmt_count(ca)} calls)." if cb != ca else "."
    return Finding("patch_kernel", text, numbers, str(row["name"]))


def format_markdown(findings: list[Finding]) -> str:
    """The findings as a Markdown bullet list, one sentence each."""
    return "\n".join(f"- {f.text}" for f in findings)
