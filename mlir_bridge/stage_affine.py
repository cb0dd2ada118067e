"""Stage 2: normalized affine scan over (lane, t).  The axis is moved into strides, a's
broadcast becomes explicit zero strides, reverse and h0 are attributes/operands; the selective
form becomes ``discretize`` -> ``affine_scan`` over (batch, channel, state) lanes -> ``readout``."""
from dataclasses import dataclass

from . import emit
from .dialect import stage_module, verify
from .emit import MLIR_DTYPES, tensor_type
from .stage_scan import io_types, segments


@dataclass(frozen=True)
class Layout:
    """Lanes and element offsets: offset(lane, t) = sum_k idx_k(lane)*stride_k + t*tstride,
    a stride being (coefficient, power of L)."""

    lanes: int
    length: object          # int or None (symbolic L)
    reverse: bool
    dims: tuple             # ((extent, b_stride, a_stride), ...) of the non-axis dims
    b_tstride: tuple
    a_tstride: tuple


@dataclass(frozen=True)
class AffineStage:
    spec: object
    form: str
    layout: Layout
    text: str


def _strides(shape):
    out = []
    for k in range(len(shape)):
        coef, pow_l = 1, 0
        for d in shape[k + 1:]:
            coef, pow_l = (coef, pow_l + 1) if d is None else (coef * d, pow_l)
        out.append((coef, pow_l))
    return out


def layout_of(spec):
    if spec.__class__.__name__ == "SelectiveScanSpec":
        lanes = spec.batch * spec.dim * spec.dstate
        return Layout(lanes, spec.length, False, ((lanes, (spec.length, 0), (spec.length, 0)),), (1, 0), (1, 0))
    bs, as_ = _strides(spec.shape), _strides(spec.a_shape)
    dims = tuple((spec.shape[k], bs[k], as_[k] if spec.a_shape[k] != 1 else (0, 0))
                 for k in range(len(spec.shape)) if k != spec.axis)
    a_t = as_[spec.axis] if spec.a_shape[spec.axis] != 1 else (0, 0)
    return Layout(spec.lanes, spec.length, spec.reverse, dims, bs[spec.axis], a_t)


def _term(stride):
    coef, pow_l = stride
    return f"{coef}" + " * s0" * pow_l


def offset_map(layout, which):
    """affine_map<(lane, t)[L] -> (offset)> of b (``which=1``) or a (``which=2``)."""
    terms, inner = [], 1
    for extent, *strides in reversed(layout.dims):
        stride = strides[which - 1]
        if stride[0]:
            terms.append(f"((d0 floordiv {inner}) mod {extent}) * ({_term(stride)})")
        inner *= extent
    tstride = layout.b_tstride if which == 1 else layout.a_tstride
    if tstride[0]:
        terms.append(f"d1 * ({_term(tstride)})")
    return f"affine_map<(d0, d1)[s0] -> ({' + '.join(terms) or '0'})>"


def pair_type(layout):
    return tensor_type((layout.lanes, layout.length), "f32")


def emit_selective_ends(b, spec, args, pair_t, scan):
    """discretize -> scan(dA, dBu, h0) -> readout, shared by the selective stages 2-4."""
    names = ["u", "delta", "A", "B", "C"] + [n for n, f in (("D", spec.has_D), ("z", spec.has_z),
             ("delta_bias", spec.has_delta_bias), ("h0", spec.has_h0)) if f]
    x = dict(zip(names, args))
    da, dbu = b.op("scanweaver.discretize", [x["u"], x["delta"], x["A"], x["B"]] +
                   ([x["delta_bias"]] if spec.has_delta_bias else []), [pair_t, pair_t],
                   attrs={"softplus": emit.attr_bool(spec.delta_softplus), "groups": emit.attr_int(spec.groups)})
    states, last = scan(da, dbu, x.get("h0"))
    extras = [x[n] for n in ("D", "z") if n in x]
    out = b.op("scanweaver.readout", [states, x["C"], x["u"], *extras],
               [tensor_type((spec.batch, spec.dim, spec.length), MLIR_DTYPES[spec.dtype])],
               attrs={"groups": emit.attr_int(spec.groups),
                      "operandSegmentSizes": segments(1, 1, 1, spec.has_D, spec.has_z)})
    return [out] + ([last] if spec.return_last_state else [])


def lower(scan_stage):
    """ScanStage -> AffineStage (text verified)."""
    spec, form = scan_stage.spec, scan_stage.form
    layout = layout_of(spec)
    ins, outs = io_types(spec)
    b = emit.Builder()
    elem = MLIR_DTYPES[spec.dtype]

    def affine_scan(a, x, h0, states_t, last_t):
        return b.op("scanweaver.affine_scan", [a, x] + ([h0] if h0 is not None else []), [states_t, last_t],
                    attrs={"lanes": emit.attr_int(layout.lanes), "reverse": emit.attr_bool(layout.reverse),
                           "a_map": offset_map(layout, 2), "b_map": offset_map(layout, 1),
                           "element": elem if form == "affine" else "f32", "accumulate": "f32"})

    def body(args):
        if form == "affine":
            h0 = args[2] if spec.has_h0 else None
            states, last = affine_scan(args[0], args[1], h0, tensor_type(spec.shape, elem),
                                       tensor_type(spec.state_shape, elem))
            return [r for r, k in ((states, "states"), (last, "last")) if k in spec.outputs]
        pair_t = pair_type(layout)
        return emit_selective_ends(b, spec, args, pair_t, lambda da, dbu, h0: affine_scan(
            da, dbu, h0, pair_t, tensor_type((spec.batch, spec.dim, spec.dstate), MLIR_DTYPES[spec.dtype])))
    text = stage_module(b, [], ins, outs, body)
    return AffineStage(spec, form, layout, verify(text, "affine_scan stage"))
