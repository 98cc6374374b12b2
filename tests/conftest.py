"""Shared pytest setup, and the fixtures more than one module uses, registered here once.

The fast loop is `./test.sh -m "not slow"` (about a minute on a 2-core machine): every package's
core logic (reader exactness on small traces, db and views, detection, diagnosis, verdicts, spec
parsing, charts, hosts, kernels on the CPU). Tests marked `slow` (pyproject.toml registers the
markers) start real processes (workers, imports, the CLI, sshd, git), open pages in AppTest or a
browser, read the large traces or run the detector study; `./test.sh` runs everything, as CI does.
Tests marked `gpu` are skipped when torch has no CUDA device.

Fixtures: `dashboard_db` (the fixture database, tests/dashboard_fixture.py, built once a session),
`writable_db` (a copy a test may write), `open_page` (an AppTest of one page), `sshd` (a real sshd
on 127.0.0.1) and `sglang_wheel` (the sglang 0.5.23 wheel, tests/sglang_wheel.py). Plain helpers
live in tests/helpers.py and tests/browser.py; no test module imports another."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

# (the dashboard's modules are imported inside the fixtures: the GPU machine runs
# tests/test_kernels_gpu.py with torch and triton only, no Streamlit or DuckDB)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def dashboard_db(tmp_path_factory) -> Path:
    from tests.dashboard_fixture import build_dashboard_db

    return build_dashboard_db(tmp_path_factory.mktemp("dashboard") / "stepwatch.duckdb")


@pytest.fixture
def writable_db(dashboard_db, tmp_path) -> Path:
    return Path(shutil.copy(dashboard_db, tmp_path / "stepwatch.duckdb"))


@pytest.fixture
def open_page(monkeypatch):
    """open_page(db, "run", run="5") -> the AppTest of app/main.py on that page, run once."""

    from streamlit.testing.v1 import AppTest

    from tests.helpers import ROOT

    def open_(db: Path, page: str, **params: str) -> "AppTest":
        monkeypatch.setenv("STEPWATCH_DB", str(db))
        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=180)  # a ceiling for a loaded machine
        if page != "trends":  # the default page, which a browser opens at "/": no switch, as there
            at.switch_page(f"screens/{page}.py")
        for key, value in params.items():
            at.query_params[key] = value
        return at.run()

    return open_


@pytest.fixture(scope="session")
def sshd() -> dict[str, str]:
    """A real sshd on 127.0.0.1 (scripts/start_sshd.sh, started once or found running): its
    settings (user, port, key, known hosts) from DIR/env. The SSH tests fail in CI (CI=true) when
    it cannot be started, and are skipped with the script's reason elsewhere."""
    from tests.helpers import ROOT

    sshd_dir = os.environ.get("STEPWATCH_TEST_SSHD_DIR", "/tmp/stepwatch-sshd")
    proc = subprocess.run([str(ROOT / "scripts" / "start_sshd.sh"), sshd_dir], capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        reason = f"scripts/start_sshd.sh failed: {(proc.stderr.strip().splitlines() or ['no message'])[-1]}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    lines = Path(sshd_dir, "env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.fixture(scope="session")
def sglang_wheel() -> Path:
    """The sglang 0.5.23 wheel (tests/sglang_wheel.py): one download, one cache, for the session."""
    from tests.sglang_wheel import fetch_sglang_wheel

    return fetch_sglang_wheel()
