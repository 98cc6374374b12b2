"""Copy kernels/kv_cast.py's live-row kernels and launchers (SHARED, in that order) into the
SGLang patch's verbatim block and fix the new file's hunk length.

    python kernels/patches/sync_kernel_copy.py

tests/test_patch_sglang.py fails until the two copies agree; run this after changing the kernels.
"""

import ast
import re
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
KV_CAST = HERE.parent / "kv_cast.py"
PATCH = HERE / "sglang-0.5.23-mla-gather-then-cast.patch"
BEGIN, END = "begin: verbatim from stepwatch", "end: verbatim from stepwatch"
# Definitions of kernels/kv_cast.py that the patch's mla_kv_cast.py carries, in this order.
SHARED = ("LIVE_CONFIG", "PAGE_INDEX_CONFIG", "_count_sms", "_live_programs", "_piece", "_row_tiles",
          "_fp8_to_bf16", "_move_rows", "_gather_live_kernel", "_copy_live_kernel", "_index_pages_kernel",
          "_fits_int32", "_launch_gather_live", "_launch_copy_live", "_launch_index_pages")


def find_definition(source: str, name: str) -> str:
    """Dedented source of the function (decorators included) or assignment called `name`,
    with the comment lines right above it."""
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            start = node.lineno
        else:
            continue
        while start > 1 and lines[start - 2].strip().startswith("#"):
            start -= 1
        return textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
    raise LookupError(f"{KV_CAST.name} has no definition of {name!r}")


def build_block(kv: str) -> list[str]:
    parts = [find_definition(kv, name) for name in SHARED]
    text = "\n\n\n".join(parts) + "\n"
    return ["+" + line if line else "+" for line in text.rstrip("\n").split("\n")] + ["+", "+"]


def main() -> None:
    lines = PATCH.read_text().split("\n")
    b = next(i for i, line in enumerate(lines) if BEGIN in line)
    e = next(i for i, line in enumerate(lines) if END in line)
    lines = lines[: b + 1] + build_block(KV_CAST.read_text()) + lines[e:]
    h = next(i for i, line in enumerate(lines) if line.startswith("@@ -0,0 +1,"))
    n = 0
    for line in lines[h + 1:]:
        if not line.startswith("+"):
            break
        n += 1
    lines[h] = re.sub(r"@@ -0,0 \+1,\d+ @@", f"@@ -0,0 +1,{n} @@", lines[h])
    PATCH.write_text("\n".join(lines))
    print(f"{PATCH.name}: verbatim block refreshed, new file is {n} lines")


if __name__ == "__main__":
    main()
