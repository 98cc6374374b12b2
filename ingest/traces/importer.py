"""From a path on disk (a trace, a directory of per-rank traces, or a result bundle) to a run
in the database: find the traces, read and analyse each rank, then write everything in one
transaction. Nothing touches the database until every file has been read successfully."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import stat
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from db.store import RunRecord
from kernels.bundle import LABEL_RULE, Manifest, is_bundle, is_label, read_bundle

from ..errors import IngestError, TraceError
from ..regress.consistency import check_consistency
from ..user_files import describe_kind, parse_user_table, read_user_text
from ..regress.diagnose import diagnose_run, facts_from_record
from ..regress.patterns import DEFAULT_CATALOG, Pattern, PatternError, combine_catalogs, find_patterns, parse_catalog
from .analyse import RankFigures, analyse_trace
from .categories import Rule
from .progress import ReadMeter
from .rank_pool import json_sizes, map_in_processes, rank_workers
from .ranks import find_waits, waits_for
from .table import Table
from .trace_read import DEFAULT_LIMITS, ReadLimits, metered, read_trace

TRACE_SUFFIXES = (".json", ".json.gz")
# workload fields that say how a run was measured or which variant it is, not what it ran
_NOT_SERIES = {"kv", "timing_steps", "warmup_steps", "profiled_steps", "profile_steps", "with_stack",
               "record_shapes", "seed"}
_TRACE_NAME = re.compile(r"\.trace\.json(\.gz)?$")
_DECODE_TRACE = re.compile(r"-DECODE\.trace\.json(\.gz)?$")


@dataclass(frozen=True)
class ImportOptions:
    repo: str | None = None
    commit: str | None = None
    variant: str | None = None
    layers: int | None = None
    tok_per_s: float | None = None
    steps: int | None = None
    job_id: int | None = None
    sweep_id: str | None = None  # the sweep the run is a point of (a job's spec); None: the manifest's, if any
    sweep_point: int | None = None
    limits: ReadLimits = DEFAULT_LIMITS
    patterns: tuple[Pattern, ...] | None = None  # the pattern catalog (load_pattern_catalog); None: the built-in one
    mapping: str | None = None  # graph-off trace(s) of the same workload (--mapping); None: the bundle's, if any


def check_label(field: str, value: str | None) -> str | None:
    """A repo, commit or variant label on the command line: the bundle format's label rule."""
    if value is None:
        return None
    if not is_label(value):
        raise IngestError(f"--{field} {value!r}: {LABEL_RULE}")
    return value


def find_traces(path: Path) -> tuple[list[Path], Manifest | None, list[str]]:
    """The trace files a path stands for, the bundle manifest if it is a bundle, and notes on
    files of a directory that were left out.

    In a directory, the files named like traces (`*.trace.json[.gz]`, as torch's
    tensorboard_trace_handler and SGLang name them) are the traces when there are any, so a
    results file or config beside them is not taken for one; and when SGLang's by-stage
    profiling left `-DECODE` and `-EXTEND` traces of each rank, the decode ones are read."""
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if path.is_file():
        return [_regular(path)], None, []
    if not path.is_dir():  # a FIFO would block the read, a device never end
        raise IngestError(f"{path}: is {describe_kind(path.stat().st_mode)}, not a trace file or a directory")
    if is_bundle(path):
        manifest = read_bundle(path)
        return [_regular(path / name) for name in manifest.traces], manifest, []
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise IngestError(f"{path}: directory holds no trace files (*.json or *.json.gz)")
    notes = []
    named = [p for p in files if _TRACE_NAME.search(p.name)]
    if named and len(named) < len(files):
        notes.append(f"{len(files) - len(named)} JSON file(s) in the directory not named *.trace.json[.gz] were "
                     "not read as traces")
        files = named
    decode = [p for p in files if _DECODE_TRACE.search(p.name)]
    if decode and len(decode) < len(files):
        notes.append(f"SGLang by-stage traces: the {len(decode)} -DECODE trace(s) were read, "
                     f"{len(files) - len(decode)} other stage(s) left out")
        files = decode
    return files, None, notes


