"""Weight-only quantization of the dense layers, asked for at compile time (``weights="int8"``).

Decode is bound by the bytes of the weights it streams; CPU users run models with their weights
quantized (llama.cpp's Q8_0, OpenVINO's NNCF ``INT8_SYM`` / ``INT8_ASYM``, MLC's ``q4f16``).
``QuantizeWeights`` rewrites each dense layer whose weight is a constant, ``matmul(x, W)`` with W
(K x N) float, to

    matmul(x, Wq, out_dtype="float32") * scale        (then cast back to the layer's dtype)

with ``Wq`` int8, one symmetric scale per output channel (``scale[n] = max_k |W[k, n]| / 127``):
``x @ (Wq * scale) = (x @ Wq) * scale`` exactly, so the scale is the matmul's epilogue and
``dense_cpu`` packs ``Wq`` as int8 (a quarter of float32's bytes) and widens it in registers.
The model's precision changes because the user asked; the report says which layers changed.
A weight read as ``permute_dims`` of a constant (how ``nn.Linear`` imports before constant
folding) is taken too.  Embeddings (``take``) keep their precision.
"""
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.ir.expr import GenericConst

MIN_SIDE = 16       # a smaller constant matrix is left as it is (a model's fixed mixing, not a layer)
FLOATS = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class WeightFormat:
    """A weight-only format: its name, the bits a weight takes and how it is quantized (a
    ``(K, N)`` float array to ``(Wq, scale per column)``)."""
    name: str
    bits: int
    quantize: Callable


def quantize_int8(weight):
    """``(Wq, scale)`` for a (K, N) float array: int8 in [-127, 127], one float32 scale per
    column (an all-zero column gets scale 1)."""
    w = np.asarray(weight, dtype=np.float64)
    scale = np.abs(w).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale.astype(np.float32)


FORMATS = {"int8": WeightFormat("int8", 8, quantize_int8)}


def weight_format(spec):
    """A ``WeightFormat`` from its name (``"int8"``: int8 per output channel, symmetric)."""
    if isinstance(spec, WeightFormat):
        return spec
    if spec in FORMATS:
        return FORMATS[spec]
    raise ValueError(f"weights={spec!r}: the formats are {sorted(FORMATS)} (int8 per output channel, "
                     "symmetric); int4 in groups and asymmetric scales are not built yet")


@dataclass
class QuantizeReport:
    """What ``QuantizeWeights`` changed: one ``(K, N)`` per weight quantized, and the bytes of
    those weights before and after."""
    weights: list = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0


def _constant_weight(expr, lookup):
    """The (K, N) float32 numpy array ``expr`` holds (a float constant, or ``permute_dims`` of
    one, either maybe bound to a variable: ``lookup``), or None."""
    permuted, axes = False, None
    expr = _bound(expr, lookup)
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.permute_dims":
        permuted = True
        axes = [int(a) for a in expr.attrs.axes] if expr.attrs.axes is not None else None
        expr = _bound(expr.args[0], lookup)
    if not isinstance(expr, GenericConst) or str(expr.value.dtype) not in FLOATS or len(expr.value.shape) != 2:
        return None
    value = np.asarray(expr.value.numpy(), dtype=np.float32)
    return np.transpose(value, axes) if permuted else value


def _bound(expr, lookup):
    """The value a variable is bound to (``expr`` itself otherwise)."""
    value = lookup(expr) if isinstance(expr, relax.Var) else None
    return expr if value is None else value


@relax.expr_functor.mutator
class _Quantize(relax.PyExprMutator):
    def __init__(self, mod, fmt, report):
        super().__init__(mod)
        self.fmt, self.report = fmt, report

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op) or call.op.name != "relax.matmul":
            return call
        weight = _constant_weight(call.args[1], self.lookup_binding)
        if weight is None or min(weight.shape) < MIN_SIDE:
            return call
        q, scale = self.fmt.quantize(weight)
        out_dtype = str(call.ty.dtype)
        y = relax.op.matmul(call.args[0], relax.const(q), out_dtype="float32")
        y = relax.op.multiply(y, relax.const(scale))
        self.report.weights.append(tuple(weight.shape))
        self.report.bytes_before += weight.size * tvm.DataType(str(call.args[1].ty.dtype)).bits // 8
        self.report.bytes_after += q.nbytes + scale.nbytes
        return y if out_dtype == "float32" else relax.op.astype(y, out_dtype)


def quantize_weights(mod, spec="int8"):
    """``mod`` with its constant dense weights in ``spec``'s format; ``(mod, QuantizeReport)``."""
    fmt, report = weight_format(spec), QuantizeReport()
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            out[gv] = _Quantize(out, fmt, report).visit_expr(func)
    return out, report


def QuantizeWeights(spec="int8"):  # pylint: disable=invalid-name  (a pass, named as TVM's are)
    """The module pass of ``quantize_weights``."""
    @tvm.transform.module_pass(opt_level=0, name="scanweaver.QuantizeWeights")
    def _pass(mod, _ctx):
        return quantize_weights(mod, spec)[0]

    return _pass
