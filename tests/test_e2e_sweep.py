"""The sweep page in a real browser (Debian's headless chromium through Playwright) against
`streamlit run app/main.py` on a database of the sample runs (`python -m ingest samples`, whose
H200 sweep is glm5 under CUDA graphs at bs 1-128, whole-pool cast and fused): at 1280x800 the
answer to "what does the patch buy at bs 32?" is on the screen without scrolling, in the sentence
and in the table's bs-32 row. Screenshots go to tests/artifacts/e2e/ (ignored by git). Skipped
where chromium is not installed, except in CI (CI=true), where a missing browser fails."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import pytest

from tests.browser import CHROMIUM, CHROMIUM_ARGS, need_browser, serve_dashboard
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # a browser over streamlit

SHOTS = ROOT / "tests" / "artifacts" / "e2e"
ROW_PX = 35  # st.dataframe's row height (its header's too), Streamlit 1.67


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    need_browser()
    db = tmp_path_factory.mktemp("e2e-sweep") / "stepwatch.duckdb"
    env = {**os.environ, "STEPWATCH_DB": str(db), "PYTHONUNBUFFERED": "1"}
    env.pop("STEPWATCH_CONFIG", None)
    loaded = subprocess.run([sys.executable, "-m", "ingest", "samples", "--db", str(db)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    with serve_dashboard(env) as base:
        yield base, db


def test_the_sweep_answers_bs_32_above_the_fold_at_1280x800(dashboard):
    from playwright.sync_api import sync_playwright

    from db.store import open_db

    base, db = dashboard
    with open_db(db, read_only=True) as store:  # the newest of fused's three runs at bs 32 x 1K: the point's run
        [(fused_32,)] = store.con.execute(
            "SELECT max(run_id) FROM runs WHERE variant = 'fused' AND batch_size = 32"
            " AND workload->>'$.context' = '1024'").fetchall()

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="stepwatch-chromium-") as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True,
                                                       args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 800})
        context.set_default_timeout(120_000)
        page = context.new_page()
        page.goto(f"{base}/sweep")
        sentence = page.get_by_text("6.1x at bs 32", exact=False).first
        sentence.wait_for()
        page.locator('[data-testid="stVegaLiteChart"]').first.locator('[role="graphics-symbol"]').first.wait_for()
        grid = page.locator('[data-testid="stDataFrame"]').first
        grid.wait_for()
        page.wait_for_timeout(600)
        page.screenshot(path=str(SHOTS / "sweep-1280x800.png"))
        assert "fused is 11.9x faster than full-pool-cast at bs 1, 6.1x at bs 32" in sentence.inner_text()
        box, table = sentence.bounding_box(), grid.bounding_box()
        assert box["y"] + box["height"] <= 800, box  # the sentence is above the fold
        # the grid draws its cells on a canvas; its accessible copy holds each row's values (aria-rowindex 1:
        # the header): fused at bs 32, three runs a side pooled
        rows = grid.locator('tr[role="row"]')
        cells = {int(r.get_attribute("aria-rowindex")): [c.inner_text() for c in r.locator("td").all()]
                 for r in rows.all()}
        [(index, bs32)] = [(i, c) for i, c in cells.items() if c[:2] == ["32", "fused"]]
        assert bs32[2].startswith("95.77") and bs32[3].startswith("15.64") and bs32[4].startswith("6.12")
        assert bs32[5] == "6.114x to 6.132x" and bs32[6] == "improvement"
        # and its row is on the screen: rows of ROW_PX under the grid's top (Streamlit's default row height)
        assert table["y"] + ROW_PX * index <= 800, (table, index)
        # a point of the tok/s chart opens its run: fused at bs 32
        point = page.locator('[aria-roledescription="point"][aria-label*="variant: fused"]'
                             '[aria-label*="batch size: 32;"][aria-label*="tok/s: 2,045.8"]')
        point.first.scroll_into_view_if_needed()
        box = point.first.bounding_box()
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_url(re.compile(r"/run\?run=\d+"))
        assert page.url.endswith(f"/run?run={fused_32}")
        context.close()
