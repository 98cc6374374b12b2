"""The sglang 0.5.23 wheel, whose Python sources the patch and flag tests read: downloaded once
with pip into ~/.cache/stepwatch/ (or $STEPWATCH_CACHE), or taken from $STEPWATCH_SGLANG_WHEEL.
tests/conftest.py's session fixture `sglang_wheel` calls fetch_sglang_wheel(): without a network
the tests that need it skip; any other download failure fails them."""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
import urllib.parse
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

SGLANG_VERSION = "0.5.23"

# pip's messages when no index can be reached (DNS, refused or reset connections, proxies).
_OFFLINE = re.compile(
    r"Network is unreachable|Temporary failure in name resolution|Name or service not known"
    r"|Failed to establish a new connection|Connection refused|Connection reset|ConnectTimeout"
    r"|ReadTimeout|timed out|NewConnectionError|ProxyError|No route to host"
    r"|nodename nor servname|getaddrinfo failed",
    re.IGNORECASE,
)


def cache_dir() -> Path:
    return Path(os.environ.get("STEPWATCH_CACHE", Path.home() / ".cache" / "stepwatch"))


def find_wheel(folder: Path) -> Path | None:
    wheels = sorted(folder.glob(f"sglang-{SGLANG_VERSION}-*.whl")) if folder.is_dir() else []
    return wheels[0] if wheels else None


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                                capture_output=True, text=True).stdout
        match = re.search(r"index-url='([^']+)'", listed)
        url = match.group(1) if match else "https://pypi.org/simple"
    return url


def index_reachable() -> bool:
    """Whether a TCP connection to pip's index opens (pip may report an unreachable index
    only as 'No matching distribution found')."""
    url = urllib.parse.urlsplit(index_url())
    if url.scheme == "file" or not url.hostname:
        return True
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=10).close()
        return True
    except OSError:
        return False


def fetch_sglang_wheel() -> Path:
    """The wheel's path: $STEPWATCH_SGLANG_WHEEL, the cached one, or one downloaded now; skips the
    calling test when the package index cannot be reached, fails it on any other problem."""
    explicit = os.environ.get("STEPWATCH_SGLANG_WHEEL")
    if explicit:
        return Path(explicit)
    cache = cache_dir()
    wheel = find_wheel(cache)
    if wheel is not None:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    # The one wheel published for 0.5.23 (CPython 3.11, manylinux x86_64), whatever runs the test.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--only-binary=:all:", "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
           "--implementation", "cp", "--abi", "cp311", "-d", str(cache), f"sglang=={SGLANG_VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.skip(f"pip download sglang=={SGLANG_VERSION} timed out: network too slow or unreachable")
    output = proc.stdout + proc.stderr
    wheel = find_wheel(cache)
    if proc.returncode == 0 and wheel is not None:
        return wheel
    offline = _OFFLINE.search(output)
    if offline or not index_reachable():
        reason = offline.group(0) if offline else f"cannot connect to {index_url()}"
        pytest.skip(f"cannot download sglang=={SGLANG_VERSION}: network unreachable ({reason})")
    pytest.fail(f"pip download sglang=={SGLANG_VERSION} failed (exit {proc.returncode}):\n"
                f"{output[-3000:]}")


# ---------------------------------------------------------------------------------------------
# sglang 0.5.23's server arguments, read from the wheel's sources (never imported: SGLang cannot
# be installed here), as tests/standins/make_fake_sglang.py declares them
# ---------------------------------------------------------------------------------------------

FIELDS_DIR = "sglang/srt/arg_groups/fields/"
SERVER_ARGS_FILE = "sglang/srt/server_args.py"
CHOICES_FILE = "sglang/srt/arg_groups/choices.py"
_SCALAR_TYPES = {"int": "int", "float": "float", "str": "str"}


def read_wheel_sources(wheel: Path, wanted: Callable[[str], bool]) -> dict[str, str]:
    """The wheel's text files whose paths `wanted` accepts, by path."""
    with zipfile.ZipFile(wheel) as whl:
        return {n: whl.read(n).decode() for n in whl.namelist() if wanted(n)}


def _keyword(call: ast.Call, name: str):
    return next((k.value for k in call.keywords if k.arg == name), None)


def _constant(node, default=None):
    try:
        return ast.literal_eval(node) if node is not None else default
    except ValueError:
        return default


def _named_lists(source: str) -> dict[str, list]:
    """Module-level `NAME = [literal, ...]` assignments (choices.py's lists)."""
    named = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.List, ast.Tuple)):
            value = _constant(node.value)
            for target in node.targets:
                if isinstance(target, ast.Name) and value is not None:
                    named[target.id] = list(value)
    return named


def _choices(node, named: dict[str, list]) -> list | None:
    """A literal list or a list named in choices.py; None for any other expression (a list built
    at run time: the stand-in then takes any value)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        value = _constant(node)
        return list(value) if value is not None else None
    if isinstance(node, ast.Name):
        return named.get(node.id)
    return None


def _unwrap_optional(node: ast.expr) -> ast.expr:
    """`Optional[X]`, `X | None`, `Union[X, None]` -> X (arg_utils.py _unwrap_optional)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not (isinstance(s, ast.Constant) and s.value is None)]
        return sides[0] if len(sides) == 1 else node
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Union":
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        return rest[0] if len(rest) == 1 else node
    return node


