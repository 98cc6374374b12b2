"""The import graph's rules (ARCHITECTURE.md): layers point one way, no cycles, project imports at
the top of modules, the dashboard free of processes, sockets and git.

The graph is read from the source with `ast` (nothing is imported), so a rule broken in a module that
no other test imports fails here too. Each rule has a test on a small tree written by the test, where
it must fire, beside the test on the project, where it must not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "db", "ingest", "kernels")

# What each part may import from the project, most specific prefix first (ARCHITECTURE.md, "Layers").
ALLOWED = [
    ("kernels.studies", ("kernels",)),
    ("kernels", ("kernels",)),  # torch and triton only besides itself: it runs on the GPU machine as is
    ("db.studies", ("db", "ingest.cli")),  # the load study runs the real command line
    ("db", ("db",)),
    ("ingest.errors", ()),
    ("ingest.limits", ()),
    ("ingest.priority", ()),
    ("ingest.user_files", ("ingest.errors", "ingest.limits")),  # reads a user's settings files under the limits
    ("ingest.regress", ("ingest.regress", "ingest.errors")),  # pure: no database, no I/O
    ("ingest.traces", ("ingest.traces", "ingest.regress", "ingest.errors", "ingest.limits", "ingest.priority",
                       "ingest.user_files",
                       "db", "kernels.bundle", "kernels.names")),
    ("ingest.runs", ("ingest.runs", "ingest.traces", "ingest.regress", "ingest.errors", "ingest.limits",
                     "ingest.user_files",
                     "ingest.priority", "db", "kernels.bundle", "kernels.names")),
    ("ingest.studies", ("ingest", "db", "kernels")),
    ("ingest", ("ingest", "db", "kernels")),  # the command line: cli, commands, report, __main__
    ("app.studies", ("app", "db")),
    ("app", ("app", "db", "kernels.names", "ingest.regress", "ingest.runs.spec", "ingest.runs.errors",
             "ingest.limits")),
]
# The command line may import a subcommand's module when that command runs (start-up stays fast).
LAZY_IMPORTS_ALLOWED = ("ingest.cli", "ingest.commands")
# Modules whose import means processes, sockets, a shell or the network: none is reachable from app/.
IO_LIBRARIES = ("subprocess", "socket", "multiprocessing", "asyncio", "paramiko", "ray", "urllib", "http",
                "shutil", "pty", "signal")


@dataclass
class Graph:
    modules: dict[str, Path] = field(default_factory=dict)
    top: dict[str, set[str]] = field(default_factory=dict)  # project modules imported at module level
    lazy: dict[str, set[str]] = field(default_factory=dict)  # ... inside a function
    libraries: dict[str, set[str]] = field(default_factory=dict)  # first names of other imports, any level


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(graph: Graph, module: str, is_package: bool, node: ast.AST, packages: tuple[str, ...]):
    """(project modules, other libraries) one import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[:len(parts) - (node.level - 1)]
            base = ".".join(parts) + ("." + node.module if node.module else "")
        # `from pkg import mod` names the module; `from mod import name` the module itself
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in graph.modules else base for a in node.names]
    project = {n for n in names if n.split(".")[0] in packages}
    return {_known(graph, n) for n in project}, {n.split(".")[0] for n in names if n.split(".")[0] not in packages}


def _known(graph: Graph, name: str) -> str:
    while name not in graph.modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def read_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    graph = Graph()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            graph.modules[_module_name(root, path)] = path
    for module, path in graph.modules.items():
        graph.top[module], graph.lazy[module], graph.libraries[module] = set(), set(), set()
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    project, libraries = _targets(graph, module, is_package, child, packages)
                    (graph.lazy if in_function else graph.top)[module].update(project - {module})
                    graph.libraries[module].update(libraries)
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(ast.parse(path.read_text(), str(path)), False)
    return graph


def _allowed(module: str) -> tuple[str, ...]:
    for prefix, allowed in ALLOWED:
        if module == prefix or module.startswith(prefix + "."):
            return allowed
    raise AssertionError(f"{module}: no layer rule names it (add it to ALLOWED and ARCHITECTURE.md)")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def find_layer_breaks(graph: Graph) -> list[str]:
    """'a -> b' for every import a module's layer does not allow, at any level."""
    out = []
    for module in graph.modules:
        for target in sorted(graph.top[module] | graph.lazy[module]):
            if not _within(target, _allowed(module)):
                out.append(f"{module} -> {target}")
    return out


