"""The diagnosis sentences the Compare page shows for two runs, from their overview rows and
kernel tables (db.views.get_comparison). The app imports the pure functions of
ingest.regress.diagnose here, on purpose: they are functions of plain values and DataFrames with
no database or I/O, and the sentences must read the same as those stored by the importer and
the change tracker."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ingest.regress.diagnose import RunFacts, diagnose_change, diagnose_patch


def build_run_facts(run: dict[str, Any], kernels: pd.DataFrame) -> RunFacts:
    """RunFacts of a Store.get_run row and its Store.list_kernels frame (rank 0)."""
    workload = run["workload"] or {}
    return RunFacts(step_ms=run["step_ms"], kernels=kernels, tok_per_s=run["tok_per_s"],
                    profiled_step_ms=run["step_ms_median"],
                    batch_size=run["batch_size"] or workload.get("batch_size"),
                    layers=run["layers"] or workload.get("layers"), device_name=run["device"] or None,
                    peak_gbps=run["peak_gbps"], workload=workload, commit=run["sha"], variant=run["variant"] or None)


def is_patch_pair(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two runs of one workload on one GPU at one commit with different variants: B is A patched."""
    return (a["sha"] is not None and a["sha"] == b["sha"] and a["variant"] != b["variant"]
            and (a["repo"], a["engine"], a["device"], a["workload_id"]) == (b["repo"], b["engine"], b["device"],
                                                                            b["workload_id"]))


def diagnose_pair(a: dict[str, Any], b: dict[str, Any], kernels_a: pd.DataFrame,
                  kernels_b: pd.DataFrame) -> list[str]:
    """What B changes against A, as sentences: a patch's effect for a patched/unpatched pair at
    one commit, else the change from A to B and the kernels that explain it. Raises
    RegressError for runs that cannot be diagnosed (no step time, say)."""
    before, after = build_run_facts(a, kernels_a), build_run_facts(b, kernels_b)
    findings = diagnose_patch(before, after) if is_patch_pair(a, b) else diagnose_change(before, after)
    return [f.text for f in findings]
