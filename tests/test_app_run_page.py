"""The Run page (AppTest) as a new user meets it (issue 34): the kernel table's rates in sight with
one byte source, the roofline that says how little it covers, the page opened without a run, an
unknown run, which step each step figure is, the tiles of the rank picked, and the trace hand-off
(one picker on a multi-rank run, a plain line where a trace is too big for the Perfetto button)."""

import base64
import json
import math

import pytest

from db import views
from db.store import open_db
from ingest.cli import main
from tests.dashboard_fixture import SAMPLES
from tests.helpers import DATA

pytestmark = pytest.mark.slow  # AppTest pages


@pytest.fixture(scope="module")
def fresh_db(tmp_path_factory):
    """As a fresh install has them: the eager glm5 whole-pool-cast run (its ops recorded with
    shapes: rates, a roofline) imported before the CUDA-graph one (no op shapes), runs 1 and 2."""
    db = tmp_path_factory.mktemp("fresh") / "fresh.duckdb"
    for bundle in ("3cf1671-glm5-full-pool-cast-eager", "3cf1671-glm5-full-pool-cast-graph"):
        assert main(["import", str(SAMPLES / bundle), "--db", str(db)]) == 0
    return db


def _metrics(at) -> dict:
    return {m.label: m.value for m in at.metric}


def _page_text(at) -> str:
    """Every element the page sent, as text (the Perfetto button's iframe and its embedded trace too)."""
    def walk(node):
        for child in getattr(node, "children", {}).values():
            yield str(getattr(child, "proto", ""))
            yield from walk(child)

    return "\n".join(walk(at._tree))


def _column_formats(at) -> dict:
    return {k: (v.get("type_config") or {}).get("format") for k, v in json.loads(at.dataframe[0].proto.columns).items()}


def test_the_kernel_table_shows_its_rates_first_from_one_byte_source(fresh_db, open_page):
    """Eager glm5 whole-pool cast: the rates and the bound among the first ten columns (in sight at
    1280 px), one TB/s and one % BW (no GB/s or % of peak beside them), no 0 TFLOP/s for the cast,
    the short name first and the full name last, calls per step printed as 78."""
    at = open_page(fresh_db, "run", run="1")
    assert not at.exception
    order = list(at.dataframe[0].proto.column_order)
    assert order[:10] == ["short_name", "share", "ms_per_step", "calls_per_step", "mean_us", "tflops_shown",
                          "tbps_shown", "compute_fraction_shown", "bw_fraction_shown", "bound"]
    assert order[-1] == "name" and not {"gbps", "peak_fraction", "tflops", "tbps"} & set(order)
    kernels = at.dataframe[0].value
    cast = kernels.iloc[0]
    assert cast["short_name"] == "unrolled_elementwise_kernel<direct_copy_kernel_cuda>"
    assert cast["tflops"] == 0 and math.isnan(cast["tflops_shown"]) and math.isnan(cast["compute_fraction_shown"])
    # 495,000 x 576 FP8 read and the same in BF16 written: the modelled bytes' rate, 0.985 TB/s
    assert cast["tbps_shown"] == pytest.approx(495_000 * 576 * 3 / cast["mean_us"] / 1e6)
    assert cast["bw_fraction_shown"] == pytest.approx(100 * cast["tbps_shown"] / 4.8)
    gemms = kernels[kernels["launcher"] == "aten::mm"]
    assert gemms["tflops_shown"].gt(0).all() and (gemms["tflops_shown"] == gemms["tflops"]).all()
    formats = _column_formats(at)
    assert formats["calls_per_step"] == "%.4g"  # 78, not "78.0"
    assert formats["tbps_shown"] == formats["tflops_shown"] == "%.3g"  # a small rate keeps its digits


@pytest.fixture(scope="module")
def mi300x_db(tmp_path_factory):
    """SGLang's Qwen3-8B decode on an MI300X (AMD TraceLens' trace), imported on its own."""
    db = tmp_path_factory.mktemp("mi300x") / "mi300x.duckdb"
    assert main(["import", str(DATA / "wild" / "tracelens__sglang_decode__sglang_Qwen3-8B_decode.json.gz"),
                 "--db", str(db)]) == 0
    return db


