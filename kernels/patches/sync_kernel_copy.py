"""Copy kernels/kv_cast.py's gather-cast (GATHER_CONFIG, _fp8_to_bf16, _gather_cast_kernel,
_launch_gather) into the SGLang patch's verbatim block and fix the new file's hunk length.

    python kernels/patches/sync_kernel_copy.py

tests/test_patch_sglang.py fails until the two copies agree; run this after changing the kernel.
"""

import re
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
KV_CAST = HERE.parent / "kv_cast.py"
PATCH = HERE / "sglang-0.5.23-mla-gather-then-cast.patch"
BEGIN, END = "begin: verbatim from stepwatch", "end: verbatim from stepwatch"


def cut(src: str, start: str, stop: str) -> str:
    i = src.index(start)
    return src[i:src.index(stop, i + len(start))].rstrip() + "\n"


def build_block(kv: str) -> list[str]:
    config = re.search(r"^GATHER_CONFIG = .*$", kv, re.M).group(0)
    fp8 = textwrap.dedent(cut(kv, "    @triton.jit\n    def _fp8_to_bf16", "    @triton.jit\n    def _cast_kernel"))
    kernel = textwrap.dedent(cut(kv, "    @triton.jit\n    def _gather_cast_kernel", "def _use_triton("))
    launch = cut(kv, "def _launch_gather(", "def gather_cast_fp8_to_bf16(")
    text = f"{config}\n\n\n{fp8}\n\n{kernel}\n\n{launch}\n\n"
    return ["+" + line for line in text.rstrip("\n").split("\n")] + ["+", "+"]


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
