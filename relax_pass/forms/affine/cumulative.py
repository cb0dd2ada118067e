"""``cumsum`` / ``cumprod`` as affine scans (``FuseAffineRecurrences(cumulative=True)``).

``cumsum`` is the scan with ``a = 1, b = x``; ``cumprod`` the one with ``a = x, b = 0`` from
``h0 = 1``.  TVM already lowers both (``DispatchSortScan``); routing them through ScanWeaver
gives one scan implementation, schedule and tuning for every recurrence in a model.  Only the
inclusive form with an unchanged dtype and static shapes is rewritten.
"""
import numpy as np
from tvm import relax

from scanweaver_core.scan_op import emit_affine_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from ...chains import Recurrence
from ...steps import op_name, tensor_dtype, tensor_shape

KINDS = {"relax.cumsum": "cumsum", "relax.cumprod": "cumprod"}


def cumulative_recurrences(function_name, bindings):
    """A ``Recurrence`` for each rewritable cumsum/cumprod binding (rejected ones say why)."""
    found = []
    for b in bindings:
        kind = KINDS.get(op_name(b.value))
        if kind is None:
            continue
        x, attrs = b.value.args[0], b.value.attrs
        shape, dtype = tensor_shape(x), tensor_dtype(x)
        axis = None if attrs.axis is None else int(attrs.axis)
        reason = ""
        if shape is None:
            reason = "symbolic shape"
        elif axis is None:
            reason = "no axis (flattened scan)"
        elif bool(attrs.exclusive):
            reason = "exclusive scan"
        elif dtype not in SUPPORTED_DTYPES or (attrs.dtype is not None and str(attrs.dtype) not in ("", dtype)):
            reason = f"dtype {dtype} (or a dtype change)"
        axis = -1 if axis is None or shape is None else axis % len(shape)
        state = () if shape is None else shape[:axis] + shape[axis + 1:]
        rec = Recurrence(function_name, kind, -1 if shape is None else shape[axis], axis, False, state, dtype,
                         (b.var.name,), rejected=bool(reason), reason=reason)
        rec.states = [b.var]
        found.append(rec)
    return found


def cumulative_scan(rec, x, emit):
    """The scan replacing ``cumsum(x)`` / ``cumprod(x)`` (``x`` already visited): its states."""
    shape, length = tensor_shape(x), rec.length
    if rec.form == "cumsum":
        outs = emit_affine_scan(emit, None, x, None, rec.state_shape, length, rec.axis, False, ("states",))
    else:
        zeros = relax.const(np.zeros((1,) * len(shape), dtype=rec.dtype), rec.dtype)
        h0 = emit(relax.op.ones(rec.state_shape, rec.dtype))
        outs = emit_affine_scan(emit, x, zeros, h0, rec.state_shape, length, rec.axis, False, ("states",))
    return outs["states"]
