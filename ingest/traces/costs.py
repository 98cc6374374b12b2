"""What one op call must compute and move, from the shapes and dtypes record_shapes stores.

`model_op_cost(op, dims, types, concrete=None)` is a pure function of an op's name, its
`Input Dims`, its `Input type` and (optionally) its `Concrete Inputs`, as the profiler writes them
for the op that launched a kernel. It knows nothing of traces, so anything that can name a
kernel's op and its input shapes can feed it: the import (analyse.py) does for eager kernels;
kernels replayed from a CUDA graph have no per-kernel op and stay unknown until their op is
attributed, and then the attributed op's shapes go through this same function.

Conventions
- FLOPs: a multiply-add is 2 FLOPs. GEMM (mm, bmm, addmm, baddbmm, linear, matmul, _scaled_mm,
  _grouped_mm): 2*M*N*K a product (the epilogue's bias add and scaling not counted). Attention
  (SDPA and its flash/efficient/cuDNN forwards): 2*B*H*Sq*Sk*(D + Dv) (QK^T and PV; the softmax's
  few FLOPs an element not counted); causal with Sq == Sk counts the Sq*(Sq+1)/2 pairs kept.
  Fused MoE: 2*T*k*H*(2I) + 2*T*k*I*H. Elementwise: 1 FLOP an output element (a transcendental
  counts 1); softmax 5 an element (max, subtract, exp, sum, divide); RMS norm 4 (square, sum,
  scale, weight); layer norm 7 (mean, centre, square, sum, scale, weight, bias). Casts, copies,
  fills and collectives: 0 (a collective's additions are not counted).
- Bytes: the fewest a call must move through device memory, read plus written: each tensor input
  read once, each output written once, at its dtype's size. In-place ops and `out=` tensors
  count the written tensor once as written (and once as read when the op reads it: add_ does,
  copy_'s destination is not read). Intermediates an implementation keeps in memory are not
  counted: a kernel that re-reads or spills moves more than this, which shows as a lower
  fraction of bandwidth, as it should. Small side outputs are left out too (an attention
  forward's logsumexp: Sq*H floats beside its Sq*H*D output); norms count their FP32 statistics.
  A GEMM's output has its first input's dtype; _scaled_mm's is its `out_dtype` from Concrete
  Inputs (recorded as None: its inputs' dtype), taken as BF16 (what FP8 GEMMs in SGLang and vLLM
  return) when they were not recorded. Fused MoE reads the weights of min(E, T*k) experts: every
  routed token on its own expert, an upper bound on the experts touched (so a lower bound on the
  fraction of bandwidth it gets).
- Unit: which peak the FLOPs count against: "bf16" (BF16 and FP16 matrix units), "fp8",
  "fp32" (an FP32 GEMM or attention: plain FP32, or TF32 when the kernel's name says so) for
  matrix ops by their input dtype; "vector" (the FP32 CUDA-core rate) for elementwise, softmax
  and norms; "" for FLOP-free ops and dtypes no table has a peak for (FP64, integers).
- Unknown: an op not modelled here, shapes that do not fit its signature, or a figure that
  needs what was not recorded (varlen attention, causal attention with Sq > 1 and no Concrete
  Inputs) give NaN for that figure: never a guess. Ops that touch only part of their inputs
  (index, gather, scatter, embedding) are not modelled.

Everything takes and returns plain values; `model_shape_cost` parses the profiler's JSON.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial

from .shapes import DTYPE_BYTES

NAN = math.nan


@dataclass(frozen=True)
class OpCost:
    flops: float  # per call; NaN unknown
    bytes: float  # per call, read + written; NaN unknown
    kind: str  # gemm, attention, moe, norm, softmax, elementwise, cast, copy, communication; "" unknown
    unit: str  # bf16, fp8, fp32, vector, or "" (no FLOPs, or no peak for the dtype)


UNKNOWN = OpCost(NAN, NAN, "", "")

# at::ScalarType codes as Concrete Inputs write a dtype argument -> the profiler's type names
SCALAR_TYPES = {0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int", 5: "c10::Half",
                6: "float", 7: "double", 11: "bool", 15: "c10::BFloat16", 23: "c10::Float8_e5m2",
                24: "c10::Float8_e4m3fn", 25: "c10::Float8_e5m2fnuz", 26: "c10::Float8_e4m3fnuz"}
_MATRIX_UNITS = {"c10::BFloat16": "bf16", "c10::Half": "bf16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
                 "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}


@dataclass(frozen=True)
class Arg:
    """One input: a tensor (shape and type name) or anything else (shape None)."""

    shape: tuple[int, ...] | None
    dtype: str | None
    concrete: object = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def _args(dims: list, types: list, concrete: list | None) -> list[Arg]:
    out = []
    for i, (shape, dtype) in enumerate(zip(dims, types)):
        value = concrete[i] if concrete is not None and i < len(concrete) else None
        tensor = (isinstance(dtype, str) and dtype in DTYPE_BYTES and isinstance(shape, list)
                  and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape))
        out.append(Arg(tuple(shape) if tensor else None, dtype if tensor else None, value))
    return out


def _tensor(args: list[Arg], i: int, ndim: int | None = None) -> Arg | None:
    if i >= len(args) or args[i].shape is None:
        return None
    return args[i] if ndim is None or len(args[i].shape) == ndim else None


def _flag(args: list[Arg], i: int) -> bool | None:
    """A bool argument from Concrete Inputs ('True'/'False'); None when not recorded."""
    value = args[i].concrete if i < len(args) else None
    return {"True": True, "False": False, "true": True, "false": False}.get(value) if isinstance(value, str) else None


def _dtype_arg(args: list[Arg], i: int) -> str | None:
    """A dtype argument from Concrete Inputs (its at::ScalarType code), as a type name."""
    value = args[i].concrete if i < len(args) else None
    try:
        return SCALAR_TYPES.get(int(value)) if isinstance(value, str) and value.strip() else None
    except ValueError:
        return None


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    ndim = max(len(s) for s in shapes)
    out = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _gemm(flops: float, read: float, out_elems: float, out_dtype: str | None, unit_dtype: str) -> OpCost:
    if out_dtype not in DTYPE_BYTES:
        return UNKNOWN
    return OpCost(float(flops), float(read + out_elems * DTYPE_BYTES[out_dtype]), "gemm",
                  _MATRIX_UNITS.get(unit_dtype, ""))


def _mm(args: list[Arg]) -> OpCost:
    a, b = _tensor(args, 0, 2), _tensor(args, 1, 2)
    if a is None or b is None or a.shape[1] != b.shape[0]:
        return UNKNOWN
    (m, k), n = a.shape, b.shape[1]
    return _gemm(2 * m * n * k, a.nbytes + b.nbytes, m * n, a.dtype, a.dtype)


def _bmm(args: list[Arg], first: int = 0, extra_read: float = 0.0) -> OpCost:
    a, b = _tensor(args, first, 3), _tensor(args, first + 1, 3)
    if a is None or b is None or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return UNKNOWN
    (batch, m, k), n = a.shape, b.shape[2]
    return _gemm(2 * batch * m * n * k, a.nbytes + b.nbytes + extra_read, batch * m * n, a.dtype, a.dtype)


def _addmm(args: list[Arg]) -> OpCost:
    bias = _tensor(args, 0)
    cost = _mm(args[1:])
    return cost if bias is None or cost is UNKNOWN else OpCost(cost.flops, cost.bytes + bias.nbytes, "gemm", cost.unit)


def _baddbmm(args: list[Arg]) -> OpCost:
    base = _tensor(args, 0)
    return UNKNOWN if base is None else _bmm(args, 1, base.nbytes)


def _linear(args: list[Arg]) -> OpCost:
    x, w, bias = _tensor(args, 0), _tensor(args, 1, 2), _tensor(args, 2)
    if x is None or w is None or not x.shape or x.shape[-1] != w.shape[1]:
        return UNKNOWN
    m, (n, k) = math.prod(x.shape[:-1]), w.shape
    return _gemm(2 * m * n * k, x.nbytes + w.nbytes + (bias.nbytes if bias else 0), m * n, x.dtype, x.dtype)


def _matmul(args: list[Arg]) -> OpCost:
    a, b = _tensor(args, 0), _tensor(args, 1)
    if a is None or b is None or not a.shape or not b.shape:
        return UNKNOWN
    sa = a.shape if len(a.shape) > 1 else (1,) + a.shape  # a vector is a row (left) or a column (right)
    sb = b.shape if len(b.shape) > 1 else b.shape + (1,)
    if sa[-1] != sb[-2]:
        return UNKNOWN
    if len(sb) == 2:  # [..., M, K] x [K, N]: one GEMM of all the leading rows
        m, k, n, batch = math.prod(sa[:-1]), sa[-1], sb[-1], 1
    else:
        lead = _broadcast([sa[:-2], sb[:-2]])
        if lead is None:
            return UNKNOWN
        m, k, n, batch = sa[-2], sa[-1], sb[-1], math.prod(lead)
    return _gemm(2 * batch * m * n * k, a.nbytes + b.nbytes, batch * m * n, a.dtype, a.dtype)


def _scaled_mm(args: list[Arg]) -> OpCost:
    """_scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)."""
    a, b = _tensor(args, 0, 2), _tensor(args, 1, 2)
    if a is None or b is None or a.shape[1] != b.shape[0]:
        return UNKNOWN
    (m, k), n = a.shape, b.shape[1]
    read = sum(t.nbytes for t in (a, b, *(_tensor(args, i) for i in (2, 3, 4, 5))) if t is not None)
    if len(args) > 6 and isinstance(args[6].concrete, str):  # recorded: a dtype code, or '' (None: a's dtype)
        out_dtype = _dtype_arg(args, 6) if args[6].concrete.strip() else a.dtype
    else:
        out_dtype = "c10::BFloat16"
    return _gemm(2 * m * n * k, read, m * n, out_dtype, a.dtype)


def _grouped_mm(args: list[Arg]) -> OpCost:
    """_grouped_mm(a [T, K], b [E, K, N], offs, ...): each row of a times its group's matrix."""
    a, b = _tensor(args, 0), _tensor(args, 1)
    if a is None or b is None:
        return UNKNOWN
    if len(a.shape) == 3 and len(b.shape) == 3:
        return _bmm(args)
    if len(a.shape) != 2 or len(b.shape) != 3 or a.shape[1] != b.shape[1]:
        return UNKNOWN
    (t, k), n = a.shape, b.shape[2]
    offs = _tensor(args, 2)
    return _gemm(2 * t * k * n, a.nbytes + b.nbytes + (offs.nbytes if offs else 0), t * n, a.dtype, a.dtype)


