"""Kernel categories from an ordered rules file (ingest/traces/categories.toml plus the user's)."""

from __future__ import annotations

import re
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import IngestError
from ..user_files import load_user_table

DEFAULT_RULES = Path(__file__).with_name("categories.toml")
CATEGORIES = ("cast", "memcpy", "gemm", "attention", "moe", "communication", "norm", "elementwise", "other")
ACTIVITIES = ("kernel", "memcpy", "memset", "cpu_op")
COPY_CATEGORIES = ("cast", "memcpy")


class RulesError(IngestError):
    pass


@dataclass(frozen=True)
class Rule:
    category: str
    name: re.Pattern | None = None
    launcher: re.Pattern | None = None
    activity: frozenset | None = None
    dtypes_differ: bool | None = None
    origin: str = ""  # "FILE: rule N", for messages

    def matches(self, name: str, launcher: str, activity: str, dtypes_differ: bool) -> bool:
        return (
            (self.name is None or self.name.search(name) is not None)
            and (self.launcher is None or self.launcher.search(launcher) is not None)
            and (self.activity is None or activity in self.activity)
            and (self.dtypes_differ is None or self.dtypes_differ == dtypes_differ)
        )


def _compile(path: Path, index: int, key: str, value) -> re.Pattern:
    if not isinstance(value, str):
        raise RulesError(f"{path}: rule {index} field '{key}' must be a string")
    try:
        return re.compile(value, re.IGNORECASE)
    except (re.error, OverflowError, RecursionError) as e:  # OverflowError: a{4294967296}
        raise RulesError(f"{path}: rule {index} field '{key}' is not a valid regex ({e})") from None


def load_rules(path: str | Path) -> list[Rule]:
    """Parse one rules file; raise RulesError naming the file, the rule and the field."""
    path = Path(path)
    body = load_user_table(path, RulesError, as_json=False)  # a regular file, size and depth limited
    rules = body.get("rule")
    if not isinstance(rules, list) or not rules:
        raise RulesError(f"{path}: no [[rule]] tables")
    out = []
    for i, r in enumerate(rules, 1):
        if not isinstance(r, dict):
            raise RulesError(f"{path}: rule {i} is not a table (write it as [[rule]] with fields)")
        unknown = set(r) - {"category", "name", "launcher", "activity", "dtypes_differ"}
        if unknown:
            raise RulesError(f"{path}: rule {i} has unknown field(s) {', '.join(sorted(unknown))}")
        cat = r.get("category")
        if not isinstance(cat, str) or not re.fullmatch(r"[a-z][a-z0-9_-]*", cat):
            raise RulesError(f"{path}: rule {i} field 'category' must be a lower-case word")
        activity = r.get("activity")
        if activity is not None:
            if not isinstance(activity, list) or not all(isinstance(a, str) and a in ACTIVITIES for a in activity):
                raise RulesError(f"{path}: rule {i} field 'activity' must be a list among {ACTIVITIES}")
            activity = frozenset(activity)
        dd = r.get("dtypes_differ")
        if dd is not None and not isinstance(dd, bool):
            raise RulesError(f"{path}: rule {i} field 'dtypes_differ' must be true or false")
        out.append(Rule(
            cat,
            _compile(path, i, "name", r["name"]) if "name" in r else None,
            _compile(path, i, "launcher", r["launcher"]) if "launcher" in r else None,
            activity,
            dd,
            f"{path}: rule {i}",
        ))
    return out


def load_rule_chain(user_rules: str | Path | None = None) -> list[Rule]:
    """The user's rules (if any) followed by the built-in ones."""
    chain = load_rules(user_rules) if user_rules else []
    return chain + load_rules(DEFAULT_RULES)


def categorise(rules: list[Rule], name: str, launcher: str = "", activity: str = "kernel",
               dtypes_differ: bool = False) -> str:
    for rule in rules:
        try:
            if rule.matches(name, launcher, activity, dtypes_differ):
                return rule.category
        except _RegexTimeout:
            raise RulesError(f"{rule.origin or 'a category rule'}: its regex took over {RULES_TIME_LIMIT_S:.0f} s "
                             f"matching kernel names (catastrophic backtracking?): simplify it") from None
    return "other"


# Matching every distinct kernel name against the rules takes milliseconds; a user regex that
# backtracks catastrophically would hang an import for ever. A time limit stops it (CPython's re
# checks for signals while it matches): only in the main thread, where signals can be received.
RULES_TIME_LIMIT_S = 10.0


class _RegexTimeout(Exception):
    pass


@contextmanager
def rules_time_limit(seconds: float = RULES_TIME_LIMIT_S):
    """Raise _RegexTimeout inside categorise() once the rules have matched for `seconds`."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum, frame):
        raise _RegexTimeout()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
