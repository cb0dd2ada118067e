"""How a ScanWeaver scan appears in Relax between FuseAffineRecurrences and LowerScans.

One ``R.call_pure_packed("scanweaver.affine_scan" | "scanweaver.selective_scan" |
"scanweaver.matrix_scan" | "scanweaver.stabilized_scan" | "scanweaver.mlstm_scan", *operands,
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
from .spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec, StabilizedScanSpec,
                   is_symbolic, symbol_identifiers, symbol_name)

CALLEES = {"scanweaver.affine_scan": AffineScanSpec, "scanweaver.selective_scan": SelectiveScanSpec,
           "scanweaver.matrix_scan": MatrixScanSpec, "scanweaver.stabilized_scan": StabilizedScanSpec,
           "scanweaver.mlstm_scan": MLSTMScanSpec, "scanweaver.delta_scan": DeltaScanSpec}
_CALLEE_OF = {kind: name for name, kind in CALLEES.items()}
_CALL_PURE_PACKED = tvm.ir.Op.get("relax.call_pure_packed")


def spec_to_json(spec):
    """The spec's fields as JSON (symbolic extents stay names, None stays null)."""
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def spec_from_json(kind, text):
    """Inverse of ``spec_to_json`` (lists back to tuples through the constructor)."""
    fields = json.loads(text)
    if kind is AffineScanSpec:
        return AffineScanSpec.create(fields["shape"], fields["a_shape"], fields["axis"], fields["reverse"],
                                     fields["has_h0"], fields["dtype"], tuple(fields["outputs"]))
    if kind is MatrixScanSpec:
        return MatrixScanSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    if kind in (StabilizedScanSpec, MLSTMScanSpec, DeltaScanSpec):
        return kind(**fields)
    return SelectiveScanSpec(**fields)


def output_types(spec):
    """Relax types of the scan's outputs, in the PrimFunc's output order.  A symbolic extent is
    a fresh int64 ``tirx.Var`` (one per distinct name in this call): standalone types; a call
    inside a function with symbolic shapes takes its operands' vars instead (``make_scan``)."""
    syms = {name: tvm.tirx.Var(ident, "int64") for name, ident in symbol_identifiers(spec).items()}
    return _types(spec, lambda d: syms[symbol_name(d)] if is_symbolic(d) else d)


def _types(spec, dim):
    if isinstance(spec, AffineScanSpec):
        shapes = {"states": spec.shape, "last": spec.state_shape}
        return [relax.TensorType([dim(d) for d in shapes[k]], spec.dtype) for k in spec.outputs]
    if isinstance(spec, (StabilizedScanSpec, MLSTMScanSpec, DeltaScanSpec)):
        dtypes = spec.buffer_dtypes()
        return [relax.TensorType([dim(d) for d in shape], dtypes[n]) for n, shape in spec.output_shapes().items()]
    if isinstance(spec, MatrixScanSpec):
        shapes = [spec.out_shape] + ([spec.state_shape] if spec.return_last_state else [])
        return [relax.TensorType([dim(d) for d in shape], spec.dtype) for shape in shapes]
    bdl, bdn = (spec.batch, spec.dim, spec.length), (spec.batch, spec.dim, spec.dstate)
    out = [relax.TensorType([dim(d) for d in bdl], spec.dtype)]
    if spec.return_last_state:
        out.append(relax.TensorType([dim(d) for d in bdn], spec.dtype))
    return out


def _operand_dims(spec, operands):
    """Name -> the operands' own PrimExpr for each symbolic extent (b's or u's shape; for a
    matrix scan, any operand's that has it), or None when that shape is not known."""
    if isinstance(spec, MatrixScanSpec):    # every operand's buffer shape names its extents
        dims = {}
        for operand, shape in zip(operands, spec.operand_shapes().values()):
            for name, value in (_dims_of(spec, operand, shape) or {}).items():
                dims.setdefault(name, value)
        return dims if set(dims) >= set(symbol_identifiers(spec)) else None
    if isinstance(spec, StabilizedScanSpec):     # k's shape names them
        return _dims_of(spec, operands[0], spec.seq_shape)
    if isinstance(spec, (MLSTMScanSpec, DeltaScanSpec)):     # v's shape names them
        return _dims_of(spec, operands[2], spec.buffer_shapes()["v"])
    source = operands[1] if isinstance(spec, AffineScanSpec) else operands[0]
    extents = spec.shape if isinstance(spec, AffineScanSpec) else (spec.batch, spec.dim, spec.length)
    return _dims_of(spec, source, extents)


