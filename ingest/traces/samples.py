"""The sample runs behind the dashboard's first start: real H200 bundles in app/sample_data."""

from __future__ import annotations

import json
from pathlib import Path

from db.store import open_db
from kernels.bundle import is_bundle

from .categories import Rule
from .importer import ImportOptions, prepare_import

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "app" / "sample_data"


def load_samples(db_path: str, rules: list[Rule], sample_dir: Path = SAMPLE_DIR) -> int:
    """Import every bundle in sample_dir and record its commits' facts; returns runs added."""
    facts = json.loads((sample_dir / "commits.json").read_text())
    records = [prepare_import(d, rules, ImportOptions()) for d in sorted(sample_dir.iterdir()) if is_bundle(d)]
    added = 0
    with open_db(db_path) as store:
        for record in records:
            _, created = store.insert_run(record)
            added += created
        for repo in facts["repos"]:
            for c in repo["commits"]:
                store.record_commit(repo["repo"], c["sha"], c["committed_at"], c["author"], c["subject"], c["seq"])
    return added
