"""Values from data shown as text inside Markdown. Streamlit reads Markdown in st.markdown,
st.caption, st.info/warning/error/success, and in the labels of widgets, metrics, expanders and
buttons (links and images included: an image in a label is fetched by the viewer's browser).
A kernel name, a device, a variant, a commit subject, a job label or a note can hold any text,
so every such value goes through here on its way into Markdown and reads literally.

- `escape_markdown(value)`: the value as inert Markdown text.
- `format_code_span(value)`: the value as an inline code span (monospace, literal).
- `escape_markdown_keeping_code(sentence)`: a sentence whose code locations are in backticks
  (the diagnosis sentences), its code spans kept and the rest escaped.
- `format_markdown(template, *values)`: `str.format` over a trusted template, every value
  escaped (`{x:code}` makes it a code span); the way pages build Markdown from data.
- `format_markdown_list(sentences)`: sentences as a bulleted list, each escaped as above.
- `format_findings(findings)`, `format_pattern_findings(findings)`: a run's diagnosis and its
  pattern catalog findings as bulleted lists.

Each returns `Markdown`, a str that `format_markdown` inserts as it is (already safe); numbers
and dates are inserted as their format spec writes them.
Selectbox and multiselect options, dataframe cells, Altair charts, st.code and st.text show
text as text: values go there unescaped.

What is escaped, and why that is enough (CommonMark + GFM + Streamlit's extensions, checked in
chromium against Streamlit 1.67):
- Line breaks and runs of whitespace become one space, so a value never starts a new line; a
  block construct (heading, list, quote, rule, table, code block) can then only begin where the
  value begins, and the value's first characters are escaped where they would begin one
  (`#`, `>`, `-`/`+`/`=` not followed by a letter or digit, digits followed by `.` or `)`, a
  leading `.` or `)`).
- Everywhere: the characters that open inline constructs, `\\ ` * ~ [ ] < ! | $ &`, a colon
  that no space follows and an underscore not between two letters or digits (emphasis, code,
  strikethrough, links, images, autolinks, raw HTML, tables, LaTeX, entities, Streamlit's
  `:color[...]` directives; `snake_case` cannot open emphasis and stays as it is). In the
  middle of a line `# + - . ( ) { } = >` open nothing (a link's `(` needs the `]` before it,
  `>` the `<`), so they are left as they are: numbers, arrows, paths and hyphens stay readable
  in the Markdown too.
- Streamlit rewrites some patterns in the parsed text, after backslash escapes are resolved:
  `:material/icon:` and emoji `:name:` shortcodes, and GFM's literal autolinks (`http://...`,
  `www.`, `user@host.tld`). These are broken with an invisible U+2060 WORD JOINER after a colon
  that a name or `//` follows, after `@`, and between `www` and `.`. Inside code spans only
  `:material/` needs it (Streamlit rewrites that in the source, code included).
"""

from __future__ import annotations

import datetime
import numbers
import re
import string
from typing import Any

WORD_JOINER = "\u2060"

_WHITESPACE = re.compile(r"\s+")
_INLINE_SPECIAL = re.compile(r"([\\`*~\[\]<!|$&]|:(?! )|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")
# (after escaping) a colon that neither a space nor another colon follows (a shortcode, an icon
# name or `//` could), an `@` that something follows, and `www` before a dot
_TEXT_PATTERN = re.compile(r"\\:(?! |\\:)|@(?! |$)|(?i:www)(?=\.)")
# where a block construct could begin: at the value's start, after at most a space
_BLOCK_START = re.compile(r"^( ?)(#|>|[-+=](?![A-Za-z0-9])|[0-9]{1,9}[.)](?![A-Za-z0-9])|[.)](?![A-Za-z0-9]))")
_MATERIAL = re.compile(r":(?=material/)")


class Markdown(str):
    """Text that is already safe Markdown: format_markdown inserts it as it is."""


def escape_markdown(value: Any) -> Markdown:
    """`![x](http://a/b.png) at::native::f_g` -> Markdown that reads exactly that, with no
    link, image, emphasis, icon or heading (`None` reads as an empty string)."""
    if isinstance(value, Markdown):
        return value
    return Markdown(_escape_text("" if value is None else str(value), at_block_start=True))