def _regular(path: Path) -> Path:
    """`path`, when it is a regular file (followed through links): the one kind of file a trace is
    read from (a FIFO blocks the hash's open, /dev/zero never ends)."""
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise TraceError(path, f"cannot read ({e.strerror})") from None
    if not stat.S_ISREG(mode):
        raise TraceError(path, f"is {describe_kind(mode)}, not a trace file")
    return path


def hash_traces(files: list[Path], distinct: int = 0) -> str:
    """Content hash of the traces' bytes (file order fixed by rank), the run's identity."""
    return digest_traces(files, distinct)[0]


def digest_traces(files: list[Path], distinct: int = 0) -> tuple[str, list[tuple[int, str]]]:
    """In one read of each file: the content hash of all (hash_traces) and each file's (bytes,
    sha256), which the dashboard checks before it serves the file (app/traces.py). The first
    `distinct` files must differ from each other (a run's own traces: one a rank): two with the
    same bytes are refused here, as soon as the second is hashed, before any is decoded (a bundle
    listing one trace 300 times was read 300 times before its ranks were found to clash)."""
    h = hashlib.blake2b(digest_size=20)
    each = []
    seen: dict[str, Path] = {}
    for index, f in enumerate(files):
        one, size = hashlib.sha256(), 0
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                    one.update(chunk)
                    size += len(chunk)
        except OSError as e:
            raise TraceError(f, f"cannot read ({e.strerror})") from None
        h.update(b"\0file\0")
        each.append((size, one.hexdigest()))
        if index < distinct:
            twin = seen.setdefault(one.hexdigest(), f)
            if twin != f:
                raise TraceError(f, f"has the same bytes as {twin.name}: one trace given twice (a run holds one "
                                    "trace a rank)")
    return h.hexdigest(), each


def describe_trace_files(path: Path, files: list[Path], digests: list[tuple[int, str]]) -> tuple[str, list[dict]]:
    """(trace_root, trace_digests) of a run (db.store.RunRecord): the directory its traces lie in,
    resolved (the path itself, or a plain trace's directory), and each trace's name there, size
    and sha256, as the dashboard checks them before it serves one."""
    root = path.resolve() if path.is_dir() else path.resolve().parent
    names = [f.resolve().name if not path.is_dir() else f.name for f in files]
    return str(root), [{"name": n, "bytes": b, "sha256": d} for n, (b, d) in zip(names, digests)]


def analyse_files(files: list[Path], rules: list[Rule], steps: int | None,
                  limits: ReadLimits = DEFAULT_LIMITS, meter: ReadMeter | None = None,
                  workers: int | None = None, mappings: list[Path] | None = None) -> list[RankFigures]:
    """Each file's figures, in rank order. Several files are read at once, each in a process of
    its own (`workers`, default `rank_workers()`: the CPUs, bounded by memory; ingest/traces/rank_pool.py),
    with the same figures as rank after rank; a single file is read here (by two processes when
    it is large). `meter` hears how far the reading got (for a progress bar). `mappings`, one
    graph-off trace per file, attribute each file's graph kernels (analyse.attribute_graph_kernels)."""
    if workers is None:
        workers = rank_workers(json_sizes(files))

    def one(index: int, split: bool | None = None) -> RankFigures:
        # (the mapping is read outside the meter, which counts the run's own files)
        mapping = read_trace(mappings[index], split=split, limits=limits) if mappings else None
        with metered(meter.slot(index) if meter is not None else None):
            return analyse_trace(read_trace(files[index], split=split, limits=limits), rules, steps, mapping)

    done = meter.finished if meter is not None else None
    if workers > 1 and len(files) > 1:
        # readers in flight share the CPUs: each reads its file in one process
        figures = map_in_processes(len(files), lambda index: one(index, split=False), workers, done)
    else:
        figures = []
        for index in range(len(files)):
            figures.append(one(index))
            if done is not None:
                done(index)
    ranks = [f.rank for f in figures]
    if len(set(ranks)) != len(ranks):
        raise IngestError(f"{files[0].parent}: several traces claim the same rank ({sorted(ranks)})")
    return sorted(figures, key=lambda f: f.rank)


