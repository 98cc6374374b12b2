"""Widgets whose state lives in the page's URL (st.query_params), so that a view can be shared."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from app.markdown_text import format_markdown


URL_VALUE_SHOWN = 60  # characters of an ignored URL value quoted in its notice


def quote_url_value(param: str, text: str) -> str:
    """`?param=text` as a notice quotes it, the value cut to URL_VALUE_SHOWN characters."""
    shown = text if len(text) <= URL_VALUE_SHOWN else text[: URL_VALUE_SHOWN - 1] + "…"
    return f"?{param}={shown}"


def select_in_url(label: str, options: Sequence[str], param: str, *, format_func: Callable[[str], str] = str,
                  default: str | None = None, key: str | None = None, **kwargs) -> str | None:
    """A selectbox over string options that starts at `?param=` (else `default`, else the first
    option) and writes its choice back to the URL. A `?param=` that names no option is ignored
    with a notice that says what is shown instead. None when there are no options."""
    options = list(options)
    asked = st.query_params.get(param)
    if not options:
        st.query_params.pop(param, None)
        return None
    wanted = asked if asked is not None else default
    index = options.index(wanted) if wanted in options else (options.index(default) if default in options else 0)
    if asked is not None and asked not in options:
        st.warning(format_markdown("{:code} matches no {} here: showing {} instead.", quote_url_value(param, asked),
                                   label.lower(), format_func(options[index])))
    value = st.selectbox(label, options, index=index, format_func=format_func, key=key or f"url_{param}", **kwargs)
    st.query_params[param] = value
    return value


def read_int_param(param: str, what: str = "run") -> int | None:
    """`?param=12` as 12; None when absent. A value that is not a positive whole number (`abc`,
    `1;DROP TABLE runs`, `-3`) is ignored with a notice, never silently."""
    text = st.query_params.get(param)
    if text is None:
        return None
    if text.isascii() and text.isdigit() and int(text) > 0:
        return int(text)
    st.warning(format_markdown("{:code} is not a {} id (a positive whole number): ignored.",
                               quote_url_value(param, text), what))
    st.query_params.pop(param, None)  # said once: the pickers below start from their defaults
    return None
