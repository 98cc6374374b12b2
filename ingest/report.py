"""A run's figures as a readable table or as one JSON object (`python -m ingest report`): with
what the import checked, whether its figures agree (consistency) and the pattern catalog's findings.

It loads DuckDB but neither pandas nor NumPy (the store's records form), so that a report
answers in a fraction of a second (ingest/BENCHMARKS.md, start-up)."""

from __future__ import annotations

import json
import math
import re
import textwrap
from typing import Any

from db.store import Store, open_db

from .errors import IngestError
from .traces.categories import COPY_CATEGORIES

KERNEL_FIELDS = ["name", "category", "launcher", "source", "calls", "calls_per_step", "total_us",
                 "mean_us", "median_us", "ms_per_step", "share", "bytes_per_call", "gbps", "peak_fraction",
                 "input_dtypes", "graph_op", "graph_source", "graph_layers", "flops_per_call", "model_bytes_per_call",
                 "intensity", "tflops", "tbps", "compute_fraction", "bandwidth_fraction", "bound"]


def _clean(value: Any) -> Any:
    """JSON-ready: NaN and None become None, numpy scalars plain Python, '' stays ''."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _records(rows: list[dict], fields: list[str]) -> list[dict]:
    return [{f: _clean(row[f]) for f in fields} for row in rows]


RANK_FIELDS = ["rank", "device_name", "steps", "step_ms_median", "busy_ms_median", "comm_ms_median",
               "wait_ms_median", "last_arrivals", "collectives", "between_steps_ms"]


def build_report(store: Store, run_id: int, rank: int | None = None) -> dict:
    """The run's figures for one rank (by default its first: the only one of a single trace,
    whatever its rank), with the run's notes and, for a multi-rank run, one row per rank.

    The run row holds its first rank's step figures and copy share; for another rank they are
    that rank's (its rank_stats row; the copy share from its kernels). Consistency, patterns and
    the timeline are checked at import on the first rank only: `checked_rank` says which."""
    run = store.get_run(run_id)
    if run is None:
        raise IngestError(f"{store.path}: no run with id {run_id}")
    ranks = store.list_rank_stats(run_id, records=True)
    first_rank = next(iter(store.list_ranks(run_id)), None)
    rank = first_rank if rank is None else rank
    known = {r["rank"] for r in ranks} if ranks else {first_rank}
    if rank not in known:
        raise IngestError(f"run {run_id} has no rank {rank} (its ranks: {', '.join(map(str, sorted(known)))})")
    cats = store.list_run_categories(run_id, rank, records=True)
    kernels = store.list_kernels(run_id, rank, records=True)
    for k in kernels:  # '' in the table means unknown
        for f in ("launcher", "source", "input_dtypes", "graph_op", "graph_source", "graph_layers"):
            k[f] = k[f] or None
    # the run row names a missing repo, variant or GPU '' (as pages do); the report says null
    names = {"id": run["run_id"], "repo": run["repo"] or None, "commit": run["sha"], "variant": run["variant"] or None,
             "device": run["device"] or None}
    figures = {k: _clean(run[k]) for k in ("steps", "step_method", "step_ms_median", "tok_per_s")}
    copy_share = _clean(run["copy_share"])
    if rank != first_rank:  # the run row is its first rank's: this rank's own step figures and copy share
        mine = next(r for r in ranks if r["rank"] == rank)
        figures |= {"steps": mine["steps"], "step_ms_median": _clean(mine["step_ms_median"])}
        total = sum(k["total_us"] for k in kernels)
        copy_share = sum(k["total_us"] for k in kernels if k["category"] in COPY_CATEGORIES) / total if total else None
    return {
        "run": {k: _clean(v) for k, v in names.items()}
               | figures
               | {"layers": _clean(run["layers"]), "ranks": run["ranks"], "rank": rank,
                  "kernels_from_cpu_ops": run["kernels_from_cpu_ops"]},
        "notes": run["notes"],
        "copy_share": _clean(copy_share),
        # the rank consistency, patterns and timeline were checked on at import (the run's first)
        "checked_rank": first_rank,
        "categories": _records(cats, ["category", "ms_per_step", "share"]),
        "kernels": _records(kernels, KERNEL_FIELDS),
        "per_rank": _records(ranks, RANK_FIELDS) if len(ranks) > 1 else [],
        # what the import checked, on the run's first rank (None for runs imported before it did)
        "consistency": run["consistency"],
        "patterns": run["patterns"],
        "timeline": run["timeline"],
        # how kernels replayed from CUDA graphs got their op, line and layer (None: no mapping given)
        "graph_attribution": run["graph_attribution"],
        # the device ceilings the roofline fractions are of (None: unknown device, or imported before)
        "roofline": run["roofline"],
    }


# C0 and C1 control characters (and DEL) but the report's own newlines: kernel and op names come
# from the trace, and a terminal must not receive escape sequences or bells from a file
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _printable(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _short(text: str | None, width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _wrapped(text: str, first: str, rest: str = "    ") -> list[str]:
    return textwrap.wrap(text, 110, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def format_consistency(consistency: dict | None) -> list[str]:
    """'consistency: marked' (or ok) and the sentences of what disagrees, what is noted and what
    could not be compared."""
    if consistency is None:
        return ["consistency: not checked (imported before stepwatch checked it)"]
    lines = [f"consistency: {'MARKED, the figures disagree' if consistency['marked'] else 'ok'}"]
    for check in consistency["checks"]:
        if check["status"] != "ok":
            lines += _wrapped(check["text"], f"  {'note: ' if check['status'] == 'note' else ''}")
    for text in consistency["unchecked"]:
        lines += _wrapped(text, "  not checked: ")
    return lines


def format_patterns(patterns: dict | None) -> list[str]:
    """The pattern catalog's findings, the most time at stake first, and the patterns not evaluated."""
    if patterns is None:
        return ["patterns: not checked"]
    lines = ["patterns (ms per step at stake)" if patterns["findings"] else "patterns: none found"]
    for f in patterns["findings"]:
        more = f" ({f['more_kernels']} more kernels match)" if f.get("more_kernels") else ""
        lines += _wrapped(f"{f['pattern']}: {f['text']}{more}", f"{f['ms_per_step']:>9.3f}  ", " " * 11)
    for n in patterns["not_evaluated"]:
        lines += _wrapped(f"{n['pattern']}: {n['why']}", "  not evaluated: ", " " * 11)
    return lines