def _type_name(node: ast.expr) -> str:
    return _SCALAR_TYPES.get(node.id, "str") if isinstance(node, ast.Name) else "str"


def _flag(names, dest, action="store", type="str", nargs=None, choices=None, required=False, const=None) -> dict:
    return {"names": list(names), "dest": dest, "action": action, "type": type, "nargs": nargs,
            "choices": list(choices) if choices is not None else None, "required": required, "const": const}


def _field_flag(stmt: ast.AnnAssign, named: dict[str, list]) -> dict | None:
    """The argparse call add_cli_args_from_dataclass (arg_utils.py:298-417) makes for one field."""
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id in ("A", "Annotated")
            and isinstance(ann.slice, ast.Tuple)):
        return None
    raw, metas = ann.slice.elts[0], ann.slice.elts[1:]
    meta = next((m for m in metas if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id == "Arg"),
                None)
    if meta is None and not any(isinstance(m, ast.Constant) and isinstance(m.value, str) for m in metas):
        return None  # no Arg and no help string: no flag (:321-323)
    kw = (lambda name: _keyword(meta, name)) if meta is not None else (lambda name: None)
    if _constant(kw("no_cli"), False) is True:
        return None
    name = stmt.target.id
    names = [_constant(kw("cli_name")) or "--" + name.replace("_", "-")] + list(_constant(kw("aliases"), []) or [])
    arg_choices = _choices(kw("choices"), named)
    nargs, const = _constant(kw("nargs")), _constant(kw("const"))
    action = kw("action")
    if action is not None:  # :336-348
        if isinstance(action, ast.Attribute) and action.attr == "BooleanOptionalAction":
            return _flag(names, name, "boolean_optional")
        extra = _constant(kw("action_kwargs"), {}) or {}
        return _flag(names, name, nargs=extra.get("nargs", nargs), choices=arg_choices)
    inner = _unwrap_optional(raw)
    if isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and inner.value.id == "Literal":
        values = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
        literal = [_constant(v) for v in values]
        kind = type(literal[0]).__name__ if literal else "str"
        return _flag(names, name, type=_SCALAR_TYPES.get(kind, "str"), choices=arg_choices or literal, const=const)
    has_parser = kw("type_parser") is not None
    if (isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and inner.value.id in ("List", "list")
            and not has_parser):  # :370-391
        return _flag(names, name, type=_type_name(inner.slice), nargs=nargs or "+", choices=arg_choices, const=const)
    if isinstance(inner, ast.Name) and inner.id == "bool":  # :393-399
        return _flag(names, name, "store_true")
    required = _constant(kw("required"))
    # a type_parser: human_readable_int ("4k", "1Mi") the stand-in reproduces; any other
    # (json_list_type, ...) converts a string, so any string passes here
    parser = kw("type_parser")
    typ = (("human_int" if getattr(parser, "id", None) == "human_readable_int" else "str") if has_parser
           else _type_name(inner))
    return _flag(names, name, type=typ, nargs=nargs, choices=arg_choices,
                 required=required is True or (required is None and stmt.value is None), const=const)


def _add_argument_flag(call: ast.Call, named: dict[str, list]) -> dict | None:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not names or not names[0].startswith("--"):
        return None
    dest = _constant(_keyword(call, "dest")) or names[0][2:].replace("-", "_")
    action = _keyword(call, "action")
    action_name = (action.value if isinstance(action, ast.Constant) else getattr(action, "id", None)
                   or getattr(action, "attr", None))
    if action_name in ("store_true", "DeprecatedStoreTrueAction"):
        return _flag(names, dest, "store_true")
    typ = _keyword(call, "type")
    nargs = _constant(_keyword(call, "nargs"))
    return _flag(names, dest, type=_type_name(typ) if typ is not None else "str", nargs=nargs,
                 choices=_choices(_keyword(call, "choices"), named),
                 required=_constant(_keyword(call, "required"), False))


def read_server_flags(wheel: Path) -> list[dict]:
    """Every server flag of the release as the stand-in declares it (make_fake_sglang's
    server_flags): the annotated fields of sglang/srt/arg_groups/fields/*.py, turned into flags as
    arg_utils.add_cli_args_from_dataclass does, and the add_argument calls of server_args.py's
    ServerArgs.add_cli_args (:351-441: dynamic choices, --config, deprecated spellings). Choices
    computed at run time (--sampling-backend, --reasoning-parser, --tool-call-parser) and a
    type_parser's conversion are not reproduced: those flags take any value here."""
    sources = read_wheel_sources(wheel, lambda n: n in (SERVER_ARGS_FILE, CHOICES_FILE)
                                 or (n.startswith(FIELDS_DIR) and n.endswith(".py")))
    named = _named_lists(sources[CHOICES_FILE])
    flags: dict[str, dict] = {}
    for path in sorted(p for p in sources if p.startswith(FIELDS_DIR)):
        for node in ast.walk(ast.parse(sources[path])):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        flag = _field_flag(stmt, named)
                        if flag is not None:
                            flags[flag["names"][0]] = flag
    for node in ast.walk(ast.parse(sources[SERVER_ARGS_FILE])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flag = _add_argument_flag(node, named)
            if flag is not None:
                flags[flag["names"][0]] = flag
    return list(flags.values())
