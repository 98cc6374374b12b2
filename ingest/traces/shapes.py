"""Bytes an op touches, from the `Input Dims` and `Input type` that record_shapes stores."""

from __future__ import annotations

import json
import math

# torch's C++ type names as the profiler writes them -> bytes per element
DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "c10::Float4_e2m1fn_x2": 1,
    "long int": 8, "int": 4, "short int": 2, "signed char": 1, "unsigned char": 1,
    "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4,
    "unsigned short": 2, "unsigned int": 4, "unsigned long": 8,
}


def summarise_shape(dims_json: bytes, types_json: bytes) -> tuple[float, bool]:
    """(bytes of all tensor inputs, whether the tensor inputs have more than one dtype).

    Bytes are NaN when no input is a tensor with a known dtype. For an in-place or `out=` op
    such as `aten::copy_(self, src)` the written tensor is an input, so the figure is read +
    written bytes; for other ops it is the bytes read."""
    try:
        dims = json.loads(dims_json)
        types = json.loads(types_json)
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth
        return math.nan, False
    if not isinstance(dims, list) or not isinstance(types, list):
        return math.nan, False
    total = 0
    seen_types = set()
    for shape, dtype in zip(dims, types):
        size = DTYPE_BYTES.get(dtype) if isinstance(dtype, str) else None
        if size is None or not isinstance(shape, list) or not shape and dtype == "":
            continue
        if not all(isinstance(n, int) for n in shape):
            continue
        seen_types.add(dtype)
        total += size * math.prod(shape)
    if not seen_types or not 0 <= total < 2**63:  # no tensor, or sizes no tensor can have
        return math.nan, False
    return float(total), len(seen_types) > 1