def format_attribution(summary: dict | None) -> list[str]:
    """One line on how the graph kernels were attributed, and to which layer frame."""
    if summary is None:
        return []
    share = "" if summary["time_share"] is None else f" ({100 * summary['time_share']:.1f} % of their time)"
    line = (f"graph kernels: {summary['matched']:,} of {summary['kernels']:,} attributed by {summary['method']}{share},"
            f" {summary['unmatched']:,} unmatched")
    if summary.get("layer_frame"):
        line += f"; layers: calls of {summary['layer_frame']}"
    return _wrapped(line, "")


def format_roofs(roofline: dict | None) -> str:
    """One line: the device's datasheet ceilings the roofline fractions are of, and the measured ones."""
    if roofline is None:
        return "roofline: no ceilings (unknown device, CPU-only trace, or imported before stepwatch kept them)"

    def roofs(f: dict) -> str:
        return (f"{_fmt(f.get('bf16_tflops'), ',.0f')} BF16 / {_fmt(f.get('fp8_tflops'), ',.0f')} FP8 / "
                f"{_fmt(f.get('fp32_tflops'), ',.1f')} FP32 TFLOP/s, {_fmt(f.get('hbm_gbps'), ',.0f')} GB/s")
    measured = roofline["measured"]
    return (f"roofline: fractions of the {roofline['device']} datasheet's {roofs(roofline['datasheet'])}"
            + (f"; measured on the card: {roofs(measured)}" if measured else ""))


