"""The roofline of each kernel row: its op's modelled FLOPs and bytes (ingest/traces/costs.py),
what it achieved, and how far that is from the device's ceilings (ingest/traces/devices.toml).

Arrays in, arrays out, as analyse.py's other stages.

1. An op's cost goes to the kernels it launched itself in proportion to their time
   (`spread_op_costs`): a GEMM that runs a split-K kernel (33 us) and its reduction (1.5 us)
   gives 96 % of its FLOPs and bytes to the first and 4 % to the second, so each of the op's
   kernels shows the op's own achieved rate and the op's FLOPs and bytes are counted once. An
   op whose kernels all lasted 0 us splits its cost equally among them.
2. Per kernel row (`summarise_roofline`): FLOPs and bytes per call (medians over its calls);
   intensity (FLOPs / bytes); achieved TFLOP/s and TB/s (its FLOPs and bytes over its time);
   `compute_fraction`, the time its FLOPs would take at the peak of their unit over the time
   they took (per call, so a row of several dtypes is weighed rightly; an FP32 GEMM counts
   against TF32 when its kernel's name says tf32), and `bandwidth_fraction`, its TB/s over the
   HBM peak. Figures are null unless every call of the row has them (as bytes_per_call).
3. The bound: "compute" when the row's compute fraction exceeds its bandwidth fraction (its
   intensity lies right of the ridge point, peak FLOP/s / peak bandwidth), "memory" otherwise,
   and "latency" when the larger of the two is under LATENCY_FRACTION: the kernel gets under a
   tenth of both roofs, so its time goes to launch, synchronisation or too little parallel
   work, not to throughput. Collectives are "communication": what limits them is the link
   between GPUs, which the table has no figure for, so their fractions stay null. Unknown
   (null) when either fraction is.

The fractions are of the datasheet figures (devices.toml says why); the run stores both the
datasheet and the measured ceilings (`DevicePeaks.describe`) for the chart to draw.
"""

from __future__ import annotations

import math
import re

import numpy as np

from .table import Groups, Table

LATENCY_FRACTION = 0.10  # under a tenth of both roofs: bound by latency, not throughput
UNIT_PEAKS = {"bf16": "bf16_tflops", "fp8": "fp8_tflops", "fp32": "fp32_tflops", "tf32": "tf32_tflops",
              "vector": "fp32_tflops"}
_TF32_KERNEL = re.compile(r"tf32|s1688|s16816|tensorop_s", re.IGNORECASE)
COLUMNS = ("flops_per_call", "model_bytes_per_call", "intensity", "tflops", "tbps", "compute_fraction",
           "bandwidth_fraction", "bound")


def spread_op_costs(op_event: np.ndarray, dur_us: np.ndarray, op_flops: np.ndarray,
                    op_bytes: np.ndarray, is_kernel: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each kernel's part of its op's FLOPs and bytes (given per kernel: its op's, NaN for no op),
    in proportion to its time among the kernels of the same op event (equal parts when they
    all took 0 us). With `is_kernel` (False for a memset or memcpy activity), an op that launched
    kernels spreads its cost over those alone: the memset that zeroes a split-K GEMM's workspace
    is not the GEMM's arithmetic (it gets NaN); an op of memsets or copies only spreads over them."""
    if is_kernel is not None:
        has_kernel = np.zeros(max(int(op_event.max(initial=-1)) + 1, 1), bool)
        has_kernel[op_event[(op_event >= 0) & is_kernel]] = True
        aside = (op_event >= 0) & ~is_kernel & has_kernel[np.maximum(op_event, 0)]
        op_event = np.where(aside, -1, op_event)
    known = op_event >= 0
    key = np.where(known, op_event, 0)
    _, op_code = np.unique(key, return_inverse=True)
    op_code = op_code.reshape(-1)
    op_us = np.bincount(op_code, weights=np.where(known, dur_us, 0.0))
    op_kernels = np.bincount(op_code, weights=known.astype(float))
    total = op_us[op_code]
    part = np.where(total > 0, dur_us / np.where(total > 0, total, 1.0), 1.0 / np.maximum(op_kernels[op_code], 1))
    part = np.where(known, part, math.nan)
    return op_flops * part, op_bytes * part


def resolve_units(units: np.ndarray, kernel_names: np.ndarray) -> np.ndarray:
    """The peak each kernel's FLOPs count against: its op's unit, "fp32" made "tf32" where the
    kernel's name says it ran on TF32 tensor cores."""
    out = units.astype(object).copy()
    fp32 = np.flatnonzero(out == "fp32")
    if len(fp32):
        tf32 = np.array([bool(_TF32_KERNEL.search(str(n))) for n in kernel_names[fp32]], bool)
        out[fp32[tf32]] = "tf32"
    return out


def _peak_per_kernel(units: np.ndarray, peaks: dict) -> np.ndarray:
    """TFLOP/s of each kernel's unit on this device (NaN where the table has none)."""
    out = np.full(len(units), math.nan)
    for unit, key in UNIT_PEAKS.items():
        if key in peaks:
            out[units == unit] = peaks[key]
    return out


def summarise_roofline(group: np.ndarray, n_groups: int, dur_us: np.ndarray, flops: np.ndarray,
                       nbytes: np.ndarray, units: np.ndarray, kinds: np.ndarray,
                       peaks: dict | None) -> Table:
    """One row per group (kernel row) with COLUMNS; `peaks` the device's datasheet figures
    (devices.toml's keys), None when the device is unknown (fractions and bound then null)."""
    groups = Groups(group, n_groups)
    peaks = peaks or {}
    peak_tflops = _peak_per_kernel(units, peaks)
    # the time the FLOPs would take at their unit's peak (FLOP-free kernels: none, whatever their unit)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_peak_us = np.where(flops == 0, 0.0, flops / (peak_tflops * 1e6))
    calls = groups.counts
    present = calls > 0

    def when_all_known(values: np.ndarray, figure: np.ndarray) -> np.ndarray:
        """The group's figure where every call has the value, else NaN."""
        return np.where(present & (groups.count_known(values) == calls), figure, math.nan)

    flops_sum, bytes_sum = when_all_known(flops, groups.sum(flops)), when_all_known(nbytes, groups.sum(nbytes))
    dur_sum = np.where(present, groups.sum(dur_us), math.nan)
    time = np.where(dur_sum > 0, dur_sum, math.nan)
    comm = groups.any(kinds == "communication")
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {"flops_per_call": when_all_known(flops, groups.median(flops)),
               "model_bytes_per_call": when_all_known(nbytes, groups.median(nbytes)),
               "intensity": flops_sum / np.where(bytes_sum > 0, bytes_sum, math.nan),
               "tflops": flops_sum / time / 1e6, "tbps": bytes_sum / time / 1e6}
        at_peak = when_all_known(at_peak_us, groups.sum(at_peak_us))
        out["compute_fraction"] = np.where(comm, math.nan, at_peak / time)
        hbm_tbps = peaks.get("hbm_gbps", math.nan) / 1e3
        out["bandwidth_fraction"] = np.where(comm, math.nan, out["tbps"] / hbm_tbps)
    cf, bf = out["compute_fraction"], out["bandwidth_fraction"]
    top = np.fmax(cf, bf)
    bound = np.where(cf > bf, "compute", "memory").astype(object)
    bound[top < LATENCY_FRACTION] = "latency"
    bound[np.isnan(cf) | np.isnan(bf)] = None
    bound[comm & ~np.isnan(out["tbps"])] = "communication"
    out["bound"] = bound
    return Table(out)
