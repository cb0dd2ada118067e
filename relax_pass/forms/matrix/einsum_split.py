"""Readout einsums of three or more operands split in two, so a matrix state's readout shows:
ONNX keeps ``einsum("nhd,nhdm,nh->nhm", q, S, 1 / z)`` one op, which is ``q^T S`` and the rest
(``matrix.readout_einsum_split`` reads which operands)."""
from tvm import relax

from .matrix import readout_einsum_split


def readout_splits(found):
    """``{einsum var: split plan}`` for the readout einsums of the affine chains in ``found``
    whose state is a matrix."""
    splits = {}
    for rec in found:
        if rec.rejected or rec.form != "affine" or len(rec.state_shape) < 2 or rec.facts is None:
            continue
        users, value = rec.facts
        for state in rec.states:
            for u in users.get(state, []):
                plan = readout_einsum_split(value.get(u), state) if isinstance(u, relax.Var) else None
                if plan is not None:
                    splits[u] = plan
    return splits


@relax.expr_functor.mutator
class _EinsumSplitter(relax.PyExprMutator):
    def __init__(self, mod, splits):
        super().__init__(mod)
        self.splits = splits
        self.inner = []

    def visit_var_binding_(self, binding):
        plan = self.splits.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        i, j, inner_subs, rest, outer_subs = plan
        bb = self.builder_
        ops = [self.visit_expr(f) for f in binding.value.args[0].fields]
        inner = bb.emit(relax.op.einsum([ops[i], ops[j]], inner_subs))
        self.inner.append(inner)
        value = relax.op.einsum([inner] + [ops[r] for r in rest], outer_subs)
        if not isinstance(binding.var, relax.DataflowVar) and bb.current_block_is_dataflow():
            self.set_var_remap(binding.var, bb.emit_output(value))
        else:
            self.set_var_remap(binding.var, bb.emit(value))


def split_einsums(mod, splits):
    """``mod`` with each einsum binding of ``splits`` (var -> ``readout_einsum_split``) made
    two einsums; also the inner ones' vars."""
    splitter = _EinsumSplitter(mod, splits)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            splitter.builder_.update_func(gvar, splitter.visit_expr(func))
    return splitter.builder_.get(), splitter.inner
