"""How a ScanWeaver scan appears in Relax between FuseAffineRecurrences and LowerScans.

One ``R.call_pure_packed("scanweaver.affine_scan" | "scanweaver.selective_scan", *operands,
R.str(<spec as JSON>))``: readable in ``mod.script()`` (the spec travels with the call, next
to its operands), pure (so dataflow and dead-code elimination treat it as an ordinary op),
and replaced by ``call_tir`` when lowered.
"""
import dataclasses
import json

import tvm
from tvm import relax

from scanweaver_tvm.spec import AffineScanSpec, SelectiveScanSpec

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
