"""Shared pytest setup: tests marked `gpu` are skipped when torch has no CUDA device; the
dashboard's fixtures are registered here, once, so that the session's fixture database is built
once for every module that uses it (it was rebuilt in each module that imported the fixture,
2-5 s a module; its builder and the bundles' names are in tests/test_app_fixtures.py)."""

import shutil
from pathlib import Path

import pytest

# (the dashboard's modules are imported inside the fixtures: the GPU machine runs
# tests/test_kernels_gpu.py with torch and triton only, no Streamlit or DuckDB)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (run on the lent H200)")


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
    from tests.test_app_fixtures import build_dashboard_db

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
        at = AppTest.from_file(str(ROOT / "app" / "main.py"), default_timeout=60)
        at.switch_page(f"screens/{page}.py")
        for key, value in params.items():
            at.query_params[key] = value
        return at.run()

    return open_