def find_cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), imports at any level."""
    edges = {m: sorted((graph.top[m] | graph.lazy[m]) & graph.modules.keys()) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph.modules:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(edges[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def find_lazy_imports(graph: Graph) -> list[str]:
    return [f"{m} imports {t} inside a function" for m in graph.modules for t in sorted(graph.lazy[m])
            if not _within(m, LAZY_IMPORTS_ALLOWED)]


def find_studies_imported(graph: Graph) -> list[str]:
    """Runtime modules that import measurement code (any `*.studies` module); any module that
    imports a test module."""
    out = []
    for module in graph.modules:
        runtime = ".studies" not in f".{module}"
        for target in sorted(graph.top[module] | graph.lazy[module]):
            if runtime and ".studies" in f".{target}":
                out.append(f"{module} -> {target}")
        if "tests" in graph.libraries[module]:
            out.append(f"{module} -> tests")
    return out


def find_app_io(graph: Graph) -> list[str]:
    """Modules app/ reaches (its own pages and helpers included; imports at any level, followed through
    every module on the way; importing `a.b.c` also runs `a` and `a.b`) that import a process, socket
    or network library. Only the studies (app.studies, run from a shell, never by the dashboard) may."""
    seen, todo = set(), [m for m in graph.modules if _within(m, ("app",)) and not _within(m, ("app.studies",))]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = {module.rsplit(".", i)[0] for i in range(1, module.count(".") + 1)} & graph.modules.keys()
        todo.extend((graph.top[module] | graph.lazy[module] | parents) - seen)
    return [f"{m} (reached from app/) imports {', '.join(sorted(graph.libraries[m] & set(IO_LIBRARIES)))}"
            for m in sorted(seen) if graph.libraries[m] & set(IO_LIBRARIES)]


def find_streamlit_outside_app(graph: Graph) -> list[str]:
    return [m for m in graph.modules if "streamlit" in graph.libraries[m] and not _within(m, ("app",))]


@pytest.fixture(scope="module")
def project() -> Graph:
    return read_graph(ROOT)


def test_every_import_follows_its_layer(project):
    assert len(project.modules) > 80  # the walk saw the project, not an empty tree
    assert find_layer_breaks(project) == []


def test_no_import_cycles(project):
    assert find_cycles(project) == []


def test_project_imports_sit_at_module_top_outside_the_command_line(project):
    assert find_lazy_imports(project) == []
    assert project.lazy["ingest.commands"]  # the one allowed place does use it (start-up)


def test_no_runtime_module_imports_studies_or_tests(project):
    assert find_studies_imported(project) == []


def test_the_dashboard_reaches_no_process_socket_or_git_code(project):
    assert find_app_io(project) == []
    assert find_streamlit_outside_app(project) == []


def _write(root: Path, files: dict[str, str]) -> Graph:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_graph(root)


def test_the_rules_fire_on_a_tree_that_breaks_them(tmp_path):
    graph = _write(tmp_path, {
        "app/__init__.py": "",
        "app/form.py": "from ingest.runs import git\nfrom db import store\n",  # app -> git: a break
        "app/choices.py": "from ingest.runs.engines.choices import x\n",
        "app/screens/__init__.py": "", "app/screens/run.py": "import subprocess\nfrom db import store\n",  # a page
        "app/studies/__init__.py": "", "app/studies/pages.py": "import subprocess\n",  # a study: run from a shell
        "db/__init__.py": "", "db/store.py": "import duckdb\n",
        "ingest/__init__.py": "",
        "ingest/regress/__init__.py": "",
        "ingest/regress/detect.py": "def f():\n    from db.store import x\n",  # pure package -> db, lazily
        "ingest/runs/__init__.py": "",
        "ingest/runs/engines/__init__.py": "from .sglang import run\n",  # runs when app imports choices
        "ingest/runs/engines/choices.py": "",
        "ingest/runs/engines/sglang.py": "import shutil\n",
        "ingest/runs/git.py": "import subprocess\nfrom .hosts import Host\n",
        "ingest/runs/hosts.py": "from . import git\n",  # a cycle with git
        "ingest/runs/worker.py": "from ingest.studies.scale import y\n",
        "ingest/studies/__init__.py": "", "ingest/studies/scale.py": "",
        "kernels/__init__.py": "", "kernels/bench.py": "import streamlit\nimport tests.test_x\n",
        "kernels/studies/__init__.py": "", "kernels/studies/suite.py": "def f():\n    import tests.test_gpu\n",
    })
    assert find_layer_breaks(graph) == ["app.choices -> ingest.runs.engines.choices", "app.form -> ingest.runs.git",
                                        "ingest.regress.detect -> db.store",
                                        "ingest.runs.worker -> ingest.studies.scale"]
    assert find_cycles(graph) == [["ingest.runs.git", "ingest.runs.hosts"]]
    assert find_lazy_imports(graph) == ["ingest.regress.detect imports db.store inside a function"]
    assert find_studies_imported(graph) == ["ingest.runs.worker -> ingest.studies.scale", "kernels.bench -> tests",
                                            "kernels.studies.suite -> tests"]
    assert find_app_io(graph) == ["app.screens.run (reached from app/) imports subprocess",
                                  "ingest.runs.engines.sglang (reached from app/) imports shutil",
                                  "ingest.runs.git (reached from app/) imports subprocess"]
    assert find_streamlit_outside_app(graph) == ["kernels.bench"]
