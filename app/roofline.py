"""The Run page's roofline, as data: which kernels it can place, the device's roofs, or why it is not
drawn. Pure functions of the kernel table (Store.list_kernels) and the run's `roofline` (the device
ceilings its fractions are of); app/charts.py draws them."""

from __future__ import annotations

import math

import pandas as pd

from ingest.regress.diagnose import shorten_kernel_name

LABELLED = 5  # the kernels with the most time are named on the chart
# the units whose roofs are drawn, as devices.toml names their peaks, and how the legend says them
UNITS = {"bf16_tflops": "BF16", "fp8_tflops": "FP8", "tf32_tflops": "TF32", "fp32_tflops": "FP32"}
BASES = {"datasheet": "datasheet", "measured": "measured on the card"}
# under this share of kernel time with a measured rate, a roofline says more about the kernels left
# out than about the step: it is not drawn, and the page says how little it would cover
ROOFLINE_MIN_COVERAGE = 0.05


def measured_share(kernels: pd.DataFrame) -> float:
    """The share of kernel time (0..1) in the kernel rows the roofline can place: those with a
    modelled byte or FLOP rate above zero."""
    if not len(kernels) or "tbps" not in kernels:
        return 0.0
    rated = (kernels["tbps"].fillna(0) > 0) | (kernels["tflops"].fillna(0) > 0)
    return float(kernels.loc[rated, "share"].fillna(0).sum())


def explain_missing(kernels: pd.DataFrame, roofline: dict | None) -> str | None:
    """Why the run has no roofline to draw (one line), or None when it has one."""
    if roofline is None:
        return ("No roofline: the run's GPU is not in stepwatch's table of device ceilings "
                "(ingest/traces/devices.toml), or it is a CPU-only trace or was imported before rooflines were kept.")
    if not len(kernels) or "tbps" not in kernels or not kernels["tbps"].notna().any():
        return ("No roofline: no kernel's op has a cost model with recorded shapes (profile with "
                "record_shapes=True; kernels replayed from a CUDA graph have no op of their own to read shapes from).")
    covered = measured_share(kernels)
    if covered < ROOFLINE_MIN_COVERAGE:
        return (f"No roofline drawn: the roofline covers {covered * 100:.1f} % of kernel time (the kernels whose op "
                f"has a cost model with recorded shapes), under the {ROOFLINE_MIN_COVERAGE * 100:.0f} % it needs to "
                "say where the step's time stands against the roofs; those kernels' rates are in the table above.")
    return None