def _median_per_step(values: np.ndarray, step: np.ndarray, steps: int) -> float | None:
    """Median over the steps of each step's sum of `values` (steps without any count as 0)."""
    if steps <= 0:
        return None
    inside = step >= 0
    return float(np.median(np.bincount(step[inside], weights=values[inside], minlength=steps)[:steps]))


def _median_of_known(values: np.ndarray) -> float:
    """The median of the values that are not NaN (NaN when none is), as pandas' median skips NaN."""
    known = values[~np.isnan(values)]
    return float(np.median(known)) if len(known) else math.nan


def build_rank_stats(figures: list[RankFigures]) -> tuple[Table, list[str]]:
    """One row per rank: its median step time, and the medians over steps of its busy time,
    communication time and wait for the last rank in collectives; with the notes that go with
    them. Medians, because the first profiled step of a multi-rank run often holds one long
    wait for a rank whose profiler started later."""
    busy, comm = [], []
    for f in figures:
        cats = f.step_categories
        mine = cats["category"] == "communication"
        per_step = np.bincount(cats["step"][mine], weights=cats["dur_us"][mine], minlength=f.steps)[:f.steps]
        busy.append(_median_of_known(f.step_table["gpu_busy_us"]) / 1e3 if f.steps else None)
        comm.append(float(np.median(per_step)) / 1e3 if f.steps else 0.0)
    columns = {"rank": np.array([f.rank for f in figures], np.int64),
               "device_name": np.array([f.device_name for f in figures], dtype=object),
               "steps": np.array([f.steps for f in figures], np.int64),
               "step_ms_median": _floats([f.step_ms_median for f in figures]),
               "busy_ms_median": _floats(busy), "comm_ms_median": _floats(comm),
               "between_steps_ms": _floats([f.between_steps_us / 1e3 for f in figures]),
               "wait_ms_median": np.full(len(figures), math.nan),
               "last_arrivals": np.full(len(figures), math.nan),  # NaN (stored as NULL) until computed
               "collectives": np.array([len(f.comm_start_us) for f in figures], np.int64)}
    notes: list[str] = []
    if len(figures) < 2 or not any(len(f.comm_start_us) for f in figures):
        return Table(columns), notes
    waits = find_waits([f.comm_start_us for f in figures], [f.comm_end_us for f in figures])
    if waits is None:
        notes.append("ranks ran different numbers of communication kernels "
                     f"({', '.join(str(len(f.comm_start_us)) for f in figures)}): waits between ranks not computed")
        return Table(columns), notes
    wait = _floats([(_median_per_step(waits.wait_us[i], f.comm_step, f.steps) or 0.0) / 1e3
                    for i, f in enumerate(figures)])
    columns["wait_ms_median"] = wait
    columns["last_arrivals"] = np.array(waits.last_arrivals, np.int64)
    # who keeps whom waiting: [q, r] = q's median wait per step in the collectives r reached last
    matrix = waits_for(waits, [f.comm_step for f in figures], [f.steps for f in figures])
    n = len(figures)
    kept = np.array([np.delete(matrix[:, r], r).mean() for r in range(n)])  # each other rank's wait for r
    # (in memory only, for the pattern text: the first rank's wait for each rank; not stored)
    columns["first_waits_for_ms"] = matrix[0]
    worst = int(np.argmax(kept))
    most_last = int(np.argmax(waits.last_arrivals))
    text = (f"rank {figures[worst].rank} keeps the other ranks waiting longest: each waits {kept[worst]:.3f} ms per "
            f"step for it (median over steps), in the {waits.last_arrivals[worst]} of {waits.collectives} "
            "collectives it reached last")
    if most_last != worst and waits.last_arrivals[most_last] > waits.last_arrivals[worst]:
        text += (f"; rank {figures[most_last].rank} reached more of them last ({waits.last_arrivals[most_last]}) "
                 f"but keeps each waiting {kept[most_last]:.3f} ms per step")
    notes.append(text)
    return Table(columns), notes


