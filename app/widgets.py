"""Widgets whose state lives in the page's URL (st.query_params), so that a view can be shared."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st


def select_in_url(label: str, options: Sequence[str], param: str, *, format_func: Callable[[str], str] = str,
                  default: str | None = None, key: str | None = None, **kwargs) -> str | None:
    """A selectbox over string options that starts at `?param=` (else `default`, else the first
    option) and writes its choice back to the URL. None when there are no options."""
    options = list(options)
    if not options:
        st.query_params.pop(param, None)
        return None
    wanted = st.query_params.get(param, default)
    index = options.index(wanted) if wanted in options else (options.index(default) if default in options else 0)
    value = st.selectbox(label, options, index=index, format_func=format_func, key=key or f"url_{param}", **kwargs)
    st.query_params[param] = value
    return value


def read_int_param(param: str) -> int | None:
    """`?param=12` as 12; None when absent or not a whole number."""
    text = st.query_params.get(param)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
