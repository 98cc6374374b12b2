"""The import engine: a trace, directory of per-rank traces or bundle that already exists on this
machine (`spec.path`) is the run's result as it is; the worker imports it like any bundle."""

from __future__ import annotations

from pathlib import Path

from ..errors import SpecError
from ..hosts import Host
from ..spec import Config, RunSpec
from .base import Checkout, Engine, EngineIO


def check_import(spec: RunSpec, config: Config, host: Host) -> None:
    """The path must exist here (the importer says what is wrong with its contents)."""
    if not Path(spec.path).exists():
        raise SpecError(f"spec.path: {spec.path} does not exist on this machine")


def _run(spec: RunSpec, config: Config, host: Host, checkout: Checkout, work_dir: Path, io: EngineIO) -> Path:
    return Path(spec.path)


ENGINE = Engine("import", check_import, _run)
