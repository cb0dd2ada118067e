"""The stabilized form as a pass of its own (``fuse_stabilized``, ``FuseStabilizedScans``): each
loop found rewritten into one scan and validated alone; ``FuseAffineRecurrences`` runs the
form with the others instead."""
from tvm import relax

from ...prune import prune_dead_bindings
from .stabilized import NotStabilized, _users, emit_stabilized, find_stabilized


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans            # emit_at var -> StabilizedMatch
        self.replaced = []

    def visit_var_binding_(self, binding):
        match = self.plans.get(binding.var)
        if match is not None:
            for old, new in emit_stabilized(self.builder_, match, self.visit_expr):
                if not isinstance(old, relax.DataflowVar) and self.builder_.current_block_is_dataflow():
                    new = self.builder_.emit_output(new)
                self.set_var_remap(old, new)
                self.replaced.append((old, new))
            return
        super().visit_var_binding_(binding)


def fuse_stabilized(mod):
    """``(new module, [(function name, var, match or reason, validated seconds)])``: every
    stabilized loop of ``mod``'s Relax functions rewritten into one scan and validated
    (``validate.py``); one that fails validation is left as it was, with the reason."""
    import tvm  # pylint: disable=import-outside-toplevel

    from ...validate import validate  # pylint: disable=import-outside-toplevel

    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)   # the caller's stays as it is
    report = []
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for var, match in find_stabilized(func, value, _users(func)):
            if isinstance(match, str):
                report.append((gvar.name_hint, var, match, None))
                continue
            rewriter = _Rewriter(mod, {match.emit_at: match})
            try:
                new_func = prune_dead_bindings(rewriter.visit_expr(mod[gvar]))
            except (NotStabilized, ValueError, TypeError, RuntimeError) as err:
                report.append((gvar.name_hint, var, f"could not be emitted: {err}", None))
                continue
            ok, why, seconds = validate(mod[gvar], new_func, rewriter.replaced)
            if not ok:
                report.append((gvar.name_hint, var, f"validation failed: {why}", seconds))
                continue
            mod[gvar] = new_func
            func = new_func
            report.append((gvar.name_hint, var, match, seconds))
    return mod, report


def FuseStabilizedScans():  # noqa: N802 (TVM pass naming)
    """The module pass of ``fuse_stabilized`` (until ``FuseAffineRecurrences`` calls it)."""
    import tvm  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.FuseStabilizedScans")
    def _pass(mod, _ctx):
        return fuse_stabilized(mod)[0]

    return _pass
