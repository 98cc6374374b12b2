"""stepwatch's dashboard: `streamlit run app/main.py`. It reads the DuckDB file named by
$STEPWATCH_DB (default stepwatch.duckdb); each page is a file under app/screens/ (not pages/:
a pages/ folder beside the entry script would switch Streamlit to its older file-based navigation)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `app` and `db` import by name

import streamlit as st  # noqa: E402

# a bundled favicon (a 64 px PNG drawn for stepwatch with Pillow): a Material icon here would be
# fetched by every viewer's browser from fonts.gstatic.com
st.set_page_config(page_title="stepwatch", page_icon=str(Path(__file__).resolve().parent / "static" / "favicon.png"),
                   layout="wide")
TRENDS = st.Page("screens/trends.py", title="Trends", icon=":material/show_chart:", url_path="home", default=True)


def _trends_by_name() -> None:
    """/trends: the default page's address is "/" whatever its url_path, so a typed or kept /trends
    would open Streamlit's "Page not found" dialog; this hidden page sends it to "/" with its query."""
    st.switch_page(TRENDS, query_params={key: st.query_params.get_all(key) for key in st.query_params})


st.navigation([
    TRENDS,
    st.Page(_trends_by_name, title="Trends", url_path="trends", visibility="hidden"),
    st.Page("screens/run.py", title="Run", icon=":material/bar_chart:", url_path="run"),
    st.Page("screens/compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
    st.Page("screens/sweep.py", title="Sweep", icon=":material/stacked_line_chart:", url_path="sweep"),
    st.Page("screens/regressions.py", title="Regressions", icon=":material/trending_down:", url_path="regressions"),
    st.Page("screens/run_benchmark.py", title="Run a benchmark", icon=":material/play_arrow:",
            url_path="run_benchmark"),
]).run()