def roofline_points(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel row with a modelled cost: its short name, `row_name` (unique: a bar's),
    `label` (the name for the
    LABELLED with FLOPs and the most time, else ''), `flat` (True: no FLOPs, drawn by bandwidth
    alone, with `bar_label`: its TB/s and fraction of the peak)."""
    known = kernels[kernels["tbps"].notna() & (kernels["tbps"] > 0)].copy()
    known["short_name"] = [shorten_kernel_name(n) for n in known["name"]]
    known["flat"] = ~(known["tflops"].fillna(0) > 0)
    top = known[~known["flat"]].sort_values("share", ascending=False).index[:LABELLED]  # the chart's placed kernels
    known["label"] = ""
    known.loc[top, "label"] = known.loc[top, "short_name"].str.slice(0, 32)
    known["share"] = known["share"].fillna(0.0)
    known["where"] = [s or op for s, op in zip(known["source"].fillna(""), known["launcher"].fillna(""))]
    known["bar_label"] = [f"{format_rate(t)} TB/s" + (f", {f:.0%} of peak" if pd.notna(f) else "")
                          for t, f in zip(known["tbps"], known["bandwidth_fraction"])]
    known["row_name"] = _row_names(known["short_name"].tolist(), known["where"].tolist())
    return known.reset_index(drop=True)


def format_rate(value: float) -> str:
    """A rate with three significant digits (2.04, 0.125, 0.00395), never a rounded-away 0.00."""
    if not value or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{max(0, 2 - math.floor(math.log10(abs(value))))}f}"


def _row_names(short: list[str], where: list[str]) -> list[str]:
    """A bar's name, one per kernel row: its short name, with its op or line where another row
    shares the short name (kernels of one template launched by different ops), and a count
    where that still repeats -- a bar chart draws rows of one name as one bar."""
    counts: dict[str, int] = {}
    for n in short:
        counts[n] = counts.get(n, 0) + 1
    named = [f"{n} · {w}" if counts[n] > 1 and w else n for n, w in zip(short, where)]
    seen: dict[str, int] = {}
    out = []
    for n in named:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n} ({seen[n]})")
    return out


def roof_lines(roofline: dict, points: pd.DataFrame) -> pd.DataFrame:
    """The roofs over the intensities shown: for BF16 and FP32 (the matrix units' and the CUDA
    cores' rate), and FP8 when a kernel shown has FP8 inputs, each peak (datasheet and measured),
    the attainable TFLOP/s min(peak, intensity x bandwidth) at the range's ends and at the ridge."""
    placed = points[~points["flat"]]
    units = {"bf16_tflops", "fp32_tflops"}
    if placed["input_dtypes"].fillna("").str.contains("float8").any():
        units.add("fp8_tflops")
    low = min(float(placed["intensity"].min()) if len(placed) else 0.1, 0.1) / 2
    high = max(float(placed["intensity"].max()) if len(placed) else 1000.0, 1000.0) * 2
    rows = []
    for basis, words in BASES.items():
        peaks = roofline.get(basis) or {}
        tbps = peaks.get("hbm_gbps", 0) / 1e3
        for key, unit in UNITS.items():
            if key not in peaks or key not in units or not tbps:
                continue
            ridge = peaks[key] / tbps
            roof = f"{unit} {words}"
            for x in sorted({low, min(max(ridge, low), high), high}):
                rows.append({"roof": roof, "basis": words, "intensity": x, "tflops": min(peaks[key], x * tbps),
                             "peak_tflops": peaks[key], "tbps": tbps})
    return pd.DataFrame(rows, columns=["roof", "basis", "intensity", "tflops", "peak_tflops", "tbps"])


def bandwidth_roofs(roofline: dict) -> pd.DataFrame:
    """The HBM bandwidth roofs (TB/s), datasheet and measured, for the kernels without FLOPs."""
    rows = [{"roof": f"HBM {words}", "tbps": (roofline.get(basis) or {}).get("hbm_gbps", 0) / 1e3}
            for basis, words in BASES.items()]
    return pd.DataFrame([r for r in rows if r["tbps"] > 0], columns=["roof", "tbps"])


def describe_roofs(roofline: dict) -> str:
    """The caption under the chart: what is modelled, which ceilings the fractions are of, and the bound rule."""
    sheet, measured = roofline["datasheet"], roofline.get("measured")
    text = (f"Each kernel's op costed from its recorded shapes and dtypes (FLOPs: 2·M·N·K a GEMM; bytes: each input "
            f"read and each output written once; an op's cost spread over its kernels by their time), over the "
            f"kernel's time. Fractions in the table are of the {roofline['device']} datasheet "
            f"({sheet.get('bf16_tflops', 0):,.0f} BF16 TFLOP/s, {sheet.get('hbm_gbps', 0) / 1e3:.2f} TB/s): "
            "the limit of every such card, so fractions compare across GPUs.")
    if measured:
        text += (f" Dashed: measured on the card ({measured.get('bf16_tflops', 0):,.0f} BF16 TFLOP/s, "
                 f"{measured.get('hbm_gbps', 0) / 1e3:.2f} TB/s copy; kernels/studies/peaks.py), what a kernel "
                 "reaches in practice.")
    return text + (" Bound: compute past the ridge point, memory before it, latency under 10 % of both roofs; "
                   "ops without a cost model (index, gather, custom kernels) are not drawn.")
