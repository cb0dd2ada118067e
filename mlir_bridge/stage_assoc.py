"""Stage 3: the affine scan as an associative scan of pairs under
``(A2,U2) o (A1,U1) = (A2*A1, A2*U1 + U2)`` (``@scanweaver_combine``), then prefixes applied to h0."""
from dataclasses import dataclass

from scanweaver_core.algebra import IDENTITY

from . import emit
from .dialect import combine_func, stage_module, verify
from .emit import MLIR_DTYPES, tensor_type
from .stage_affine import emit_selective_ends, offset_map, pair_type
from .stage_scan import io_types


@dataclass(frozen=True)
class AssocStage:
    spec: object
    form: str
    layout: object
    identity: tuple
    text: str


def emit_stage(prev, name, scan_ops):
    """Shared by stages 3 and 4: the module around ``scan_ops(b, a, x, h0, states_t, last_t,
    element, maps)`` which returns (states, last)."""
    spec, form, layout = prev.spec, prev.form, prev.layout
    ins, outs = io_types(spec)
    b = emit.Builder()
    elem = MLIR_DTYPES[spec.dtype] if form == "affine" else "f32"
    maps = (offset_map(layout, 2), offset_map(layout, 1))

    def body(args):
        if form == "affine":
            states, last = scan_ops(b, args[0], args[1], args[2] if spec.has_h0 else None,
                                    tensor_type(spec.shape, elem), tensor_type(spec.state_shape, elem), elem, maps)
            return [r for r, k in ((states, "states"), (last, "last")) if k in spec.outputs]
        pair_t = pair_type(layout)
        return emit_selective_ends(b, spec, args, pair_t, lambda da, dbu, h0: scan_ops(
            b, da, dbu, h0, pair_t, tensor_type((spec.batch, spec.dim, spec.dstate), MLIR_DTYPES[spec.dtype]), "f32", maps))
    return verify(stage_module(b, [combine_func(b)], ins, outs, body), name)


def lower(affine_stage):
    """AffineStage -> AssocStage (text verified)."""
    layout = affine_stage.layout

    def scan_ops(b, a, x, h0, states_t, last_t, elem, maps):
        pair_t = pair_type(layout)
        pa, pu = b.op("scanweaver.assoc_scan", [a, x], [pair_t, pair_t], attrs={
            "combine": emit.attr_sym("scanweaver_combine"),
            "identity": emit.attr_array([emit.attr_float(v) for v in IDENTITY]),
            "reverse": emit.attr_bool(layout.reverse), "a_map": maps[0], "b_map": maps[1]})
        return b.op("scanweaver.apply_prefix", [pa, pu] + ([h0] if h0 is not None else []),
                    [states_t, last_t], attrs={"states_map": maps[1], "element": elem})
    text = emit_stage(affine_stage, "assoc_scan stage", scan_ops)
    return AssocStage(affine_stage.spec, affine_stage.form, layout, IDENTITY, text)