def _fused_experts(args: list[Arg]) -> OpCost:
    """SGLang's and vLLM's fused_experts(hidden [T, H], w1 [E, 2I, H], w2 [E, H, I], topk_weights [T, k],
    topk_ids [T, k], ...): gate-up GEMM, activation, down GEMM for each token's k experts."""
    x, w1, w2 = _tensor(args, 0, 2), _tensor(args, 1, 3), _tensor(args, 2, 3)
    weights, ids = _tensor(args, 3, 2), _tensor(args, 4, 2)
    if None in (x, w1, w2, weights, ids):
        return UNKNOWN
    (t, h), (e, two_i, h1), (e2, h2, i) = x.shape, w1.shape, w2.shape
    if not (h == h1 == h2 and e == e2 and two_i == 2 * i and ids.shape == weights.shape and ids.shape[0] == t):
        return UNKNOWN
    k = ids.shape[1]
    experts = min(e, t * k)
    per_expert = w1.nbytes / e + w2.nbytes / e
    moved = x.nbytes * 2 + experts * per_expert + weights.nbytes + ids.nbytes  # hidden in, the same size out
    return OpCost(float(2 * t * k * h * two_i + 2 * t * k * i * h), float(moved), "moe",
                  _MATRIX_UNITS.get(w1.dtype, ""))


