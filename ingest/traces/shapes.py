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


# torch's C++ type names -> the names torch gives them in Python, as a reader knows them
DTYPE_NAMES = {
    "double": "float64", "float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16",
    "c10::Float8_e4m3fn": "float8_e4m3fn", "c10::Float8_e5m2": "float8_e5m2", "c10::Float8_e4m3fnuz": "float8_e4m3fnuz",
    "c10::Float8_e5m2fnuz": "float8_e5m2fnuz", "c10::Float8_e8m0fnu": "float8_e8m0fnu",
    "c10::Float4_e2m1fn_x2": "float4_e2m1fn_x2", "long int": "int64", "int": "int32", "short int": "int16",
    "signed char": "int8", "unsigned char": "uint8", "bool": "bool", "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128", "c10::complex<c10::Half>": "complex32", "unsigned short": "uint16",
    "unsigned int": "uint32", "unsigned long": "uint64",
}


def _tensor_inputs(dims_json: bytes, types_json: bytes) -> list[tuple[list, str]] | None:
    """(shape, C++ type name) of each tensor input with a known dtype; None when unreadable."""
    try:
        dims = json.loads(dims_json)
        types = json.loads(types_json)
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's depth
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    return [(shape, dtype) for shape, dtype in zip(dims, types)
            if isinstance(dtype, str) and dtype in DTYPE_BYTES and isinstance(shape, list)
            and all(isinstance(n, int) for n in shape)]


def summarise_shape(dims_json: bytes, types_json: bytes) -> tuple[float, bool, str]:
    """(bytes of all tensor inputs, whether the tensor inputs have more than one dtype, their
    dtypes as torch names them in Python: 'bfloat16', or 'bfloat16, float8_e4m3fn' in order of
    first appearance; '' when none is known).

    Bytes are NaN when no input is a tensor with a known dtype. For an in-place or `out=` op
    such as `aten::copy_(self, src)` the written tensor is an input, so the figure is read +
    written bytes; for other ops it is the bytes read."""
    tensors = _tensor_inputs(dims_json, types_json)
    if not tensors:
        return math.nan, False, ""
    total = sum(DTYPE_BYTES[dtype] * math.prod(shape) for shape, dtype in tensors)
    dtypes = list(dict.fromkeys(DTYPE_NAMES[dtype] for _, dtype in tensors))
    if not 0 <= total < 2**63:  # sizes no tensor can have
        return math.nan, False, ", ".join(dtypes)
    return float(total), len(dtypes) > 1, ", ".join(dtypes)