def _dims_of(spec, source, extents):
    shape = getattr(getattr(source, "ty", None), "shape", None)
    values = getattr(shape, "values", None)
    if values is None or len(values) < len(extents):
        return None
    return {symbol_name(d): v for d, v in zip(extents, values) if d is not None and is_symbolic(d)}


def make_scan(spec, operands, ty=None):
    """The Relax call of a scan on ``operands`` (the PrimFunc's inputs, in order, with the
    spec's shapes: ``a`` already at b's rank, ``spec.a_shape``).

    The call's type is ``ty`` when given; else, for a symbolic spec, the outputs' symbolic
    extents are the operands' own (from b's shape, or u's for a selective scan), so the
    function's shape vars (``R.Tensor(("batch", "L", 4))``) flow into the result and on into
    ``call_tir``; fresh vars (``output_types``) only when those shapes are unknown."""
    callee = _CALLEE_OF[type(spec)]
    if ty is None:
        dims = _operand_dims(spec, operands) if spec.is_symbolic else None
        types = output_types(spec) if dims is None else _types(
            spec, lambda d: dims[symbol_name(d)] if is_symbolic(d) else d)
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


def emit_stabilized_scan(emit, k, v=None, w=None, u=None, h0=None, reverse=False,
                         return_last_state=False, layout="time_major"):
    """Emit the stabilized scan (``StabilizedScanSpec``) on 3-d ``k`` (and ``v``, ``w`` per
    channel (C,) or per step, ``u`` (C,), ``h0`` a list of (B, C) state parts), each with the
    shape and dtype the spec wants.  Returns ``out``, or ``[out, *last state parts]`` with
    ``return_last_state``.  A shape or dtype the kernel cannot take raises ``ValueError``."""
    def fake(x):
        shape = _static_shape(x)
        return np.empty(shape, dtype=_np_dtype(tensor_dtype(x)))

    arrays = [None if x is None else fake(x) for x in (k, v, w, u)]
    spec = StabilizedScanSpec.for_arrays(*arrays, h0=None if h0 is None else [fake(x) for x in h0],
                                         reverse=reverse, return_last_state=return_last_state,
                                         layout=layout, check_dtypes=False)
    spec = StabilizedScanSpec(**{**dataclasses.asdict(spec), "dtype": tensor_dtype(k)})
    given = [x for x in (k, v, w, u) if x is not None] + list(h0 or ())
    for name, x in zip(spec.operand_names(), given):
        want = spec.operand_dtypes()[name]
        if tensor_dtype(x) != want:
            raise ValueError(f"{name}: dtype {tensor_dtype(x)} is not {want}")
    scan = emit(make_scan(spec, given))
    if not return_last_state:
        return scan
    return [emit(relax.TupleGetItem(scan, i)) for i in range(len(spec.output_names()))]


def emit_spec_scan(emit, spec, operands):
    """Emit the scan of ``spec`` (``MLSTMScanSpec``, ``DeltaScanSpec``: a spec that names its
    operands) on ``operands`` (its inputs in order, with the shapes and dtypes it says).
    Returns the output, or ``[output, *last state parts]`` with ``return_last_state``.  A
    shape or dtype it cannot take raises ``ValueError`` naming the operand."""
    shapes, dtypes = spec.operand_shapes(), spec.operand_dtypes()
    for (name, shape), x in zip(shapes.items(), operands):
        got = tensor_shape(x)
        if got is not None and tuple(got) != tuple(shape) and not spec.is_symbolic:
            raise ValueError(f"{name}: shape {tuple(got)} is not {tuple(shape)}")
        if tensor_dtype(x) != dtypes[name]:
            raise ValueError(f"{name}: dtype {tensor_dtype(x)} is not {dtypes[name]}")
    scan = emit(make_scan(spec, list(operands)))
    if not spec.return_last_state:
        return scan
    return [emit(relax.TupleGetItem(scan, i)) for i in range(len(spec.output_names()))]


def _np_dtype(dtype):
    """A numpy stand-in dtype for shape checks (numpy has no bfloat16)."""
    return np.float32 if dtype in ("bfloat16", "") else np.dtype(dtype)