# Attention: (layout, index of q, k, v, index of the causal flag or mask type, index of cum_seq_q or None)
_ATTENTION = {
    "aten::scaled_dot_product_attention": ("BHSD", 5, None),
    "aten::_scaled_dot_product_flash_attention": ("BHSD", 4, None),
    "aten::_scaled_dot_product_efficient_attention": ("BHSD", 6, None),
    "aten::_scaled_dot_product_cudnn_attention": ("BHSD", 6, None),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("BHSD", 4, None),
    "aten::_flash_attention_forward": ("BSHD", 8, 3),
    "aten::_efficient_attention_forward": ("BSHD", 9, 4),
}


def _attention(op: str, args: list[Arg]) -> OpCost:
    layout, causal_at, cum_seq_at = _ATTENTION[op]
    q, k, v = (_tensor(args, i) for i in range(3))
    if q is None or k is None or v is None:
        return UNKNOWN
    moved = float(q.nbytes + k.nbytes + v.nbytes)
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4 or (
            cum_seq_at is not None and _tensor(args, cum_seq_at) is not None):  # varlen: lengths not recorded
        return OpCost(NAN, NAN, "attention", _MATRIX_UNITS.get(q.dtype, ""))
    if layout == "BHSD":
        (b, h, sq, d), sk, dv = q.shape, k.shape[2], v.shape[3]
    else:
        (b, sq, h, d), sk, dv = q.shape, k.shape[1], v.shape[3]
    moved += b * h * sq * dv * DTYPE_BYTES[q.dtype]  # the output, in q's dtype
    if op == "aten::_efficient_attention_forward":  # custom_mask_type: 0 none, 1 top-left, 2 bottom-right causal
        code = args[causal_at].concrete if causal_at < len(args) else None
        causal = {"0": False, "1": True, "2": True}.get(code) if isinstance(code, str) else None
    else:
        causal = _flag(args, causal_at)
    if causal is None and sq == 1:
        causal = False  # one query (decode): a causal mask leaves it every key it attends to
    if causal is None or (causal and sq != sk):
        pairs = NAN  # which (query, key) pairs count is not known, or depends on the mask's alignment
    else:
        pairs = sq * (sq + 1) / 2 if causal else sq * sk
    return OpCost(2.0 * b * h * pairs * (d + dv), moved, "attention", _MATRIX_UNITS.get(q.dtype, ""))


