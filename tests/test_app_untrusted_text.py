"""No Markdown or HTML from data is interpreted on any page. A device name in a trace, a variant
or workload in a bundle manifest, a commit's subject and author, a job's label and error, a kernel's
name, category, launcher op and source line, a run's notes and path can hold any text; Streamlit
reads Markdown in st.markdown, captions, alerts and in the labels of expanders, metrics and
buttons (images in a label are fetched by the viewer's browser). Every such value reaches Markdown
through app/markdown_text.py.

Three layers: the escaping itself on a hostile corpus; every page (AppTest) on a database whose
data fields hold Markdown images, links and HTML, written through the real write paths
(prepare_import of the real glm5 bundles, Store.insert_run of the RunRecord with those fields
replaced, record_commit, the job queue, the real change tracker); and the same pages in headless
chromium against a local HTTP server that records every request: none may reach it, and the
hostile text must be on the page literally. The browser test is skipped where chromium is not
installed, except in CI (CI=true), where a missing browser fails."""

from __future__ import annotations

import dataclasses
import http.server
import os
import re
import tempfile
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from app.markdown_text import (
    WORD_JOINER,
    Markdown,
    escape_markdown,
    escape_markdown_keeping_code,
    format_code_span,
    format_markdown,
    format_markdown_list,
)
from db.store import open_db
from ingest.runs.spec import parse_spec
from ingest.runs.track import track_changes
from ingest.traces.categories import load_rule_chain
from ingest.traces.importer import ImportOptions, diagnose_record, find_workload_key, prepare_import
from tests.browser import CHROMIUM, CHROMIUM_ARGS, need_browser, serve_dashboard
from tests.helpers import ROOT

SAMPLES = ROOT / "app" / "sample_data"

# ---------------------------------------------------------------------------------------------
# the escaping