def _escape_text(text: str, at_block_start: bool) -> str:
    text = _WHITESPACE.sub(" ", text)
    text = _INLINE_SPECIAL.sub(r"\\\1", text)
    text = _TEXT_PATTERN.sub(lambda m: m.group(0) + WORD_JOINER, text)
    block = _BLOCK_START.match(text) if at_block_start else None
    if block:
        lead, marker = block.groups()
        marker = marker[:-1] + "\\" + marker[-1] if marker[0].isdigit() else "\\" + marker
        text = lead + marker + text[block.end():]
    return text


def format_code_span(value: Any) -> Markdown:
    """The value as an inline code span (`` `x` ``): its backticks cannot end it early, and
    nothing inside is read as Markdown."""
    text = _MATERIAL.sub(":" + WORD_JOINER, _WHITESPACE.sub(" ", "" if value is None else str(value)))
    if not text:
        return Markdown("")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" or (text[0] == " " and text[-1] == " ") else ""
    return Markdown(f"{fence}{pad}{text}{pad}{fence}")


def escape_markdown_keeping_code(sentence: Any) -> Markdown:
    """'the cast kernel `k<f>` (aten::copy_)' -> the same with `k<f>` still a code span and
    the rest escaped. A backtick without its pair reads as a backtick."""
    parts = ("" if sentence is None else str(sentence)).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: the last one has no pair
        parts[-2:] = [parts[-2] + "`" + parts[-1]]
    return Markdown("".join((format_code_span(p) or "\\`\\`") if i % 2 else _escape_text(p, at_block_start=i == 0)
                            for i, p in enumerate(parts)))


class _MarkdownFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "code":
            return format_code_span(value)
        if isinstance(value, Markdown) and not format_spec:
            return value
        if isinstance(value, (numbers.Real, datetime.date)) and not isinstance(value, bool):
            return format(value, format_spec)  # digits and the template's own format: nothing to escape
        return escape_markdown(format(value, format_spec))


_FORMATTER = _MarkdownFormatter()


def format_markdown(template: str, /, *args: Any, **kwargs: Any) -> Markdown:
    """`format_markdown("**{}** · {sha:code}", variant, sha=sha)`: the template is Markdown
    written here; each value is formatted (format specs as str.format) and escaped."""
    return Markdown(_FORMATTER.format(template, *args, **kwargs))


def format_markdown_list(sentences) -> Markdown:
    """Diagnosis sentences (code locations in backticks) as a Markdown bulleted list."""
    return Markdown("\n".join(f"- {escape_markdown_keeping_code(s)}" for s in sentences))


def format_findings(findings) -> Markdown:
    """A run's diagnosis (the {kind, text, kernel} findings stored at import) as a Markdown list:
    each kernel's summary with its other findings nested under it (they say "It runs ...",
    meaning that kernel), and a finding worded the same for every kernel said once, after
    them, for all of them, instead of once per kernel."""
    groups: list[list[str]] = []
    for finding in findings:
        if finding.get("kind") == "summary" or not groups:
            groups.append([finding["text"]])
        else:
            groups[-1].append(finding["text"])
    shared = [t for t in groups[0][1:] if len(groups) > 1 and all(t in g[1:] for g in groups)]
    lines = []
    for summary, *details in groups:
        lines.append(f"- {escape_markdown_keeping_code(summary)}")
        lines += [f"  - {escape_markdown_keeping_code(t)}" for t in details if t not in shared]
    lines += [f"- {escape_markdown_keeping_code(t)} (The same for all {len(groups)} kernels above.)" for t in shared]
    return Markdown("\n".join(lines))


def format_pattern_findings(findings) -> Markdown:
    """The pattern catalog's findings stored at import ({pattern, text, ms_per_step, ...}) as a
    Markdown list, each led by its pattern's id and the milliseconds per step at stake."""
    lines = []
    for f in findings:
        more = f" ({f['more_kernels']} more kernels match.)" if f.get("more_kernels") else ""
        lines.append(format_markdown("- **{}** · {:.3f} ms per step at stake: ", f["pattern"], f["ms_per_step"])
                     + escape_markdown_keeping_code(f["text"] + more))
    return Markdown("\n".join(lines))