def _elementwise(flops_per_element: float, kind: str = "elementwise"):
    """Tensor inputs broadcast to one output of the first tensor's dtype (in place: the output is
    `self`, read and written)."""
    def model(args: list[Arg]) -> OpCost:
        tensors = [a for a in args if a.shape is not None]
        if not tensors:
            return UNKNOWN
        shape = _broadcast([t.shape for t in tensors])
        if shape is None:
            return UNKNOWN
        out = math.prod(shape)
        moved = sum(t.nbytes for t in tensors) + out * DTYPE_BYTES[tensors[0].dtype]
        return OpCost(float(flops_per_element * out), float(moved), kind, "vector")
    return model


def _softmax(args: list[Arg]) -> OpCost:
    x = _tensor(args, 0)
    if x is None:
        return UNKNOWN
    return OpCost(5.0 * x.numel, 2.0 * x.nbytes, "softmax", "vector")  # half_to_float is not honoured: rare


def _norm(flops_per_element: float, stats_per_row: int, weight_at: tuple[int, ...]):
    """x [..., N] normalised over its last dims, weights (and bias) read, the output and
    `stats_per_row` FP32 statistics a row written."""
    def model(args: list[Arg]) -> OpCost:
        x = _tensor(args, 0)
        if x is None or not x.shape:
            return UNKNOWN
        extra = [_tensor(args, i) for i in weight_at]
        row = max((math.prod(w.shape) for w in extra if w is not None and w.shape), default=x.shape[-1])
        rows = x.numel // row if row else 0
        moved = 2 * x.nbytes + sum(w.nbytes for w in extra if w is not None) + 4 * stats_per_row * rows
        return OpCost(float(flops_per_element * x.numel), float(moved), "norm", "vector")
    return model


def _copy(args: list[Arg]) -> OpCost:
    """copy_(self, src): src read, self written (not read)."""
    dst, src = _tensor(args, 0), _tensor(args, 1)
    if dst is None or src is None:
        return UNKNOWN
    return OpCost(0.0, float(src.nbytes + dst.nbytes), "cast" if dst.dtype != src.dtype else "copy", "")


