"""How a ScanWeaver scan appears in Relax between FuseAffineRecurrences and LowerScans.

One ``R.call_pure_packed("scanweaver.affine_scan" | "scanweaver.selective_scan", *operands,
R.str(<spec as JSON>))``: readable in ``mod.script()`` (the spec travels with the call, next
to its operands), pure (so dataflow and dead-code elimination treat it as an ordinary op),
and replaced by ``call_tir`` when lowered.
"""
import dataclasses
import json

import numpy as np
import tvm
from tvm import relax

from .exprs import tensor_dtype, tensor_shape
from .spec import AffineScanSpec, SelectiveScanSpec

CALLEES = {"scanweaver.affine_scan": AffineScanSpec, "scanweaver.selective_scan": SelectiveScanSpec}
_CALL_PURE_PACKED = tvm.ir.Op.get("relax.call_pure_packed")


def spec_to_json(spec):
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def spec_from_json(kind, text):
    fields = json.loads(text)
    if kind is AffineScanSpec:
        return AffineScanSpec.create(fields["shape"], fields["a_shape"], fields["axis"], fields["reverse"],
                                     fields["has_h0"], fields["dtype"], tuple(fields["outputs"]))
    return SelectiveScanSpec(**fields)


def output_types(spec):
    """Relax types of the scan's outputs, in the PrimFunc's output order."""
    if isinstance(spec, AffineScanSpec):
        shapes = {"states": spec.shape, "last": spec.state_shape}
        return [relax.TensorType(shapes[k], spec.dtype) for k in spec.outputs]
    out = [relax.TensorType((spec.batch, spec.dim, spec.length), spec.dtype)]
    if spec.return_last_state:
        out.append(relax.TensorType((spec.batch, spec.dim, spec.dstate), spec.dtype))
    return out


def make_scan(spec, operands):
    """The Relax call of a scan on ``operands`` (the PrimFunc's inputs, in order, with the
    spec's shapes: ``a`` already at b's rank, ``spec.a_shape``)."""
    callee = "scanweaver.affine_scan" if isinstance(spec, AffineScanSpec) else "scanweaver.selective_scan"
    types = output_types(spec)
    ty = types[0] if len(types) == 1 else relax.TupleType(types)
    return relax.op.call_pure_packed(callee, *operands, tvm.ir.StringImm(spec_to_json(spec)), ty_args=ty)


def parse_scan(expr):
    """``(spec, operands)`` when ``expr`` is a scan call, else None."""
    if not isinstance(expr, relax.Call) or not expr.op.same_as(_CALL_PURE_PACKED):
        return None
    callee = expr.args[0]
    kind = CALLEES.get(getattr(callee, "global_symbol", None))
    if kind is None:
        return None
    *operands, spec_text = expr.args[1:]
    return spec_from_json(kind, spec_text.value), list(operands)


def emit_affine_scan(emit, a, b, h0, state_shape, length, axis, reverse, outputs):
    """The one spec builder: emit the scan ``h = a*h + b`` over whole-sequence coefficients
    ``a`` (None: 1) and ``b``, time on ``axis`` of ``state_shape`` with ``length`` inserted there,
    each broadcastable to that shape; ``h0`` None starts from zeros.  Returns ``{kind: expr}``
    for the ``outputs`` asked (``"states"``, ``"last"``).  A shape or dtype the kernel cannot
    take raises ``ValueError`` naming the operand."""
    state_shape, dtype = tuple(state_shape), tensor_dtype(b)
    full = state_shape[:axis] + (length,) + state_shape[axis:]
    if a is None:
        a = relax.const(np.ones((1,) * len(full), dtype=dtype), dtype)
    for name, x in (("a", a), ("h0", h0)):
        if x is not None and tensor_dtype(x) not in ("", dtype):
            raise ValueError(f"{name} is {tensor_dtype(x)}, b is {dtype}")
    if _static_shape(b) != full:
        b = emit(relax.op.broadcast_to(b, full))
    outputs = tuple(k for k in ("states", "last") if k in outputs)
    spec = AffineScanSpec.create(full, _static_shape(a), axis, reverse, h0 is not None, dtype, outputs)
    if _static_shape(a) != spec.a_shape:         # the kernel takes a at b's rank
        a = emit(relax.op.reshape(a, spec.a_shape))
    scan = emit(make_scan(spec, [a, b] + ([h0] if h0 is not None else [])))
    if len(outputs) == 1:
        return {outputs[0]: scan}
    return {k: emit(relax.TupleGetItem(scan, i)) for i, k in enumerate(outputs)}


def _static_shape(x):
    shape = tensor_shape(x)
    if shape is None:
        raise ValueError(f"needs a static shape, got {getattr(x, 'ty', x)}")
    return shape
