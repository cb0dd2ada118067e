"""States a step updates in place: a function that returns new values of some of its
parameters (a decode step's recurrent states) has the kernel that computes each one write it
into the parameter's own buffer, not into a fresh tensor.

A function asks for it with the attribute ``IN_PLACE_ATTR``: pairs (index in the returned
tuple, parameter index).  ``InPlaceStates`` runs after TVM's dataflow lowering (each kernel
called in destination-passing style on a tensor from ``alloc_tensor``), before memory
planning.  For each pair it follows the returned value back (through aliases, reshapes and
tuple items) to the ``alloc_tensor`` a kernel writes it into, and, where it is safe, passes
the parameter to that kernel instead (the allocation goes away; where the kernel writes
another shape of the same elements, RecurrentGemma's (B, 1, W) for its (B, W) state, a
reshaped view of the parameter takes its place):

- nothing after the kernel reads the parameter (or a view of it), and no other returned value
  is one;
- the kernel does not read the parameter (the conv window: shifted from a concat made
  earlier), or reads it only where it writes the output: one block writes the output, with
  data-parallel iterators only (no init, no reduction), and every read of the parameter is in
  that block at exactly the element written (``h' = a * h + b``; in row-major order where
  the shapes differ).

Anything else is left as it is (a fresh tensor, as before): never a different result.  The
functions made in place are listed in the attribute ``REPORT_ATTR`` (``in_place_report``).
"""
import tvm
import tvm_ffi
from tvm import relax, tirx

__all__ = ["IN_PLACE_ATTR", "REPORT_ATTR", "InPlaceStates", "in_place_report"]

IN_PLACE_ATTR = "scanweaver.in_place_states"
REPORT_ATTR = "scanweaver.in_place_done"


@tvm.transform.module_pass(opt_level=0, name="scanweaver.InPlaceStates")
def InPlaceStates(mod, _ctx):  # noqa: N802 (a pass, named as TVM names its passes)
    """The pass (see the module docstring)."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function) and func.attrs and IN_PLACE_ATTR in func.attrs:
            done = []
            for out_index, param_index in func.attrs[IN_PLACE_ATTR]:
                func, ok = _one(mod, func, int(out_index), int(param_index))
                done += [int(param_index)] if ok else []
            mod[gv] = func.with_attr(REPORT_ATTR, done)
    return mod


def in_place_report(func):
    """The parameter indices ``InPlaceStates`` updates in place in ``func`` (after the pass)."""
    return [int(i) for i in func.attrs[REPORT_ATTR]] if func.attrs and REPORT_ATTR in func.attrs else []


def _is_op(value, name):
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == name


def _refs(expr):
    """The variables ``expr`` reads."""
    found = []
    relax.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relax.Var) else None)
    return found


class _Bindings:
    """A lowered function's bindings in order, and what a variable is a view of."""

    def __init__(self, func):
        self.list = [b for block in func.body.blocks for b in block.bindings]
        self.value = {b.var: b.value for b in self.list}
        self.position = {b.var: i for i, b in enumerate(self.list)}

    def root(self, var):
        """The tensor ``var`` is (through aliases, reshapes and items of tuples of tensors)."""
        while isinstance(var, relax.Var) and var in self.value:
            value = self.value[var]
            if isinstance(value, relax.Var):
                var = value
            elif _is_op(value, "relax.reshape"):
                var = value.args[0]
            elif isinstance(value, relax.TupleGetItem) and isinstance(self.value.get(value.tuple_value), relax.Tuple):
                var = self.value[value.tuple_value].fields[value.index]
            else:
                break
        return var


