"""The sample runs behind the dashboard's first start: real H200 bundles in app/sample_data.

Two kinds: the bundles at the top of app/sample_data, each naming its own commit; and the sweeps
under app/sample_data/sweeps/ (one folder of bundles a sweep, listed in sweeps/sweeps.json with
the commit they measured: kernels.studies.sweep_capture writes bundles with no commit of their
own, the all-zero sha, so the commit is given at import as `ingest import --commit` gives it)."""

from __future__ import annotations

import json
from pathlib import Path

from db.store import open_db
from kernels.bundle import is_bundle

from .categories import Rule
from .importer import ImportOptions, prepare_import

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "app" / "sample_data"
SWEEPS = Path("sweeps") / "sweeps.json"  # under a sample dir: {"sweeps": [{"dir", "repo", "commit", ...}]}


def list_sample_bundles(sample_dir: Path = SAMPLE_DIR) -> list[tuple[Path, ImportOptions]]:
    """Every sample bundle with the options it is imported with: the top-level bundles as they
    are, then each sweep's bundles (sweeps/sweeps.json) at the sweep's repo and commit."""
    found = [(d, ImportOptions()) for d in sorted(sample_dir.iterdir()) if is_bundle(d)]
    listing = sample_dir / SWEEPS
    if listing.is_file():
        for sweep in json.loads(listing.read_text())["sweeps"]:
            options = ImportOptions(repo=sweep["repo"], commit=sweep["commit"])
            found += [(d, options) for d in sorted((listing.parent / sweep["dir"]).iterdir()) if is_bundle(d)]
    return found


def load_samples(db_path: str, rules: list[Rule], sample_dir: Path = SAMPLE_DIR) -> int:
    """Import every sample bundle and record its commits' facts; returns runs added."""
    facts = json.loads((sample_dir / "commits.json").read_text())
    records = [prepare_import(d, rules, options) for d, options in list_sample_bundles(sample_dir)]
    added = 0
    with open_db(db_path) as store:
        for record in records:
            _, created = store.insert_run(record)
            added += created
        for repo in facts["repos"]:
            for c in repo["commits"]:
                store.record_commit(repo["repo"], c["sha"], c["committed_at"], c["author"], c["subject"], c["seq"])
    return added