def _floats(values: list) -> np.ndarray:
    """Numbers as a float array, None as NaN."""
    return np.array([math.nan if v is None else v for v in values], float)


def build_record(path: Path, files: list[Path], figures: list[RankFigures], manifest: Manifest | None,
                 opts: ImportOptions, content_hash: str) -> RunRecord:
    lead = figures[0]
    rank_stats, rank_notes = build_rank_stats(figures)
    m = manifest
    tok = opts.tok_per_s if opts.tok_per_s is not None else (m.tok_per_s if m else None)
    layers = opts.layers if opts.layers is not None else (m.layers if m else None)
    repo = opts.repo or (m.repo if m else None)
    commit = opts.commit or (m.commit if m else None)
    if commit and not repo:
        repo = "default"
    return RunRecord(
        content_hash=content_hash, repo=repo, commit=commit,
        variant=opts.variant or (m.variant if m else None),
        engine=m.engine if m else None,
        workload=m.workload if m else None,
        device_name=lead.device_name, peak_gbps=lead.peak_gbps, roofline=lead.roofline, ranks=len(figures),
        steps=lead.steps, step_method=lead.step_method, step_ms_median=lead.step_ms_median,
        tok_per_s=tok, layers=layers, copy_share=lead.copy_share, gpu_busy_share=lead.gpu_busy_share,
        kernel_us_total=lead.kernel_us_total, kernels_from_cpu_ops=lead.kernels_from_cpu_ops,
        source_path=str(path.resolve()),
        manifest=_manifest_dict(m),
        step_table=Table.concat([f.step_table.with_columns(rank=f.rank) for f in figures]),
        step_categories=Table.concat([f.step_categories.with_columns(rank=f.rank) for f in figures]),
        kernel_stats=Table.concat([f.kernel_stats.with_columns(rank=f.rank) for f in figures]),
        workload_key=find_workload_key(m.workload if m else None),
        batch_size=(m.workload.get("batch_size") if m else None),
        timing_ms_median=m.timing.median_ms if m and m.timing else None,
        timing_ms_p10=m.timing.p10_ms if m and m.timing else None,
        timing_ms_p90=m.timing.p90_ms if m and m.timing else None,
        job_id=opts.job_id,
        **read_sweep_fields(m, opts),
        **read_engine_figures(m),
        notes=list(lead.notes) + rank_notes + _attribution_notes(lead.graph_attribution),
        rank_stats=rank_stats,
        graph_attribution=lead.graph_attribution,
    )


# The one-batch benchmark's JSONL fields (sglang 0.5.23 benchmark/one_batch.py latency_test_run_once's
# measurement_results: latencies in s, throughputs in tok/s) and the run columns they are kept in
_JSONL_FIGURES = (("prefill_latency", "prefill_ms", 1000.0), ("prefill_throughput", "prefill_tok_per_s", 1.0),
                  ("median_decode_latency", "decode_ms_median", 1000.0),
                  ("median_decode_throughput", "decode_tok_per_s_median", 1.0),
                  ("total_latency", "total_latency_ms", 1000.0))


def read_engine_figures(m: Manifest | None) -> dict:
    """The engine's own figures of the run, as run columns (migration 015): an sglang bundle's JSONL
    record (manifest extra "result"), and the peak GPU memory where the engine reports one (extra
    "peak_gpu_mem_bytes"); a figure that is missing or not a finite number is left out (NULL)."""
    extra = (m.extra or {}) if m is not None else {}
    record = extra.get("result") if isinstance(extra.get("result"), dict) else {}
    figures = {}
    for key, column, scale in _JSONL_FIGURES:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            figures[column] = float(value) * scale
    peak = extra.get("peak_gpu_mem_bytes")
    if isinstance(peak, int) and not isinstance(peak, bool) and peak > 0:
        figures["peak_gpu_mem_bytes"] = peak
    return figures