def test_a_kernel_with_recorded_bytes_only_gets_its_rate_in_the_one_tb_s_column(mi300x_db, open_page):
    """The MI300X decode's reduce kernel has recorded bytes (GB/s 361) but no cost model (TB/s
    None): main's table showed the two side by side; now its rate is the one TB/s column's, and a
    kernel with both shows the modelled one, with the bytes per call it rests on."""
    at = open_page(mi300x_db, "run", run="1")
    kernels = at.dataframe[0].value
    (reduce,) = [r for _, r in kernels.iterrows() if r["short_name"].startswith("reduce_kernel")
                 and math.isnan(r["tbps"]) and r["gbps"] > 300]
    assert reduce["tbps_shown"] == pytest.approx(reduce["gbps"] / 1e3)
    assert reduce["bw_fraction_shown"] == pytest.approx(reduce["peak_fraction"])  # both in percent, as shown
    assert reduce["bytes_per_call_shown"] == reduce["bytes_per_call"]
    both = kernels[kernels["tbps"].gt(0) & kernels["gbps"].notna()]
    assert len(both) and (both["tbps_shown"] == both["tbps"]).all()
    assert (both["bytes_per_call_shown"] == both["model_bytes_per_call"]).all()
    assert not {"gbps", "peak_fraction", "bytes_per_call"} & set(at.dataframe[0].proto.column_order)


def test_a_roofline_covering_a_sliver_of_kernel_time_is_not_drawn(mi300x_db, open_page):
    """The MI300X decode: only a few elementwise kernels and copies have a cost model, 0.3 % of
    kernel time at a few GB/s: no chart of "0.00 TB/s" bars, one line saying how little the
    roofline would cover."""
    at = open_page(mi300x_db, "run", run="1")
    assert not at.exception
    assert not [c for c in at.get("vega_lite_chart") if "vconcat" in json.loads(c.proto.spec)]
    (line,) = [c.value for c in at.caption if c.value.startswith("No roofline")]
    assert line.startswith("No roofline drawn: the roofline covers 0.3 % of kernel time")
    assert "under the 5 %" in line


def test_a_rate_is_printed_with_its_digits_not_as_zero():
    from app.roofline import format_rate

    assert [format_rate(x) for x in (2.0434, 0.125, 0.00395, 12.3456, 1234.5)] == [
        "2.04", "0.125", "0.00395", "12.3", "1,234"]


def test_without_a_run_the_page_opens_the_newest_run_with_rates_and_says_why(fresh_db, open_page):
    """The eager run, not the newer CUDA-graph one without rates; the page says why, and links the newest."""
    db = fresh_db
    at = open_page(db, "run")
    assert not at.exception
    assert at.query_params["run"] in ("1", ["1"])
    assert [c.value for c in at.caption][0] == (
        "No run in the address: this is run 1, the newest run whose kernels have measured rates (a roofline, and "
        "TB/s and TFLOP/s in the kernel table); the newest run of all is [run 2](run?run=2).")
    assert [s.value for s in at.subheader].count("Roofline") == 1
    assert [c for c in at.get("vega_lite_chart") if "vconcat" in json.loads(c.proto.spec)]  # drawn
    with open_db(db, read_only=True) as store:
        assert views.find_default_run(store, 0.05) == {"run_id": 1, "newest_run_id": 2, "rated": True}
        # no run with rates: the newest of all
        assert views.find_default_run(store, 1.01) == {"run_id": 2, "newest_run_id": 2, "rated": False}


def test_an_unknown_run_offers_a_way_on(fresh_db, open_page):
    at = open_page(fresh_db, "run", run="999999")
    assert not at.exception
    assert at.warning[0].value == "There is no run 999999 in this database."
    assert at.markdown[0].value == ("Open [run 1](run?run=1) (the newest run with measured rates), or pick a run "
                                    "above; Trends shows every series' runs.")


def test_each_step_figure_says_which_step_it_is(fresh_db, tmp_path, open_page):
    """A bundle timed without the profiler: the tile says so (the diagnosis says "profiled step");
    traces imported on their own have only profiled steps, and the tile says that."""
    at = open_page(fresh_db, "run", run="1")
    assert _metrics(at)["Step ms, no profiler"] == "75.063"
    assert "of each 77.8 ms profiled step" in at.markdown[0].value
    db = tmp_path / "tp2.duckdb"
    assert main(["import", str(DATA / "h200" / "tp2"), "--db", str(db)]) == 0
    assert _metrics(open_page(db, "run", run="1"))["Step ms, profiled"] == "3.885"