def _one(mod, func, out_index, param_index):
    """``(func, done)``: one state made in place, where it is safe."""
    bind = _Bindings(func)
    ret = func.body.body
    fields = bind.value.get(ret, ret) if isinstance(ret, relax.Var) else ret
    if not isinstance(fields, relax.Tuple) or out_index >= len(fields.fields):
        return func, False
    param = func.params[param_index]
    target = bind.root(fields.fields[out_index])
    if target.same_as(param) or not _is_op(bind.value.get(target), "relax.builtin.alloc_tensor") or \
            not _same_elements(target.ty, param.ty):
        return func, False
    writers = [b for b in bind.list if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.GlobalVar)
               and any(a.same_as(target) for a in b.value.args)]
    if not writers or not isinstance(mod[writers[0].value.op], tirx.PrimFunc):
        return func, False
    call = writers[0].value
    views = [v for v in [param] + [b.var for b in bind.list] if bind.root(v).same_as(param)]
    later = bind.list[bind.position[writers[0].var] + 1:]
    others = [f for i, f in enumerate(fields.fields) if i != out_index]
    if any(any(r in views for r in _refs(b.value)) for b in later if not b.var.same_as(ret)) or \
            any(bind.root(f).same_as(param) for f in others):
        return func, False
    args = list(call.args)
    reads = [i for i, a in enumerate(args) if a in views]
    out = [i for i, a in enumerate(args) if a.same_as(target)]
    kernel = mod[call.op]
    if len(out) != 1 or (reads and (len(reads) != 1 or not args[reads[0]].same_as(param) or
                                    not _pointwise(kernel, kernel.params[reads[0]], kernel.params[out[0]]))):
        return func, False
    return _Swap(target, param, view=not tvm_ffi.structural_equal(target.ty, param.ty)).visit_expr(func), True


def _same_elements(a, b):
    """Both tensor types of one dtype and static shapes of the same number of elements."""
    def count(ty):
        if not isinstance(ty, relax.TensorType) or ty.shape is None or \
                not all(isinstance(d, tirx.IntImm) for d in ty.shape.values):
            return None
        n = 1
        for d in ty.shape.values:
            n *= int(d)
        return n
    return a.dtype == b.dtype and count(a) is not None and count(a) == count(b)


def _flat(region, shape):
    """The row-major offset of a one-element ``region`` of a buffer of ``shape`` (else None)."""
    if any(not (isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1) for r in region):
        return None
    offset = tirx.const(0, "int64")
    for r, d in zip(region, shape):
        offset = offset * tirx.Cast("int64", d) + tirx.Cast("int64", r.min)
    return offset


def _pointwise(kernel, state, out):
    """Whether ``kernel`` reads ``state`` only at the element it writes to ``out``, in the one
    block that writes ``out``, a block without init or reduction."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": kernel}))
    blocks, todo = [], [sch.get_sblock("root")]
    while todo:
        rv = todo.pop()
        children = sch.get_child_blocks(rv)
        todo.extend(children)
        blocks.extend(sch.get(c) for c in children)
    writers = [b for b in blocks if any(w.source.same_as(out) for w in b.writes)]
    if len(writers) != 1:
        return False
    writer = writers[0]
    if writer.init is not None or any(int(iv.iter_type) != 0 for iv in writer.iter_vars):   # 0: data parallel
        return False
    written = [w for w in writer.writes if w.source.same_as(out)][0].region
    analyzer, written_at = tvm.sym.Analyzer(), _flat(written, out.shape)

    def at_written(read):
        if tvm_ffi.structural_equal(read.region, written):
            return True
        at = _flat(read.region, read.source.shape)
        return at is not None and written_at is not None and analyzer.can_prove_equal(at, written_at)

    return all(b.same_as(writer) and at_written(r) for b in blocks for r in b.reads if r.source.same_as(state))


@relax.expr_functor.mutator
class _Swap(relax.PyExprMutator):
    """``old`` (a fresh tensor) replaced by ``new`` (a parameter) everywhere; its allocation
    dropped.  With ``view``, ``old`` stays, bound to ``new`` reshaped to its shape instead."""

    def __init__(self, old, new, view=False):
        super().__init__()
        self.old, self.new, self.view = old, new, view

    def visit_var_(self, var):     # pylint: disable=arguments-renamed
        return self.new if var.same_as(self.old) and not self.view else var

    def visit_var_binding_(self, binding):
        if not binding.var.same_as(self.old):
            super().visit_var_binding_(binding)
        elif self.view:
            view = self.builder_.normalize(relax.op.reshape(self.new, self.old.ty.shape))
            self.builder_.emit_normalized(relax.VarBinding(self.old, view))
