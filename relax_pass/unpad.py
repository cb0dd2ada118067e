"""Drop the padding a chunked form leaves once its region is a scan.

HF's Mamba-2 pads the sequence to a multiple of its chunk length, computes ``y + D * pad(x)``
at the padded length and slices ``[:, :L]`` at the end.  With the region replaced by a scan
(which emits ``pad(o)`` to keep the region's type), only that arithmetic still runs at the
padded length, and the pad widths (``chunk - L % chunk``) keep the module from generalizing
over L.  ``x[:n]`` along an axis of an elementwise op is the op of its operands' ``[:n]``, and
``pad(a)[:n]`` is ``a`` when only the end was padded and ``a`` has ``n`` rows: the slice is
pushed down to the pads, which then go unused; a pad of width 0 is its input.  Exact algebra,
no probe needed.
"""
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name, tensor_shape

from .interpret import slice_span
from .steps import ELEMENTWISE

_DEPTH = 8      # ops between the slice and the pads


def _prefix_slice(value):
    """``(x, axis, n)`` when ``value`` is ``x[..., :n, ...]`` along one axis, ``n`` short of
    its extent, else None."""
    if op_name(value) != "relax.strided_slice" or not isinstance(value.args[0], relax.Var):
        return None
    span = slice_span(value)
    if span is None or span[1] != 0 or span[2] >= tensor_shape(value.args[0])[span[0]]:
        return None
    return value.args[0], span[0], span[2]


def _end_pad_source(value, axis, n):
    """``a`` when ``value`` is ``pad(a)`` padded only at the end of ``axis`` and ``a`` has ``n``
    rows there."""
    if op_name(value) != "relax.nn.pad" or str(value.attrs.pad_mode) != "constant":
        return None
    width = [int(w) for w in value.attrs.pad_width]
    a = value.args[0]
    shape = tensor_shape(a)
    if shape is None or shape[axis] != n or any(w for d, w in enumerate(width) if d != 2 * axis + 1):
        return None
    return a


def _no_op_pad(value):
    return (op_name(value) == "relax.nn.pad" and str(value.attrs.pad_mode) == "constant"
            and not any(int(w) for w in value.attrs.pad_width))


def plan_cut(value_of, x, axis, n, depth=_DEPTH):
    """A tree equal to ``x[:n]`` along ``axis`` built below the pads it reaches: ``("pad", a)``,
    ``("op", call, [arg plans])`` or ``("keep", e)`` (an operand broadcast along the axis) or
    ``("slice", e)``; None when no pad is reached."""
    value = value_of.get(x) if isinstance(x, relax.Var) else None
    if value is None or depth == 0:
        return None
    a = _end_pad_source(value, axis, n)
    if a is not None:
        return ("pad", a)
    if op_name(value) not in ELEMENTWISE or op_name(value) == "relax.where":
        return None
    rank = len(tensor_shape(x))
    parts, reached = [], False
    for arg in value.args:
        shape = tensor_shape(arg)
        if shape is None:
            return None
        d = axis - (rank - len(shape))               # the axis in the operand (broadcast right-aligned)
        if d < 0 or shape[d] == 1:
            parts.append(("keep", arg))
            continue
        sub = plan_cut(value_of, arg, d, n, depth - 1)
        reached |= sub is not None
        parts.append(sub if sub is not None else ("slice", arg, d))
    return ("op", value, parts) if reached else None


def _build(bb, plan, n, visit):
    """The expression of ``plan`` (its operands bound, itself not)."""
    kind = plan[0]
    if kind in ("pad", "keep"):
        return visit(plan[1])
    if kind == "slice":
        return relax.op.strided_slice(visit(plan[1]), [plan[2]], [0], [n])
    args = [_build(bb, p, n, visit) for p in plan[2]]
    return relax.Call(plan[1].op, [a if isinstance(a, relax.Var) or not isinstance(a, relax.Call)
                                   else bb.emit(a) for a in args], plan[1].attrs)


@relax.expr_functor.mutator
class _Unpadder(relax.PyExprMutator):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans           # slice var -> (plan, n)

    def visit_var_binding_(self, binding):
        got = self.plans.get(binding.var)
        if got is None:
            super().visit_var_binding_(binding)
            return
        plan, n = got
        new = _build(self.builder_, plan, n, self.visit_expr)
        if not isinstance(binding.var, relax.DataflowVar) and self.builder_.current_block_is_dataflow():
            new = self.builder_.emit_output(new)
        elif isinstance(new, relax.Call):
            new = self.builder_.emit(new)
        self.set_var_remap(binding.var, new)


def unpad(mod, prune):
    """``mod`` with every prefix slice of padded elementwise arithmetic computed unpadded and
    every zero-width pad replaced by its input; ``prune(func)`` drops what is left unused."""
    changed = False
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value_of = VarMap((b.var, b.value) for blk in func.body.blocks for b in blk.bindings)
        plans = VarMap()
        for v, val in value_of.items():
            cut = _prefix_slice(val)
            if cut is not None:
                plan = plan_cut(value_of, *cut)
                if plan is not None:
                    plans[v] = (plan, cut[2])
            elif _no_op_pad(val):         # HF pads by 0 when L fills its chunks: a copy
                plans[v] = (("keep", val.args[0]), None)
        if not plans:
            continue
        rewriter = _Unpadder(mod, plans)
        new_func = rewriter.visit_expr(func)
        mod = mod.clone() if not changed else mod
        mod[gvar] = prune(new_func)
        changed = True
    return mod
