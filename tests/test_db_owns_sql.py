"""Every SQL statement lives in db/ (HOUSE_STYLE: "every SQL statement lives here, in named
functions with parameters"): app/, ingest/ and kernels/ call db's functions and never talk SQL.

Read from the source with `ast` (nothing is imported), so a module no other test imports is
checked too. Two findings, each exact on this tree: a call of a database cursor's method
(`.execute`, `.executemany`, `.sql`), whatever its arguments; and a string that begins with an SQL
statement's keyword in capitals (SELECT, INSERT, ..., as every statement in db/ is written),
alone or as the first part of an f-string or of implicitly joined literals. Prose ("Select the
runs", " with prefix ") is not SQL. Tests may keep SQL that checks the database; they are not
scanned. The checker has its own test on a small tree where it must fire, beside the test on
the project, where it must not.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_DB = ("app", "ingest", "kernels")
CURSOR_METHODS = ("execute", "executemany", "sql")
STATEMENT = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|DROP|ALTER|ATTACH|DETACH|CHECKPOINT|PRAGMA"
                       r"|COPY|BEGIN|COMMIT|ROLLBACK)\b")


def find_sql(root: Path, packages: tuple[str, ...] = OUTSIDE_DB) -> list[str]:
    """'path:line: what' for each SQL statement or cursor call in the packages' modules, in order."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in CURSOR_METHODS):
                    found.append((where, node.lineno, f"a call of .{node.func.attr}()"))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and STATEMENT.match(node.value):
                    found.append((where, node.lineno, f"SQL {node.value.strip()[:60]!r}"))
    return [f"{where}:{line}: {what}" for where, line, what in sorted(found)]


def test_no_sql_outside_db():
    assert find_sql(ROOT) == []


_FIRES = '''
def count(store):
    return store.con.execute("SELECT count(*) FROM runs").fetchone()[0]

def write(con, rows, table):
    con.executemany(INSERT, rows)
    con.sql(f"SELECT * FROM {table}")
    con.execute(table)

INSERT = ("INSERT INTO runs (run_id)"
          " VALUES (?)")
QUERY = f"""
    WITH x AS (SELECT 1) SELECT * FROM x WHERE id = {INSERT!r}"""
'''

_QUIET = '''
"""Select the runs: create the demo repository, update the bundle, delete old work directories."""

def run(host, job):
    execute_job(job)  # a function, not a cursor's method
    host.run(["git", "log", "--format=%H"])
    print(" with prefix ", "Create the demo", "WITH_STACK", f"selected {job} runs")
    return {"SELECTED": 1}
'''


def test_the_checker_finds_sql_and_cursor_calls_and_nothing_else(tmp_path):
    for package, text in (("app", _FIRES), ("kernels", _QUIET)):
        (tmp_path / package).mkdir()
        (tmp_path / package / "mod.py").write_text(text)
    (tmp_path / "ingest").mkdir()
    assert find_sql(tmp_path) == [
        "app/mod.py:3: SQL 'SELECT count(*) FROM runs'",
        "app/mod.py:3: a call of .execute()",
        "app/mod.py:6: a call of .executemany()",
        "app/mod.py:7: SQL 'SELECT * FROM'",
        "app/mod.py:7: a call of .sql()",
        "app/mod.py:8: a call of .execute()",
        "app/mod.py:10: SQL 'INSERT INTO runs (run_id) VALUES (?)'",
        "app/mod.py:12: SQL 'WITH x AS (SELECT 1) SELECT * FROM x WHERE id ='",
    ]
