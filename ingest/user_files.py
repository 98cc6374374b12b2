"""Files a user hands in (`--rules`, `--patterns`, `--config`, a run spec): read under one rule.

Only a regular file is read (a FIFO, a device or a directory is refused by what it is; the open
does not block on a FIFO), at most USER_FILE_MAX_BYTES of it, as UTF-8; its TOML or JSON may
nest at most USER_FILE_MAX_DEPTH tables/arrays deep. Every refusal is one line naming the file
and what is wrong, raised as the caller's own error class (RulesError, PatternError, SpecError):
each package keeps raising its own errors. A leaf: stdlib, ingest.errors and ingest.limits only.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

from .errors import IngestError
from .limits import USER_FILE_MAX_BYTES, USER_FILE_MAX_DEPTH

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def describe_kind(mode: int) -> str:
    """What a non-regular file is, in words ("a FIFO", "a character device", ...)."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_user_text(path: str | Path, error: type[IngestError] = IngestError,
                   max_bytes: int = USER_FILE_MAX_BYTES) -> str:
    """The text of the regular file `path` (UTF-8, at most max_bytes); raises `error` naming the file."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(f"{path}: is {describe_kind(mode)}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise error(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > max_bytes:
        raise error(f"{path}: is larger than {max_bytes:,} bytes (the limit for a file of settings, "
                    "USER_FILE_MAX_BYTES)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: is not UTF-8 text (byte {e.start:,})") from None


def nesting_depth(value) -> int:
    """How deep dicts and lists nest in `value` (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > USER_FILE_MAX_DEPTH:  # deep enough to refuse: no need to walk on
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_user_table(text: str, path: str | Path, error: type[IngestError] = IngestError,
                     as_json: bool | None = None) -> dict:
    """The TOML (or, for a `.json` file or as_json, JSON) table in `text`; raises `error` naming the
    file when it does not parse, nests deeper than USER_FILE_MAX_DEPTH or is not a table."""
    as_json = Path(path).suffix == ".json" if as_json is None else as_json
    kind = "JSON" if as_json else "TOML"
    try:
        body = json.loads(text) if as_json else tomllib.loads(text)
    except RecursionError:
        raise error(f"{path}: nests deeper than {USER_FILE_MAX_DEPTH} levels (the limit, USER_FILE_MAX_DEPTH)") \
            from None
    except (ValueError, tomllib.TOMLDecodeError) as e:
        raise error(f"{path}: not valid {kind} ({e})") from None
    if nesting_depth(body) > USER_FILE_MAX_DEPTH:
        raise error(f"{path}: nests deeper than {USER_FILE_MAX_DEPTH} levels (the limit, USER_FILE_MAX_DEPTH)")
    if not isinstance(body, dict):
        raise error(f"{path}: holds a {type(body).__name__}, not a {kind} table/object")
    return body


def load_user_table(path: str | Path, error: type[IngestError] = IngestError, as_json: bool | None = None) -> dict:
    """read_user_text then parse_user_table."""
    return parse_user_table(read_user_text(path, error), path, error, as_json)