def test_the_rank_in_the_url_moves_the_tiles_to_that_rank(tmp_path, open_page):
    """The real TP=2 H200 capture: rank 1's tiles are its own (its median profiled step, its busy
    share: its all-reduces spin while it waits), rank 0's the run's row."""
    db = tmp_path / "tp2.duckdb"
    assert main(["import", str(DATA / "h200" / "tp2"), "--db", str(db)]) == 0
    first = open_page(db, "run", run="1")
    assert [m.value for m in first.metric] == ["—", "3.885", "0.0 %", "69.8 %"]
    at = open_page(db, "run", run="1", rank="1")
    assert not at.exception and at.selectbox(key="url_rank").value == "1"
    assert [m.value for m in at.metric] == ["—", "3.920", "0.0 %", "99.4 %"]  # main's stayed 3.885 and 69.8 %
    with open_db(db, read_only=True) as store:  # rank 1's median step, as rank_stats has it
        assert store.list_rank_stats(1)["step_ms_median"].tolist()[1] == pytest.approx(3.920373046875)
        run = store.get_run(1)  # rank 0's figures by the same query are the run's own
        zero = views.get_rank_figures(store, 1, 0, ["cast", "memcpy"])
    assert (zero["step_ms_median"], zero["gpu_busy_share"]) == pytest.approx((run["step_ms_median"],
                                                                             run["gpu_busy_share"]))
    assert any(c.value.startswith("Rank 1's own figures") for c in at.caption)


def test_the_copy_categories_are_the_trace_readers():
    from app.kpis import COPY_CATEGORIES
    from ingest.traces.categories import COPY_CATEGORIES as READERS

    assert COPY_CATEGORIES == READERS


def test_a_multi_rank_run_has_one_trace_picker_and_one_button_pair(tmp_path, open_page):
    db = tmp_path / "tp2.duckdb"
    assert main(["import", str(DATA / "h200" / "tp2"), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1")
    picker = at.selectbox(key="trace_file")
    assert picker.options == ["stepwatch-tp2-TP-0-DECODE.trace.json.gz (79 kB)",
                              "stepwatch-tp2-TP-1-DECODE.trace.json.gz (90 kB)"]
    assert [d.proto.label for d in at.get("download_button")] == [
        "Download run1-stepwatch-tp2-TP-0-DECODE.trace.json.gz"]
    tp0, tp1 = (base64.b64encode((DATA / "h200" / "tp2" / f"stepwatch-tp2-TP-{r}-DECODE.trace.json.gz")
                                 .read_bytes()[:48]).decode() for r in (0, 1))
    text = _page_text(at)
    assert text.count("Open in Perfetto (new tab)") == 1 and tp0 in text and tp1 not in text
    picker.set_value("stepwatch-tp2-TP-1-DECODE.trace.json.gz").run()
    assert [d.proto.label for d in at.get("download_button")] == [
        "Download run1-stepwatch-tp2-TP-1-DECODE.trace.json.gz"]
    text = _page_text(at)
    assert text.count("Open in Perfetto (new tab)") == 1 and tp1 in text and tp0 not in text


def test_the_trace_picker_starts_at_the_rank_shown(tmp_path, open_page):
    from app.trace_panel import pick_rank_file

    names = ["stepwatch-tp2-TP-0-DECODE.trace.json.gz", "stepwatch-tp2-TP-1-DECODE.trace.json.gz"]
    assert [pick_rank_file(names, r) for r in (0, 1, 7)] == [names[0], names[1], names[0]]
    assert pick_rank_file(["w_rank10.json", "w_rank1.json"], 1) == "w_rank1.json"
    db = tmp_path / "tp2.duckdb"
    assert main(["import", str(DATA / "h200" / "tp2"), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1", rank="1")
    assert at.selectbox(key="trace_file").value == names[1]


def test_a_trace_too_big_for_the_perfetto_button_says_why_and_offers_the_download(tmp_path, open_page):
    """A real CPU trace followed by 9 MiB of whitespace (valid JSON, as a writer that pads leaves it):
    9.5 MB, over the button's 8 MB, so no button, a line saying why, and the download."""
    trace = tmp_path / "cpu_small_padded.trace.json"
    trace.write_bytes((DATA / "traces" / "cpu_small.trace.json").read_bytes() + b" " * (9 << 20))
    db = tmp_path / "big.duckdb"
    assert main(["import", str(trace), "--db", str(db)]) == 0
    at = open_page(db, "run", run="1")
    assert not at.exception
    assert [d.proto.label for d in at.get("download_button")] == ["Download run1-cpu_small_padded.trace.json"]
    (line,) = [c.value for c in at.caption if "Perfetto" in c.value]
    assert line.startswith("No Open in Perfetto button: this trace is 9.5 MB, over the 8 MB that the button can "
                           "carry")
    assert "Perfetto opens the whole trace, not one step" in line