def format_report(report: dict, top: int = 15) -> str:
    r = report["run"]
    unit = "CPU op" if r["kernels_from_cpu_ops"] else "kernel"
    lines = [
        f"run {r['id']}  {r['repo'] or '-'} @ {(r['commit'] or '-')[:12]}  variant {r['variant'] or '-'}",
        f"device {r['device'] or '-'}  steps {r['steps']} ({r['step_method']})  rank {r['rank']} of {r['ranks']}",
        f"step {_fmt(r['step_ms_median'], '.3f')} ms (median)  tok/s {_fmt(r['tok_per_s'], '.2f')}"
        f"  copy share {_fmt(report['copy_share'] and 100 * report['copy_share'], '.1f')} %",
        *([f"consistency, patterns and timeline: checked at import on rank {report['checked_rank']}, "
            f"the run's first, not on rank {r['rank']}"] if report.get("checked_rank", r["rank"]) != r["rank"] else []),
        *format_consistency(report["consistency"]),
        *format_attribution(report.get("graph_attribution")),
        *_wrapped(format_roofs(report.get("roofline")), ""),
        "",
        f"{'category':<14}{'ms/step':>10}{'share':>8}",
    ]
    for c in report["categories"]:
        lines.append(f"{c['category']:<14}{c['ms_per_step']:>10.3f}{100 * (c['share'] or 0):>7.1f}%")
    lines += ["", f"{'share':>6} {'ms/step':>8} {'calls/st':>8} {'mean us':>9} {'GB/s':>7} {'%peak':>6}"
                  f" {'TFLOP/s':>8} {'%comp':>6} {'%BW':>6} {'bound':<8} "
                  f"{'category':<14}{'launcher':<22}{unit + ' (source)'}"]
    for k in report["kernels"][:top]:
        peak = k["peak_fraction"] and 100 * k["peak_fraction"]
        comp, bw = (None if k[f] is None else 100 * k[f] for f in ("compute_fraction", "bandwidth_fraction"))
        lines.append(
            f"{100 * (k['share'] or 0):>5.1f}% {k['ms_per_step']:>8.3f} {k['calls_per_step']:>8.2f}"
            f" {k['mean_us']:>9.1f} {_fmt(k['gbps'], '7.0f'):>7} {_fmt(peak, '5.1f'):>6}"
            f" {_fmt(k['tflops'], '8.3f'):>8} {_fmt(comp, '5.1f'):>6} {_fmt(bw, '5.1f'):>6} {k['bound'] or '-':<8} "
            f"{k['category']:<14}{_short(k['launcher'], 21):<22}{_short(k['name'], 90)}"
            + (f"\n{'':>60}{_short(k['source'], 90)}" if k["source"] else "")
            + (f"\n{'':>60}{_short(_attributed(k, report), 90)}" if k["graph_op"] or k["graph_source"] else "")
        )
    if len(report["kernels"]) > top:
        lines.append(f"... {len(report['kernels']) - top} more (--json for all)")
    lines += [""] + format_patterns(report["patterns"])
    if report["per_rank"]:
        lines += ["", f"{'rank':>4} {'step ms':>9} {'busy ms':>9} {'comm ms':>9} {'wait ms':>9} {'last':>9}"
                      "  (medians over steps; wait: in collectives for the last rank; last: collectives reached last)"]
        for q in report["per_rank"]:
            last = "-" if q["last_arrivals"] is None else f"{q['last_arrivals']}/{q['collectives']}"
            lines.append(f"{q['rank']:>4} {_fmt(q['step_ms_median'], '9.3f')} {_fmt(q['busy_ms_median'], '9.3f')}"
                         f" {q['comm_ms_median']:>9.3f} {_fmt(q['wait_ms_median'], '9.3f')} {last:>9}")
    if report["notes"]:
        lines += [""] + [f"note: {n}" for n in report["notes"]]
    return _printable("\n".join(lines))


def _attributed(kernel: dict, report: dict) -> str:
    """`via mapping trace: aten::copy_ at kernels/workload.py(197): _fetch_kv, layers 0-77`."""
    method = (report.get("graph_attribution") or {}).get("method", "mapping trace")
    text = f"via {method}: {kernel['graph_op'] or '-'}"
    if kernel["graph_source"]:
        text += f" at {kernel['graph_source']}"
    if kernel["graph_layers"]:
        text += f", layers {kernel['graph_layers']}"
    return text


def run_report(args) -> int:
    with open_db(args.db, read_only=True) as store:
        report = build_report(store, args.run_id, args.rank)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(format_report(report, args.top))
    return 0