def _read_back(markdown: str) -> str:
    """What a reader sees: backslash escapes resolved, word joiners invisible."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace(WORD_JOINER, "")


def _unescaped_specials(markdown: str) -> list[str]:
    """Characters that open a Markdown construct and are not backslash-escaped (a colon opens
    nothing when a space follows it, an underscore nothing between two letters or digits)."""
    found, i = [], 0
    while i < len(markdown):
        c, before, after = markdown[i], markdown[i - 1:i], markdown[i + 1:i + 2]
        if c == "\\":
            i += 2
            continue
        if (c in "`*~[]<!|$&" or (c == ":" and after != " ")
                or (c == "_" and not (before.isascii() and before.isalnum() and after.isascii() and after.isalnum()))):
            found.append(c)
        i += 1
    return found


KERNEL = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>"
HOSTILE = [
    "![a](http://127.0.0.1:9/x.png)",
    "[a](http://127.0.0.1:9/link)",
    "<http://127.0.0.1:9/auto>",
    '<img src="http://127.0.0.1:9/x.png">',
    "http://127.0.0.1:9/bare www.example.com user@example.com",
    ":red[x] :blue-background[y] :material/home: :material_home: :streamlit: :smile: :+1:",
    "$x^2$ and $$y$$",
    "a\n# heading",
    "# heading", "- item", "+ item", "1. item", "12) item", "> quote", "---", "===", "    code",
    "```py\nx\n```", "`code` and ``code``",
    "a | b\n---|---\n1 | 2",
    "_em_ *em* **strong** ~~gone~~ ~gone~",
    "&amp; &#x41; &lt;b&gt;",
    "[r]: http://127.0.0.1:9/ref.png\n![x][r]",
    "trailing backslash \\",
    "hard  \nbreak",
    KERNEL,
    "kernels/workload.py(238): run_step",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_escaped_text_reads_the_same_and_opens_nothing(text):
    markdown = escape_markdown(text)
    assert isinstance(markdown, Markdown)
    assert _read_back(markdown) == re.sub(r"\s+", " ", text)  # the same words; line breaks are spaces
    assert "\n" not in markdown and not _unescaped_specials(markdown)
    plain = markdown.replace("\\", "")  # as Streamlit's text-level rewrites see it (escapes resolved)
    assert not re.search(r"https?://|(?i:www)\.|@\w|:[\w+-]+:|:material/|:[a-z]", plain)
    assert not re.match(r" ?([#>]|[-+=*](?![A-Za-z0-9])|\d+[.)](?![A-Za-z0-9]))", markdown)  # no block start


def test_what_an_escaped_value_looks_like():
    assert escape_markdown("![a](http://127.0.0.1:9/x.png)") == \
        "\\!\\[a\\](http\\:\u2060//127.0.0.1\\:\u20609/x.png)"
    assert escape_markdown(":red[x]") == "\\:\u2060red\\[x\\]"
    assert escape_markdown("$x^2$") == "\\$x^2\\$"
    assert escape_markdown("a\n# heading") == "a # heading"
    assert escape_markdown("- item") == "\\- item" and escape_markdown("1. item") == "1\\. item"
    # ordinary text stays as it is: numbers, arrows, hyphens, parentheses, paths
    for text in ("-89.9 %", "135.44 tok/s -> 13.62 tok/s", "whole-row gather-cast (512+64)", "local/cpu",
                 "kernels: whole-row", "NVIDIA H200"):
        assert escape_markdown(text) == text
    assert escape_markdown(KERNEL) == ("void at\\:\\:\u2060native\\:\\:\u2060unrolled_elementwise_kernel\\<at"
                                       "\\:\\:\u2060native\\:\\:\u2060direct_copy_kernel_cuda(at\\:\\:\u2060"
                                       "TensorIteratorBase\\&)>")
    assert escape_markdown(None) == "" and escape_markdown(Markdown("**kept**")) == "**kept**"


def test_code_spans_and_sentences_with_code():
    assert format_code_span("unrolled_elementwise_kernel<f>") == "`unrolled_elementwise_kernel<f>`"
    assert format_code_span("a`b") == "``a`b``" and format_code_span("`x") == "`` `x ``"
    assert format_code_span("a\nb :material/home:") == "`a b :\u2060material/home:`"
    sentence = ("The cast kernel `unrolled_elementwise_kernel<f>` (aten::copy_) went from 0 to 78 calls, "
                "from `a.py(1): f`.")
    assert escape_markdown_keeping_code(sentence) == (
        "The cast kernel `unrolled_elementwise_kernel<f>` (aten\\:\\:\u2060copy\\_) went from 0 to 78 calls, "
        "from `a.py(1): f`.")
    # a kernel name with backticks cannot end its code span and open a link
    hostile = "the kernel `x`![a](http://127.0.0.1:9/x.png)`y` and `z"
    out = escape_markdown_keeping_code(hostile)
    assert "![a](http" not in out and "\\!\\[a\\](http\\:\u2060//" in out and out.endswith("and \\`z")
    assert escape_markdown_keeping_code("``# x") == "\\`\\`# x"
    assert format_markdown_list(["A `k` ran.", "- [x](http://x)"]) == "- A `k` ran.\n- \\- \\[x\\](http\\:\u2060//x)"


def test_format_markdown_escapes_every_value_and_keeps_the_template():
    out = format_markdown("**{}** · [{title}](run?run={id}) · {sha:code} · p = {p:.2g}", "![a](http://x/y.png)",
                          title="run 5 · [x](http://x)", id=5, sha="3bee539", p=6.8e-08)
    assert out == ("**\\!\\[a\\](http\\:\u2060//x/y.png)** · [run 5 · \\[x\\](http\\:\u2060//x)](run?run=5) · "
                   "`3bee539` · p = 6.8e-08")
    assert format_markdown("{} and {}", Markdown("**a**"), "**b**") == "**a** and \\*\\*b\\*\\*"


# ---------------------------------------------------------------------------------------------
# a database whose data fields hold Markdown images, links and HTML

# (sample bundle, first-parent seq, commit sha): the KV-strategy regression of the fixture database
COMMITS = (("fe3ea75-glm5-fused-graph", 1, "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d"),
           ("fe3ea75-glm5-full-pool-cast-graph", 4, "9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c"))
FIELDS = ("repo", "subject", "author", "variant", "engine", "device", "preset", "kernel", "category", "launcher",
          "source", "note", "path", "job-label", "job-error", "error-kind", "log")


def hostile(field: str, port: int) -> str:
    """A Markdown image, a Markdown link and an HTML image, each at an address naming the field."""
    base = f"http://127.0.0.1:{port}"
    return f'![x]({base}/img-{field}.png) [x]({base}/link-{field}) <img src="{base}/html-{field}.png">'


def _hostile_run(record, mark, job_id=None):
    """The imported run with every label a trace or manifest can carry replaced by hostile text,
    its diagnosis worked out again from those kernels (as the importer does)."""
    workload = {**record.workload, "preset": mark("preset")}
    frame = record.kernel_stats.to_pandas()  # a DataFrame: run_tables and the diagnosis take either
    kernels = frame.assign(name=mark("kernel") + " " + frame["name"], launcher=mark("launcher"), source=mark("source"),
                           category=frame["category"].replace({"cast": mark("category")}))
    record = dataclasses.replace(record, repo=mark("repo"), variant=mark("variant"), engine=mark("engine"),
                                 device_name=mark("device"), workload=workload,
                                 workload_key=find_workload_key(workload), kernel_stats=kernels,
                                 notes=[*(record.notes or []), mark("note")], source_path=mark("path"),
                                 trace_root=mark("path"), job_id=job_id)
    return dataclasses.replace(record, diagnosis=diagnose_record(record))


def build_hostile_db(path: Path, port: int) -> dict[str, int]:
    """Two runs of one series at two commits (a confirmed regression between them), the second
    made by a job; a failed, a running and a queued job. Returns the ids the pages are opened at."""
    mark = lambda field: hostile(field, port)  # noqa: E731
    spec = parse_spec({"engine": "reference", "device": "cpu",
                       "workload": {"preset": "tiny", "kv": "fused", "profile_steps": 2}}).to_json()
    rules = load_rule_chain()
    ids = {}
    with open_db(path) as store:
        done = store.enqueue_job(spec, mark("job-label"), "b1")
        store.claim_job("testhost:1")
        for (bundle, seq, sha), name in zip(COMMITS, ("a", "b")):
            record = prepare_import(SAMPLES / bundle, rules, ImportOptions(commit=sha))
            ids[name], _ = store.insert_run(_hostile_run(record, mark, job_id=done if name == "b" else None))
            store.record_commit(mark("repo"), sha, f"2026-12-0{seq}T09:00:00+00:00", mark("author"), mark("subject"),
                                seq)
        store.finish_job(done, "succeeded", run_id=ids["b"], log=mark("log"))
        failed = store.enqueue_job(spec, mark("job-label"), "b2")
        store.claim_job("testhost:1")
        store.finish_job(failed, "failed", error_kind=mark("error-kind"), error=mark("job-error"), log=mark("log"))
        running = store.enqueue_job(spec, mark("job-label"), "b3")
        store.claim_job("testhost:1")
        store.report_progress(running, steps_done=1, steps_planned=3, log_tail=mark("log"))
        store.enqueue_job(spec, mark("job-label"), "b3")
        assert track_changes(store), "the regression between the two commits is confirmed"
    return ids


# ---------------------------------------------------------------------------------------------
# every page in AppTest: what Streamlit is asked to read as Markdown

AT_PORT = 9  # nothing is fetched in AppTest; the port only names the addresses
# page -> (URL parameters, the fields whose text the page's Markdown holds, escaped or as code);
# kernel names and launcher ops are in the kernel tables (dataframe cells: text), and a diagnosis
# names a kernel by its short name in a code span
PAGES = {
    "trends": ({}, ("preset", "variant")),
    "run": ({"run": "b"}, ("repo", "subject", "variant", "engine", "device", "preset", "note", "path", "job-label",
                           "category", "source")),
    "compare": ({"a": "a", "b": "b", "by": "runs"}, ("repo", "variant", "preset", "category", "source")),
    "regressions": ({}, ("subject", "author", "repo", "engine", "device", "preset", "variant", "category", "source")),
    "run_benchmark": ({}, ("job-label", "job-error", "error-kind")),
}


def markdown_bodies(at) -> list[str]:
    """Every string of the page that Streamlit renders as Markdown."""
    bodies = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "header",
                                   "subheader") for e in getattr(at, kind)]
    bodies += [e.label for e in at.expander] + [m.label for m in at.metric] + [m.proto.help for m in at.metric]
    bodies += [e.proto.label for kind in ("download_button", "button", "page_link") for e in at.get(kind)]
    bodies += [p.proto.text for p in at.get("progress")]
    for widget in (*at.selectbox, *at.multiselect, *at.radio, *at.text_input, *at.number_input):
        bodies += [widget.label, widget.proto.help]
    bodies += [option for radio in at.radio for option in radio.options]  # radio options are Markdown too
    return [b for b in bodies if b]


def _unescaped_hostile(body: str) -> list[str]:
    """Pieces of the hostile text that Markdown would read: an image, a link, HTML, an address.
    Code spans are left out: nothing in them is read (a diagnosis quotes source lines in them)."""
    outside_code = re.sub(r"(?<![`\\])(`+)(?!`).*?(?<!`)\1(?!`)", "", body)
    return re.findall(r"(?<!\\)!\[|(?<!\\)\]\(http|(?<!\\)<img|https?://|(?<!\\)<http", outside_code)


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    db = tmp_path_factory.mktemp("hostile") / "stepwatch.duckdb"
    return db, build_hostile_db(db, AT_PORT)


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.slow
def test_every_page_shows_data_as_text(hostile_db, open_page, page):
    db, ids = hostile_db
    params, fields = PAGES[page]
    at = open_page(db, page, **{k: str(ids.get(v, v)) for k, v in params.items()})
    assert not at.exception, at.exception
    bodies = markdown_bodies(at)
    leaks = [(body, piece) for body in bodies for piece in _unescaped_hostile(body)]
    assert not leaks, leaks
    text = "\n".join(bodies)
    missing = [f for f in fields if escape_markdown(hostile(f, AT_PORT)) not in text
               and format_code_span(hostile(f, AT_PORT)) not in text]  # a source line is quoted as code
    assert not missing, (missing, bodies)


@pytest.mark.slow
def test_the_selectors_show_data_as_plain_text(hostile_db, open_page):
    """Selectbox options are plain text in the browser: they are given the raw values (escaping
    them would show backslashes)."""
    db, ids = hostile_db
    at = open_page(db, "trends")
    assert {s.label: s.value for s in at.selectbox}["GPU"] == hostile("device", AT_PORT)
    at = open_page(db, "compare", a=str(ids["a"]), b=str(ids["b"]), by="runs")
    assert all(hostile("variant", AT_PORT) in option for option in at.selectbox(key="compare_run_a").options)


# ---------------------------------------------------------------------------------------------
# every page in headless chromium: nothing is fetched from an address in the data


@pytest.fixture(scope="module")
def trap():
    """(port, recorded request paths): an HTTP server on 127.0.0.1 that records every request."""
    need_browser()
    paths: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            paths.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], paths
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def hostile_dashboard(trap, tmp_path_factory):
    """(base URL, run ids): streamlit over a hostile database whose addresses point at the trap."""
    port, _ = trap
    db = tmp_path_factory.mktemp("hostile-e2e") / "stepwatch.duckdb"
    ids = build_hostile_db(db, port)
    env = {**os.environ, "STEPWATCH_DB": str(db), "PYTHONUNBUFFERED": "1"}
    env.pop("STEPWATCH_CONFIG", None)
    with serve_dashboard(env) as base:
        yield base, ids


# each page's URL and what says it has rendered all its sections: (text, how many times) each,
# the page's last elements (case-sensitive: "First bad commit" is not the caption's "first bad commit")
BROWSER_PAGES = {
    "trends": ("/", [("runs at 2 commits", 1), ("Every run in the database measured a commit.", 1)]),
    "run": ("/run?run={b}", [("Log of job 1", 1), ("Trace no longer available", 1)]),
    "compare": ("/compare?a={a}&b={b}&by=runs", [("· all changes", 1),  # one event, one line
                                                  ("kernels (matched by name and launcher op)", 1)]),
    "compare-commits": ("/compare?a={a}&b={b}&by=commits", [("Every variant at both commits", 1),
                                                             ("kernels (matched by name and launcher op)", 1)]),
    "regressions": ("/regressions", [("First bad commit", 1), ("Diagnosis", 1)]),  # one event, one card
    "run_benchmark": ("/run_benchmark", [("failed (", 1), ("Show the log of job", 1)]),
}


@pytest.mark.slow
def test_no_page_fetches_an_address_from_the_data(trap, hostile_dashboard):
    from playwright.sync_api import sync_playwright

    port, served = trap
    base, ids = hostile_dashboard
    asked: dict[str, list[str]] = {name: [] for name in BROWSER_PAGES}  # what each page's browser asked for
    shown = {}
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="stepwatch-chromium-") as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True,
                                                       args=CHROMIUM_ARGS, viewport={"width": 1500, "height": 1100})
        context.set_default_timeout(120_000)
        page = context.new_page()
        current = []  # the page being loaded
        page.on("request", lambda r: asked[current[-1]].append(r.url.rpartition("/")[2])
                if f"127.0.0.1:{port}/" in r.url else None)
        elsewhere = []  # anything but the dashboard itself (a favicon or font from the internet, say)
        page.on("request", lambda r: elsewhere.append(r.url) if urlsplit(r.url).scheme in ("http", "https")
                and urlsplit(r.url).netloc != urlsplit(base).netloc else None)
        for name, (url, last) in BROWSER_PAGES.items():
            current.append(name)
            page.goto(base + url.format(**ids))
            for text, times in last:
                page.get_by_text(re.compile(re.escape(text))).nth(times - 1).wait_for()
            for expander in page.locator('[data-testid="stExpander"] summary').all():
                expander.click()  # a diagnosis or a log folded away is rendered too
            page.wait_for_function("() => [...document.images].every(i => i.complete)")
            shown[name] = (page.locator("body").inner_text(),
                           page.locator(f'a[href*="127.0.0.1:{port}"], img[src*="127.0.0.1:{port}"]').count())
        context.close()
    fetched = {name: sorted(set(files)) for name, files in asked.items() if files}
    assert elsewhere == [], f"pages asked for addresses other than the dashboard's: {sorted(set(elsewhere))}"
    assert not [name for name, (text, _) in shown.items() if "Deploy" in text], "Streamlit's Deploy button is shown"
    assert not fetched and not served, f"addresses in the data were fetched: {fetched} (server: {sorted(set(served))})"
    assert not {name: links for name, (_, links) in shown.items() if links}, "links or images to the data's addresses"
    for name, (text, _) in shown.items():  # the hostile text is on the page, as text
        text = text.replace(WORD_JOINER, "")
        assert "![x](http://127.0.0.1:" in text and '<img src="http://127.0.0.1:' in text, (name, text[:3000])