def read_sweep_fields(m: Manifest | None, opts: ImportOptions) -> dict:
    """The sweep a run is a point of: the importing job's (opts), else the bundle's (extra "sweep")."""
    if opts.sweep_id is not None:
        return {"sweep_id": opts.sweep_id, "sweep_point": opts.sweep_point}
    sweep = ((m.extra or {}) if m is not None else {}).get("sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("id"), str) and is_label(sweep["id"]):
        point = sweep.get("point")
        return {"sweep_id": sweep["id"], "sweep_point": point if isinstance(point, int) and point >= 0 else None}
    return {}


def _attribution_notes(summary: dict | None) -> list[str]:
    """What a reader must know about the graph-kernel attribution: kernels left unmatched, steps refused."""
    if not summary:
        return []
    notes = []
    if summary["unmatched"]:
        notes.append(f"{summary['unmatched']:,} of the {summary['kernels']:,} kernels replayed from CUDA graphs "
                     f"found no twin in the {summary['method']}: their op, line and layer are unknown")
    if summary["steps_refused"]:
        notes.append(f"{summary['steps_refused']} step(s) were not attributed: too few of their kernels align with "
                     f"the {summary['method']}'s (ingest/traces/graph_attribution.py, MIN_STEP_MATCH)")
    return notes


def find_mapping(mapping: str | None, manifest: Manifest | None, path: Path, files: list[Path]) -> list[Path]:
    """The graph-off trace of each trace file: `--mapping`'s file(s), else the bundle's mapping
    traces, else none; one per trace file, paired in the (rank) order the files are listed."""
    if mapping is not None:
        where = Path(mapping)
        if not where.exists():
            raise IngestError(f"{where}: no such file or directory (--mapping)")
        found, _, _ = find_traces(where)
    elif manifest is not None and manifest.mapping_traces:
        found = [path / name for name in manifest.mapping_traces]
    else:
        return []
    if len(found) != len(files):
        raise IngestError(f"{mapping or path}: {len(found)} mapping trace(s) for {len(files)} trace(s): "
                          "give one graph-off trace per rank")
    return found


def find_workload_key(workload: dict | None) -> str | None:
    """Runs with the same key form one trend series (per repo, engine, device and variant)."""
    if not workload:
        return None
    return json.dumps({k: v for k, v in workload.items() if k not in _NOT_SERIES}, sort_keys=True)


def _manifest_dict(m: Manifest | None) -> dict | None:
    return asdict(m) if m is not None else None


def _read_catalog(path: Path) -> list[Pattern]:
    """A catalog file's patterns: a regular file, size and depth limited (ingest/user_files.py)."""
    text = read_user_text(path, PatternError)
    parse_user_table(text, path, PatternError, as_json=False)  # its depth, before parse_catalog's tomllib
    return parse_catalog(text, str(path))


@functools.cache
def _builtin_catalog() -> tuple[Pattern, ...]:
    return tuple(_read_catalog(DEFAULT_CATALOG))


def load_pattern_catalog(user_file: str | Path | None = None) -> tuple[Pattern, ...]:
    """The built-in pattern catalog (ingest/regress/patterns.toml) with the user's file's patterns:
    one of the same id replaces a built-in one. Raises PatternError naming the file and field."""
    if user_file is None:
        return _builtin_catalog()
    return tuple(combine_catalogs(list(_builtin_catalog()), _read_catalog(Path(user_file))))


def check_record(record: RunRecord, timeline: dict | None, catalog: tuple[Pattern, ...]) -> RunRecord:
    """The record with what the import checks about it: its first rank's timeline figures, whether
    its figures agree (ingest/regress/consistency.py) and the pattern catalog's findings."""
    batch = record.batch_size or (record.workload or {}).get("batch_size") or (timeline or {}).get("span_batch_size")
    consistency = check_consistency(timeline, record.tok_per_s, batch, record.timing_ms_median)
    patterns = None
    if record.step_ms_median and len(record.kernel_stats):
        facts = dataclasses.replace(facts_from_record(record), batch_size=batch)
        patterns = find_patterns(list(catalog), facts, timeline, _waiting(record))
    return dataclasses.replace(record, timeline=timeline, consistency=consistency, patterns=patterns)


def _waiting(record: RunRecord) -> tuple[int, float, int] | None:
    """(the first rank, its median wait per step in the collectives of the rank it waits for most,
    that rank) for a multi-rank run whose waits were computed; else None. (Its rank_stats: the
    Table build_rank_stats made, with its in-memory `first_waits_for_ms`; a record made elsewhere
    has none, and gets None.)"""
    stats = record.rank_stats
    if stats is None or len(stats) < 2 or "first_waits_for_ms" not in stats:
        return None
    waits = np.asarray(stats["first_waits_for_ms"], dtype=float)
    if np.isnan(waits).any():
        return None
    ranks = np.asarray(stats["rank"])
    r = int(np.argmax(waits))
    return int(ranks[0]), float(waits[r]), int(ranks[r])


def prepare_import(path: str | Path, rules: list[Rule], opts: ImportOptions,
                   watch: Callable[[ReadMeter], AbstractContextManager] | None = None) -> RunRecord:
    """Read and analyse everything a path stands for; raise IngestError on bad input. `watch`
    (e.g. progress.ImportBar) is given the reading's meter and held open while the files are read."""
    path = Path(path)
    for field in ("repo", "commit", "variant"):
        check_label(field, getattr(opts, field))
    for field in ("layers", "steps"):
        value = getattr(opts, field)
        if value is not None and value <= 0:
            raise IngestError(f"--{field} {value}: must be a positive integer")
    if opts.tok_per_s is not None and not opts.tok_per_s > 0:
        raise IngestError(f"--tok-per-s {opts.tok_per_s}: must be a positive number")
    files, manifest, file_notes = find_traces(path)
    mappings = find_mapping(opts.mapping, manifest, path, files)
    steps = opts.steps if opts.steps is not None else (manifest.profiled_steps if manifest else None)
    content_hash, digests = digest_traces(files + mappings, distinct=len(files))  # attributed or not: two runs
    try:
        if watch is None:
            figures = analyse_files(files, rules, steps, opts.limits, mappings=mappings)
        else:
            meter = ReadMeter(files)
            with watch(meter):
                figures = analyse_files(files, rules, steps, opts.limits, meter, mappings=mappings)
    except TraceError as e:
        raise _with_files_left_out(e, path, files, manifest) from None
    record = build_record(path, files, figures, manifest, opts, content_hash)
    trace_root, trace_digests = describe_trace_files(path, files, digests[:len(files)])
    record = dataclasses.replace(record, notes=file_notes + record.notes, trace_root=trace_root,
                                 trace_digests=trace_digests)
    record = dataclasses.replace(record, diagnosis=diagnose_record(record))
    return check_record(record, figures[0].timeline,
                        opts.patterns if opts.patterns is not None else load_pattern_catalog())


def _with_files_left_out(error: TraceError, path: Path, files: list[Path], manifest) -> TraceError:
    """A directory's file named like a trace that is not one (an execution trace named
    `*.pt.trace.json`, as ASTRA-sim's results name them, say), while the directory's other JSON
    files were left out by their names: the error says so, and how to read those instead."""
    not_a_trace = error.problem.startswith(("has no 'traceEvents' array", "is not a trace"))
    if manifest is not None or not path.is_dir() or not not_a_trace:
        return error
    left = sorted(p.name for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)
                  and p not in files)
    if not left:
        return error
    some = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    return TraceError(error.path, f"{error.problem} (a directory is read by its files named *.trace.json[.gz] when it "
                                  f"has any; its {len(left)} other JSON file(s), {some}, were not read: put the traces "
                                  "in a directory of their own, or import them one by one)")


def diagnose_record(record) -> list[dict] | None:
    """The run's diagnosis sentences (the kernels that take most of the step)."""
    if not record.step_ms_median or record.step_ms_median <= 0 or not len(record.kernel_stats):
        return None
    return [dataclasses.asdict(f) for f in diagnose_run(facts_from_record(record))]
