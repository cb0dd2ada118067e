"""The rewrite: one pass over each function that emits every accepted recurrence's plan
(``plan.py``) at its binding and remaps what it replaces; the dead per-step bindings are then
pruned (``prune.py``)."""
from tvm import relax

from .plan import plans_for
from .prune import prune_dead_bindings


@relax.expr_functor.mutator
class Rewriter(relax.PyExprMutator):
    """Visits the bindings in order; at a plan's binding, the plan emits its scan through
    ``builder_`` and calls ``replace`` for each value it supersedes."""

    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans              # binding var -> plan
        self.dropped = set()
        self.replaced = {}              # id(recurrence) -> [(old var, new expr)]
        self.pending = {}               # id(recurrence) -> what a later plan of it needs
        self._current = None

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is not None:
            self._current = self.replaced.setdefault(id(plan.rec), [])
            plan.emit(self, binding)
        if binding.var in self.dropped:
            return
        super().visit_var_binding_(binding)

    def replace(self, var, new):
        """``var`` is ``new`` from here on (its binding is dropped)."""
        if not isinstance(var, relax.DataflowVar) and self.builder_.current_block_is_dataflow():
            # an output of the dataflow block (ONNX returns the stacked readouts themselves):
            # its replacement is bound as one, or the return would read a var of the block
            new = self.builder_.emit_output(new)
        self.set_var_remap(var, new)
        self.dropped.add(var)
        self._current.append((var, new))


def rewrite(mod, recurrences):
    """Apply the accepted ``recurrences`` (found in ``mod``): ``(new module, replaced)``,
    ``replaced`` mapping ``id(rec)`` to the ``(old var, new expr)`` pairs it replaced."""
    by_function = {}
    for rec in recurrences:
        if not rec.rejected:
            by_function.setdefault(rec.function, []).append(rec)
    if not by_function:
        return mod, {}
    plans = {}
    for recs in by_function.values():
        for rec in recs:
            plans.update(plans_for(rec))
    rewriter = Rewriter(mod, plans)
    for name in by_function:
        gvar = mod.get_global_var(name)
        rewriter.builder_.update_func(gvar, rewriter.visit_expr(mod[gvar]))
    new = rewriter.builder_.get()
    for name in by_function:
        gvar = new.get_global_var(name)
        new[gvar] = prune_dead_bindings(new[gvar])
    return new, rewriter.replaced
