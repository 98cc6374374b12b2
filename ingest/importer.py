"""From a path on disk (a trace, a directory of per-rank traces, or a result bundle) to a run
in the database: find the traces, read and analyse each rank, then write everything in one
transaction. Nothing touches the database until every file has been read successfully."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from db.store import RunRecord
from kernels.bundle import Manifest, is_bundle, read_bundle

from .analyse import RankFigures, analyse_trace
from .categories import Rule
from .errors import IngestError, TraceError
from .trace_read import read_trace

TRACE_SUFFIXES = (".json", ".json.gz")
# workload fields that say how a run was measured or which variant it is, not what it ran
_NOT_SERIES = {"kv", "timing_steps", "warmup_steps", "profiled_steps", "profile_steps", "with_stack",
               "record_shapes", "seed"}
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/@=:-]*$")


@dataclass(frozen=True)
class ImportOptions:
    repo: str | None = None
    commit: str | None = None
    variant: str | None = None
    layers: int | None = None
    tok_per_s: float | None = None
    steps: int | None = None
    job_id: int | None = None


def check_label(field: str, value: str | None) -> str | None:
    """A repo, commit or variant label: letters, digits and ._+/@=:- , not starting with '-'."""
    if value is None:
        return None
    if not _LABEL.fullmatch(value) or len(value) > 200:
        raise IngestError(f"--{field} {value!r}: use letters, digits and ._+/@=:- (not starting with '-')")
    return value


def find_traces(path: Path) -> tuple[list[Path], Manifest | None]:
    """The trace files a path stands for, and the bundle manifest if it is a bundle."""
    if not path.exists():
        raise IngestError(f"{path}: no such file or directory")
    if path.is_file():
        return [path], None
    if is_bundle(path):
        manifest = read_bundle(path)
        return [path / name for name in manifest.traces], manifest
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    if not files:
        raise IngestError(f"{path}: directory holds no trace files (*.json or *.json.gz)")
    return files, None


def hash_traces(files: list[Path]) -> str:
    """Content hash of the traces' bytes (file order fixed by rank), the run's identity."""
    h = hashlib.blake2b(digest_size=20)
    for f in files:
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        except OSError as e:
            raise TraceError(f, f"cannot read ({e.strerror})") from None
        h.update(b"\0file\0")
    return h.hexdigest()


def analyse_files(files: list[Path], rules: list[Rule], steps: int | None) -> list[RankFigures]:
    figures = [analyse_trace(read_trace(f), rules, steps) for f in files]
    ranks = [f.rank for f in figures]
    if len(set(ranks)) != len(ranks):
        raise IngestError(f"{files[0].parent}: several traces claim the same rank ({sorted(ranks)})")
    return sorted(figures, key=lambda f: f.rank)


def build_record(path: Path, files: list[Path], figures: list[RankFigures], manifest: Manifest | None,
                 opts: ImportOptions, content_hash: str) -> RunRecord:
    lead = figures[0]
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
        device_name=lead.device_name, peak_gbps=lead.peak_gbps, ranks=len(figures),
        steps=lead.steps, step_method=lead.step_method, step_ms_median=lead.step_ms_median,
        tok_per_s=tok, layers=layers, copy_share=lead.copy_share, gpu_busy_share=lead.gpu_busy_share,
        kernel_us_total=lead.kernel_us_total, kernels_from_cpu_ops=lead.kernels_from_cpu_ops,
        source_path=str(path.resolve()),
        manifest=_manifest_dict(m),
        step_table=pd.concat([f.step_table.assign(rank=f.rank) for f in figures], ignore_index=True),
        step_categories=pd.concat([f.step_categories.assign(rank=f.rank) for f in figures], ignore_index=True),
        kernel_stats=pd.concat([f.kernel_stats.assign(rank=f.rank) for f in figures], ignore_index=True),
        workload_key=find_workload_key(m.workload if m else None),
        batch_size=(m.workload.get("batch_size") if m else None),
        timing_ms_median=m.timing.median_ms if m and m.timing else None,
        timing_ms_p10=m.timing.p10_ms if m and m.timing else None,
        timing_ms_p90=m.timing.p90_ms if m and m.timing else None,
        job_id=opts.job_id,
    )


def find_workload_key(workload: dict | None) -> str | None:
    """Runs with the same key form one trend series (per repo, engine, device and variant)."""
    if not workload:
        return None
    return json.dumps({k: v for k, v in workload.items() if k not in _NOT_SERIES}, sort_keys=True)


def _manifest_dict(m: Manifest | None) -> dict | None:
    return asdict(m) if m is not None else None


def prepare_import(path: str | Path, rules: list[Rule], opts: ImportOptions) -> RunRecord:
    """Read and analyse everything a path stands for; raise IngestError on bad input."""
    path = Path(path)
    for field in ("repo", "commit", "variant"):
        check_label(field, getattr(opts, field))
    for field in ("layers", "steps"):
        value = getattr(opts, field)
        if value is not None and value <= 0:
            raise IngestError(f"--{field} {value}: must be a positive integer")
    if opts.tok_per_s is not None and not opts.tok_per_s > 0:
        raise IngestError(f"--tok-per-s {opts.tok_per_s}: must be a positive number")
    files, manifest = find_traces(path)
    steps = opts.steps if opts.steps is not None else (manifest.profiled_steps if manifest else None)
    content_hash = hash_traces(files)
    figures = analyse_files(files, rules, steps)
    record = build_record(path, files, figures, manifest, opts, content_hash)
    return dataclasses.replace(record, diagnosis=diagnose_record(record))


def diagnose_record(record) -> list[dict] | None:
    """The run's diagnosis sentences (the kernels that take most of the step)."""
    from .regress.diagnose import diagnose_run, facts_from_record

    if not record.step_ms_median or record.step_ms_median <= 0 or not len(record.kernel_stats):
        return None
    return [dataclasses.asdict(f) for f in diagnose_run(facts_from_record(record))]