def _to_copy(args: list[Arg]) -> OpCost:
    """_to_copy(self, dtype, ...): self read, a tensor of `dtype` (self's when not given) written."""
    x = _tensor(args, 0)
    if x is None or len(args) < 2 or args[1].concrete is None:
        return UNKNOWN
    target = _dtype_arg(args, 1) if str(args[1].concrete).strip() else x.dtype
    if target not in DTYPE_BYTES:
        return UNKNOWN
    return OpCost(0.0, float(x.nbytes + x.numel * DTYPE_BYTES[target]), "cast" if target != x.dtype else "copy", "")


def _clone(args: list[Arg]) -> OpCost:
    x = _tensor(args, 0)
    return UNKNOWN if x is None else OpCost(0.0, 2.0 * x.nbytes, "copy", "")


def _fill(args: list[Arg]) -> OpCost:
    x = _tensor(args, 0)
    return UNKNOWN if x is None else OpCost(0.0, float(x.nbytes), "copy", "")


def _all_reduce(args: list[Arg]) -> OpCost:
    """The tensor read and the result written over it (in place); what crosses the links between
    GPUs is not device-memory traffic and is not counted here."""
    x = _tensor(args, 0)
    return UNKNOWN if x is None else OpCost(0.0, 2.0 * x.nbytes, "communication", "")


_BINARY = ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "rsub", "atan2", "remainder", "fmod")
_UNARY = ("silu", "gelu", "relu", "sigmoid", "tanh", "exp", "neg", "rsqrt", "sqrt", "abs", "reciprocal", "sin",
          "cos", "log", "erf", "clamp", "square", "exp2", "log2", "hardswish", "leaky_relu", "elu", "mish")
MODELS = {
    "aten::mm": _mm, "aten::bmm": _bmm, "aten::addmm": _addmm, "aten::baddbmm": _baddbmm,
    "aten::linear": _linear, "aten::matmul": _matmul, "aten::_scaled_mm": _scaled_mm,
    "aten::_grouped_mm": _grouped_mm,
    "sglang::inplace_fused_experts": _fused_experts, "sglang::outplace_fused_experts": _fused_experts,
    "vllm::inplace_fused_experts": _fused_experts, "vllm::outplace_fused_experts": _fused_experts,
    "aten::_softmax": _softmax, "aten::softmax": _softmax, "aten::_log_softmax": _softmax,
    "aten::_fused_rms_norm": _norm(4, 1, (2,)), "aten::rms_norm": _norm(4, 1, (2,)),
    "aten::native_layer_norm": _norm(7, 2, (2, 3)), "aten::layer_norm": _norm(7, 2, (2, 3)),
    "aten::copy_": _copy, "aten::_to_copy": _to_copy, "aten::clone": _clone,
    "aten::fill_": _fill, "aten::zero_": _fill,
    "c10d::allreduce_": _all_reduce, "_c10d_functional::all_reduce": _all_reduce,
    "_c10d_functional::all_reduce_": _all_reduce,
    **{f"aten::{name}{suffix}": _elementwise(1) for name in _BINARY + _UNARY for suffix in ("", "_")},
}


def model_op_cost(op: str, dims: list, types: list, concrete: list | None = None) -> OpCost:
    """FLOPs, bytes (read + written), kind and unit of one call of `op` with these inputs (the
    profiler's Input Dims, Input type and Concrete Inputs, parsed); NaN figures where unknown."""
    model = partial(_attention, op) if op in _ATTENTION else MODELS.get(op)
    if model is None or not isinstance(dims, list) or not isinstance(types, list):
        return UNKNOWN
    try:
        cost = model(_args(dims, types, concrete if isinstance(concrete, list) else None))
    except (ValueError, TypeError, OverflowError, ZeroDivisionError):  # shapes no real call has
        return UNKNOWN
    sane = [v for v in (cost.flops, cost.bytes) if not math.isnan(v)]
    if any(not 0 <= v < 2.0 ** 63 for v in sane):
        return UNKNOWN
    return cost


def model_shape_cost(op: str, dims_json: bytes, types_json: bytes, concrete_json: bytes | None = None) -> OpCost:
    """model_op_cost from the profiler's JSON text of the three fields (unreadable JSON: unknown)."""
    try:
        dims, types = json.loads(dims_json), json.loads(types_json)
        concrete = json.loads(concrete_json) if concrete_json else None
    except (ValueError, RecursionError):
        return UNKNOWN
    return model_op_cost(op, dims, types, concrete)
