"""Stage 1: a spec as one ``scanweaver.scan`` / ``scanweaver.selective_scan`` op, its step
function spelled out as ``@scanweaver_step``."""
from dataclasses import dataclass

from scanweaver_core.spec import AffineScanSpec

from . import emit
from .dialect import scalar_func, stage_module, verify
from .emit import MLIR_DTYPES, tensor_type
from .operands import operands


@dataclass(frozen=True)
class ScanStage:
    spec: object
    form: str
    text: str


def segments(*sizes):
    return emit.attr_dense([int(s) for s in sizes], "i32")


def _step(b, form):
    if form == "affine":       # h' = a*h + b
        return scalar_func(b, "scanweaver_step", ["h", "a", "b"], 1,
                           lambda x: [b.add(b.mul(x["a"], x["h"]), x["b"])])
    # selective, per state n: h' = exp(delta*A)*h + delta*B*u (y = sum_n C*h is the readout)
    return scalar_func(b, "scanweaver_step", ["h", "u", "delta", "A", "B"], 1, lambda x: [
        b.add(b.mul(b.math("exp", b.mul(x["delta"], x["A"])), x["h"]),
              b.mul(b.mul(x["delta"], x["B"]), x["u"]))])


def io_types(spec):
    ops = operands(spec)
    ins = [tensor_type(s, MLIR_DTYPES[d]) for _, s, d, out in ops if not out]
    outs = [tensor_type(s, MLIR_DTYPES[d]) for _, s, d, out in ops if out]
    return ins, outs


def lower(spec):
    """spec -> ScanStage (text verified)."""
    form = "affine" if isinstance(spec, AffineScanSpec) else "selective"
    ins, outs = io_types(spec)
    b = emit.Builder()
    if form == "affine":
        name = "scanweaver.scan"
        attrs = {"step": emit.attr_sym("scanweaver_step"), "axis": emit.attr_int(spec.axis),
                 "reverse": emit.attr_bool(spec.reverse),
                 "resultSegmentSizes": segments("states" in spec.outputs, "last" in spec.outputs)}
    else:
        name = "scanweaver.selective_scan"
        attrs = {"step": emit.attr_sym("scanweaver_step"),
                 "delta_softplus": emit.attr_bool(spec.delta_softplus), "groups": emit.attr_int(spec.groups),
                 "operandSegmentSizes": segments(1, 1, 1, 1, 1, spec.has_D, spec.has_z,
                                                 spec.has_delta_bias, spec.has_h0),
                 "resultSegmentSizes": segments(1, spec.return_last_state)}

    def body(args):
        res = b.op(name, args, outs, attrs=attrs)
        return res if isinstance(res, list) else [res]
    text = stage_module(b, [_step(b, form)], ins, outs, body)
    return ScanStage(spec, form, verify(text, f"{name} stage"))
