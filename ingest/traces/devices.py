"""Peak memory bandwidth of known GPUs, matched on the name the trace's deviceProperties give.

Vendor datasheet figures in GB/s (10^9 bytes per second). First match wins, so more specific
patterns come first. Unknown devices get no peak, and their peak fractions are null."""

from __future__ import annotations

import re

PEAK_GBPS = [
    (r"H200", 4800.0),
    (r"H100.*NVL", 3900.0),
    (r"H100.*PCIe", 2000.0),
    (r"H100", 3350.0),
    (r"H800.*PCIe", 2000.0),
    (r"H800", 3350.0),
    (r"H20\b", 4000.0),
    (r"GB200|B200", 8000.0),
    (r"B100", 8000.0),
    (r"GB300|B300", 8000.0),
    (r"RTX PRO 6000", 1792.0),
    (r"A100.*80GB.*PCIe", 1935.0),
    (r"A100.*80GB", 2039.0),
    (r"A100", 1555.0),
    (r"A800", 2039.0),
    (r"L40S", 864.0),
    (r"L40\b", 864.0),
    (r"L4\b", 300.0),
    (r"A10G", 600.0),
    (r"A10\b", 600.0),
    (r"RTX 5090", 1792.0),
    (r"RTX 4090", 1008.0),
    (r"RTX 3090", 936.0),
    (r"V100", 900.0),
    (r"MI355X", 8000.0),
    (r"MI325X", 6000.0),
    (r"MI300X", 5300.0),
]


def find_peak_gbps(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for pattern, gbps in PEAK_GBPS:
        if re.search(pattern, device_name, re.IGNORECASE):
            return gbps
    return None
