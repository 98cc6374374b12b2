"""The ceilings of known GPUs (ingest/traces/devices.toml: one table of datasheet figures, and
figures measured on the card where kernels/studies/peaks.py was run), matched on the name the
trace's deviceProperties give. Unknown devices get no peaks, and their fractions are null."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tomllib

from ..errors import IngestError

DEVICES_TABLE = Path(__file__).with_name("devices.toml")
FIGURES = ("hbm_gbps", "bf16_tflops", "fp8_tflops", "tf32_tflops", "fp32_tflops")


@dataclass(frozen=True)
class DevicePeaks:
    name: str  # the model, as the table names it
    pattern: str
    datasheet: dict  # FIGURES present on the datasheet -> value
    measured: dict | None  # FIGURES measured on the card -> value, and "source"; None when never measured

    def describe(self) -> dict:
        """What a run stores of its device's ceilings (runs.roofline): plain JSON values."""
        return {"device": self.name, "basis": "datasheet", "datasheet": dict(self.datasheet),
                "measured": dict(self.measured) if self.measured else None}


def _figures(body: dict, where: str) -> dict:
    out = {}
    for key in FIGURES:
        if key in body:
            value = body[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise IngestError(f"{DEVICES_TABLE}: {where} field {key!r} must be a positive number")
            out[key] = float(value)
    return out


@lru_cache(maxsize=1)
def load_devices() -> tuple[DevicePeaks, ...]:
    try:
        body = tomllib.loads(DEVICES_TABLE.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise IngestError(f"{DEVICES_TABLE}: cannot read the device table ({e})") from None
    devices = []
    for i, entry in enumerate(body.get("device", []), 1):
        where = f"device {i}"
        if not isinstance(entry.get("pattern"), str) or not isinstance(entry.get("name"), str):
            raise IngestError(f"{DEVICES_TABLE}: {where} needs a 'pattern' and a 'name'")
        measured = entry.get("measured")
        measured = _figures(measured, where + " measured") | {"source": str(measured.get("source", ""))} \
            if isinstance(measured, dict) else None
        devices.append(DevicePeaks(entry["name"], entry["pattern"], _figures(entry, where), measured))
    return tuple(devices)


def find_device(device_name: str | None) -> DevicePeaks | None:
    """The table's first row whose pattern the name matches; None for no name or no match."""
    if not device_name:
        return None
    for device in load_devices():
        if re.search(device.pattern, device_name, re.IGNORECASE):
            return device
    return None


def find_peak_gbps(device_name: str | None) -> float | None:
    """The device's datasheet memory bandwidth in GB/s (what `peak_fraction` divides by)."""
    device = find_device(device_name)
    return device.datasheet.get("hbm_gbps") if device else None
