"""SGLang 0.5.23's own flashinfer MLA backend, unpatched and patched, on a CUDA GPU (marked `gpu`).

What runs is SGLang's code from its wheel (each variant in its own process) with flashinfer 0.7.2's MLA
kernel JIT-compiled on the machine: kernels.studies.sglang_mla --quick (four points: decode at 131K and
1M-token pools, 16 and 128 heads, eager and under a captured CUDA graph with tables rewritten between
replays; one paged extend). Not SGLang's: `sgl_kernel`, replaced by a stub of every name the wheel
imports from it unguarded at module level (each raises if called; none is), because sglang-kernel cannot
be installed there.

Needs the pack that `python -m kernels.studies.sglang_mla pack DIR` lays out (wheels; it is not in the
repository), named by $STEPWATCH_SGLANG_PACK; skipped without CUDA or without the pack.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

PACK = os.environ.get("STEPWATCH_SGLANG_PACK")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not PACK or not Path(PACK).is_dir():
        pytest.skip("needs $STEPWATCH_SGLANG_PACK (python -m kernels.studies.sglang_mla pack DIR)")
    out = tmp_path_factory.mktemp("sglang-mla")
    proc = subprocess.run([sys.executable, "-m", "kernels.studies.sglang_mla", "run", "--quick", "--pack", PACK,
                           "--out", str(out), "--work", str(out / "work")], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "results.json").read_text())
    return summary[0]["headers"], summary[1:]


def test_each_variant_ran_sglangs_own_tree(study):
    headers, _ = study
    assert headers["unpatched"]["patched_module_present"] is False
    assert headers["patched"]["patched_module_present"] is True
    for header in headers.values():
        assert header["flashinfer"] == "0.7.2"
        assert header["sglang_modules_loaded"] > 300  # the real backend's import chain, not a copy
        assert header["sgl_kernel_names_stubbed"]  # the import chain bound names from the stub...


def test_every_point_ran_and_outputs_are_bit_equal(study):
    _, points = study
    assert len(points) == 4
    for point in points:
        for variant in ("unpatched", "patched"):
            assert "error" not in point[variant], (point["name"], variant, point[variant].get("error"))
            assert point[variant]["sgl_kernel_stubs_called"] == []  # ...and the paths measured called none
        assert point["eager_outputs"]["equal"], (point["name"], point["eager_outputs"])
        if point["name"].startswith("decode"):
            assert point["graph_outputs"]["equal"], (point["name"], point["graph_outputs"])
    # flashinfer's output against float32 attention over torch's cast of the same rows (the points small
    # enough for the reference's loop: the bs 1 decode and the extend)
    checked = [p for p in points if "eager_vs_reference_max_abs" in p["patched"]]
    assert len(checked) == 2
    for point in checked:
        for variant in ("unpatched", "patched"):
            assert point[variant]["eager_vs_reference_max_abs"] < 0.03, (point["name"], variant)


def test_graph_replays_after_table_rewrites_equal_eager(study):
    _, points = study
    for point in [p for p in points if p["name"].startswith("decode")]:
        for variant in ("unpatched", "patched"):
            replays = point[variant]["graph_replays"]
            assert len(replays) == 3 and all(r["all_layers_equal_eager"] for r in replays), (point["name"], variant)


def test_patched_is_faster_where_the_pool_dwarfs_the_batch(study):
    _, points = study
    big = next(p for p in points if p["name"] == "decode-h16-pool1024K-bs8-ctx8K")
    # 64K live rows of a 1M-row pool: the whole-pool cast moves 16x the bytes
    assert big["patched"]["graph_us"] * 3 < big["unpatched"]["graph_us"]
    assert big["patched"]["eager_peak_extra_bytes"] * 3 < big["unpatched"]["eager_peak_extra_bytes"]


def test_graph_capture_peak_is_the_live_rows_not_the_pool(study):
    """The peak while capturing (what the graph's private pool must hold): the whole-pool BF16 copy
    unpatched (1M rows x 576 x 2 B = 1.1 GiB), the live rows' scratch patched (here the kit's runner sizes
    the id buffer bs x context; a real server sizes it to the pool, see kernels/BENCHMARKS.md section 7)."""
    _, points = study
    big = next(p for p in points if p["name"] == "decode-h16-pool1024K-bs8-ctx8K")
    unpatched, patched = (big[v]["graph_capture_peak_extra_bytes"] for v in ("unpatched", "patched"))
    assert unpatched >= 1048576 * 576 * 2
    assert 0 <= patched * 3 < unpatched
