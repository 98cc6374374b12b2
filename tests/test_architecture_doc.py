"""ARCHITECTURE.md's path of a run, from the form to the chart, is true of the code: every file it
names exists, every function it names is defined in the file it is named after, a leg names at
most five files, and each file of a leg is reached from an earlier one of the same leg (imported,
or run as `python -m` by it). Read from the source with `ast`, as tests/test_layers.py reads it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"
MAX_FILES_PER_LEG = 5


def read_legs(text: str) -> list[list[tuple[str, list[str]]]]:
    """Each numbered leg of the path as [(file, [functions named in its parentheses])], leaving out
    what a leg's last sentence adds on the side ("A range job ... is first expanded by ...")."""
    section = text.split("## The path of a run", 1)[1].split("\n## ", 1)[0]
    legs = []
    for leg in re.findall(r"^\d\. (.*?)(?=^\d\. |\Z)", section, flags=re.M | re.S):
        main = " ".join(leg.split()).split(". A ")[0]
        steps = []
        for part in main.split(" -> "):
            files = re.findall(r"`((?:app|db|ingest|kernels)/[\w/]+\.py)`", part)
            if files:
                steps.append((files[0], re.findall(r"`(\w+)`", part.split(files[0], 1)[1])))
        legs.append(steps)
    return legs


def _module(path: str) -> str:
    return path[:-3].replace("/", ".").removesuffix(".__init__")


def _reached(source: Path) -> set[str]:
    """Project modules a file imports (any level) or runs with `-m` in a string."""
    tree = ast.parse(source.read_text())
    package = _module(str(source.relative_to(ROOT))).rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts) + ("." + node.module if node.module else "")
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"[\w.]+", node.value):
            out.add(node.value)  # "-m", "kernels.bench" in an argv list
    return out


def _defines(path: Path, name: str) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name for n in ast.walk(tree))


LEGS = read_legs(DOC.read_text())


def test_the_doc_has_the_five_legs_from_form_to_chart():
    assert len(LEGS) == 5
    assert LEGS[0][0][0] == "app/screens/run_benchmark.py" and LEGS[-1][-1][0] == "app/charts.py"


@pytest.mark.parametrize("leg", range(len(LEGS)))
def test_each_leg_is_true_of_the_code(leg):
    steps = LEGS[leg]
    assert 2 <= len({f for f, _ in steps}) <= MAX_FILES_PER_LEG
    for i, (file, functions) in enumerate(steps):
        assert (ROOT / file).is_file(), file
        for name in functions:
            assert _defines(ROOT / file, name), f"{file} defines no {name}"
        if i:
            earlier = set().union(*(_reached(ROOT / f) for f, _ in steps[:i]))
            assert _module(file) in earlier or file == steps[i - 1][0], f"{file}: no earlier file of leg {leg + 1} reaches it"


def test_the_check_fails_on_a_path_that_is_not_true(tmp_path):
    text = DOC.read_text().replace("`ingest/runs/engines/registry.py`", "`ingest/runs/engines/nowhere.py`")
    steps = read_legs(text)[1]
    assert [f for f, _ in steps][1] == "ingest/runs/engines/nowhere.py" and not (ROOT / steps[1][0]).exists()
    later = read_legs(DOC.read_text().replace("(`get_trend`)", "(`get_trends_of_everything`)"))[4]
    assert not _defines(ROOT / "db/views.py", later[2][1][0])
