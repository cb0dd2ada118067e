"""One module with symbolic dims from fixed-size traces of the same model.

``torch.export`` unrolls a model's loop over time, so a trace serves one length.  Traced at a
few sizes and fused (each unrolled recurrence is one scan, so the traces have the same
structure), the modules differ only in integers: shapes, slice bounds, reshape targets, scan
specs.  ``generalize`` walks them side by side and fits each integer that differs as a
polynomial in the dims, linear in each (``L``, ``L - 1``, ``L + 3``, ``batch * L``), with
integer coefficients, checked exactly at every trace (the traces beyond the grid confirm it).
The result is rebuilt binding by binding through Relax's own type inference, and every inferred
shape is checked against every trace.  What does not generalize (a tensor constant whose size
follows a dim, an op that changes with it, an integer no such polynomial fits) raises
``GeneralizeError`` naming the binding and the values seen.
"""
import json

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from scanweaver_core.scan_op import CALLEES

from .generalize_fit import _Fit

__all__ = ["GeneralizeError", "generalize"]


class GeneralizeError(ValueError):
    """The traces do not generalize into one module; the message names the node and values."""


def _name(node):
    if isinstance(node, relax.Call):
        op = node.op
        return getattr(op, "name", None) or getattr(op, "global_symbol", None) or getattr(op, "name_hint", "call")
    return type(node).__name__


class _Unifier:
    """Walks the traces' functions in parallel and rebuilds the generalized one."""

    def __init__(self, traces, fit):
        self.fit = fit
        self.var_maps = [dict() for _ in range(traces)]     # per trace: old Var -> new Var
        self.constants = {}
        self.pending = []            # bindings an expression needs before its own (see ``positions``)
        self.where = "?"

    # -- errors ------------------------------------------------------------------------------
    def fail(self, what):
        raise GeneralizeError(f"{self.where}: {what} (traces at {self.fit.where()}); this model does "
                              "not generalize over its dynamic dims: import it at a fixed size")

    def values(self, xs, what):
        return ", ".join(f"{x} at {' '.join(f'{n}={v}' for n, v in p.items())}"
                         for x, p in zip(xs, self.fit.points)) + f" ({what})"

    # -- integers and types ------------------------------------------------------------------
    def integer(self, nodes, what):
        values = [int(n.value) for n in nodes]
        expr = self.fit.expr(values, str(nodes[0].ty))
        if expr is None:
            self.fail(f"{what} is " + self.values(values, "not a polynomial in the dims, linear in "
                                                   "each, with integer coefficients"))
        return expr

    def prim(self, nodes, what):
        if isinstance(nodes[0], tirx.IntImm) and all(isinstance(n, tirx.IntImm) for n in nodes):
            return self.integer(nodes, what)
        if all(tvm_ffi.structural_equal(nodes[0], n) for n in nodes[1:]):
            return nodes[0]
        self.fail(f"{what} differs: " + self.values(nodes, "not an integer"))

    def shape(self, shapes, what):
        if any(len(s) != len(shapes[0]) for s in shapes):
            self.fail(f"{what}: the rank changes: " + self.values([list(s) for s in shapes], "ranks"))
        return [self.prim(list(dims), f"{what} dim {i}") for i, dims in enumerate(zip(*shapes))]

    def type(self, tys, what):
        t0 = tys[0]
        if any(type(t) is not type(t0) for t in tys):
            self.fail(f"{what}: the type changes: " + self.values(tys, "types"))
        if isinstance(t0, relax.TensorType):
            if any(t.dtype != t0.dtype or t.ndim != t0.ndim for t in tys):
                self.fail(f"{what}: the tensor type changes: " + self.values(tys, "types"))
            if t0.shape is None:
                return t0
            shape = self.shape([list(t.shape.values) for t in tys], what)
            return relax.TensorType(shape, t0.dtype, vdevice=t0.vdevice)
        if isinstance(t0, relax.TupleType):
            if any(len(t.fields) != len(t0.fields) for t in tys):
                self.fail(f"{what}: the tuple size changes")
            return relax.TupleType([self.type(list(f), f"{what}[{i}]") for i, f in enumerate(zip(*(t.fields for t in tys)))])
        if isinstance(t0, relax.ShapeType) and t0.values is not None:
            return relax.ShapeType(self.shape([list(t.values) for t in tys], what))
        if all(tvm_ffi.structural_equal(t0, t) for t in tys[1:]):
            return t0
        self.fail(f"{what}: the type changes: " + self.values(tys, "types"))

    def same(self, a, b):
        """Whether types ``a`` and ``b`` are provably equal (dims compared by the analyzer)."""
        if isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType):
            if a.dtype != b.dtype or a.ndim != b.ndim or (a.shape is None) != (b.shape is None):
                return False
            return a.shape is None or all(self.fit.analyzer.can_prove_equal(x, y) for x, y in
                                          zip(a.shape.values, b.shape.values))
        if isinstance(a, relax.TupleType) and isinstance(b, relax.TupleType):
            return len(a.fields) == len(b.fields) and all(self.same(x, y) for x, y in zip(a.fields, b.fields))
        return tvm_ffi.structural_equal(a, b)

    def agrees(self, ty, tys):
        """Whether the inferred ``ty`` has, at every trace point, exactly that trace's shapes."""
        if isinstance(ty, relax.TensorType):
            if ty.shape is None:
                return all(t.shape is None for t in tys)
            dims = list(ty.shape.values)
            for t, p in zip(tys, self.fit.points):
                if t.shape is None or len(t.shape.values) != len(dims):
                    return False
                if [self.fit.evaluate(d, p) for d in dims] != [int(v.value) for v in t.shape.values]:
                    return False
            return True
        if isinstance(ty, relax.TupleType):
            return all(self.agrees(f, [t.fields[i] for t in tys]) for i, f in enumerate(ty.fields))
        return True

    # -- expressions -------------------------------------------------------------------------
    def expr(self, nodes, what="value"):
        n0 = nodes[0]
        if any(type(n) is not type(n0) for n in nodes):
            self.fail(f"{what}: the op changes: " + self.values([_name(n) for n in nodes], "nodes"))
        if isinstance(n0, (relax.DataflowVar, relax.Var)):
            new = {m.get(n) for m, n in zip(self.var_maps, nodes)}
            if len(new) != 1 or None in new:
                self.fail(f"{what}: reads different values in different traces")
            return new.pop()
        if isinstance(n0, (tirx.IntImm, tirx.FloatImm)):      # (TVM 0.27: these are Constants too)
            return self.prim(nodes, what)
        if isinstance(n0, tvm.ir.Constant):
            return self.constant(nodes, what)
        if isinstance(n0, relax.ShapeExpr):
            return relax.ShapeExpr(self.shape([list(n.values) for n in nodes], what))
        if isinstance(n0, relax.Tuple):
            if any(len(n.fields) != len(n0.fields) for n in nodes):
                self.fail(f"{what}: the tuple size changes: " + self.values([len(n.fields) for n in nodes], "sizes"))
            return relax.Tuple([self.expr(list(f), f"{what}[{i}]") for i, f in enumerate(zip(*(n.fields for n in nodes)))])
        if isinstance(n0, relax.TupleGetItem):
            if any(n.index != n0.index for n in nodes):
                self.fail(f"{what}: the tuple index changes")
            return relax.TupleGetItem(self.expr([n.tuple_value for n in nodes], what), n0.index)
        if isinstance(n0, relax.Call):
            return self.call(nodes, what)
        if isinstance(n0, relax.If):
            return relax.If(self.expr([n.cond for n in nodes], f"{what} condition"),
                            self.seq([n.true_branch for n in nodes]), self.seq([n.false_branch for n in nodes]))
        if isinstance(n0, relax.SeqExpr):
            return self.seq(nodes)
        if isinstance(n0, relax.Function):
            self.fail(f"{what}: a nested function is not supported by the generalizer")
        if all(tvm_ffi.structural_equal(n0, n) for n in nodes[1:]):   # ops, strings, dtypes, ...
            return n0
        self.fail(f"{what} differs: " + self.values(nodes, "values"))

    def constant(self, nodes, what):
        key = tuple(hash(n) for n in nodes)
        if key not in self.constants:
            arrays = [n.value.numpy() for n in nodes]
            if any(a.shape != arrays[0].shape or a.dtype != arrays[0].dtype for a in arrays):
                self.fail(f"{what}: a tensor constant whose shape follows the dims: "
                          + self.values([a.shape for a in arrays], "shapes"))
            if any(not np.array_equal(a, arrays[0]) for a in arrays[1:]):
                return self.positions(arrays, what)
            self.constants[key] = nodes[0]
        return self.constants[key]

    def positions(self, arrays, what):
        """An integer constant of consecutive values that follow the dims (a cache's position,
        ``arange(1) + T``) as ``arange(start, start + n)`` of the fitted start (reshaped to 0-d
        for a scalar); anything else fails."""
        a0 = arrays[0]
        start = self.fit.expr([int(a.reshape(-1)[0]) for a in arrays], str(a0.dtype)) \
            if a0.dtype.kind == "i" and a0.ndim <= 1 and a0.size >= 1 else None
        if start is None or any(not np.array_equal(a.reshape(-1), a.reshape(-1)[0] + np.arange(a.size))
                                for a in arrays):
            self.fail(f"{what}: a tensor constant whose values follow the dims "
                      f"(shape {a0.shape}, {a0.dtype})")
        count = tirx.IntImm(str(a0.dtype), a0.size)
        seq = relax.Var(f"position{len(self.pending)}", relax.TensorType((a0.size,), str(a0.dtype)))
        self.pending.append(relax.VarBinding(seq, relax.op.arange(start, start + count, 1, str(a0.dtype))))
        if a0.ndim == 1:
            return seq
        scalar = relax.Var(f"position{len(self.pending)}", relax.TensorType((), str(a0.dtype)))
        self.pending.append(relax.VarBinding(scalar, relax.op.reshape(seq, ())))
        return scalar

    def call(self, nodes, what):
        n0 = nodes[0]
        op = n0.op
        if isinstance(op, (tvm.ir.Op, relax.ExternFunc, tvm.ir.GlobalVar)):
            if any(not tvm_ffi.structural_equal(op, n.op) for n in nodes[1:]):
                self.fail(f"{what}: the op changes: " + self.values([_name(n) for n in nodes], "ops"))
        else:
            op = self.expr([n.op for n in nodes], f"{what} callee")
        if any(len(n.args) != len(n0.args) for n in nodes):
            self.fail(f"{what} ({_name(n0)}): the number of arguments changes")
        name = _name(n0)
        if n0.attrs is not None and any(not tvm_ffi.structural_equal(n0.attrs, n.attrs) for n in nodes[1:]):
            self.fail(f"{what} ({name}): its attributes change: " + self.values([n.attrs for n in nodes], "attrs"))
        spec_kind = CALLEES.get(getattr(n0.args[0], "global_symbol", None)) if n0.args else None
        label = name if what in ("", name) else f"{what} ({name})"
        args = []
        for i, arg in enumerate(zip(*(n.args for n in nodes))):
            if spec_kind is not None and i == len(n0.args) - 1:
                args.append(self.spec(list(arg), f"{label} spec"))
            else:
                args.append(self.expr(list(arg), f"{label} argument {i}"))
        ty_args = [self.type(list(t), f"{label} type argument")
                   for t in zip(*(n.ty_args for n in nodes))]
        call = relax.Call(op, args, n0.attrs, ty_args)
        return self.inbound_slice(call) if name == "relax.strided_slice" else call

    def inbound_slice(self, call):
        """A strided_slice whose bounds are provably inside its axes for every dim at or above
        its lower bound (1, or the Dim's ``min``), marked ``assume_inbound``; bounds counted from
        the end (``x[..., -4:]``, ``x[:, -L:]``) and ends past it (``INT64_MAX``) are first
        rewritten from the start.  Otherwise Relax infers its shape with ``if_then_else`` and
        min/max of the dims, which TVM 0.27 then cannot infer further ("Cannot find the
        FInferType ... prim.if_then_else"); a match_cast of it crashes FuseOps/FuseTIR, and
        compiling such shapes overflowed the compiler's stack (a decode cache's ``[..., -4:]``)."""
        data, axes, begins, ends = call.args[:4]
        strides = call.args[4] if len(call.args) > 4 else None
        shape = getattr(getattr(data, "ty", None), "shape", None)
        if call.attrs.assume_inbound or shape is None:
            return call
        # axes counted from the start too: TVM 0.27's dynamic slice fails on a negative one
        # ("Check failed: axis < src_tensor_dim (-1 vs. 2)")
        axes = [int(a.value) % len(shape.values) for a in axes.fields]
        call = relax.op.strided_slice(data, axes, begins, ends, strides, assume_inbound=False)
        positive = self.fit.positive
        new_begins, new_ends = [], []
        for i, axis in enumerate(axes):
            extent = shape.values[axis]
            step = strides.fields[i] if strides is not None else tirx.IntImm("int64", 1)
            begin, end = (self._from_start(x, extent) for x in (begins.fields[i], ends.fields[i]))
            if not (isinstance(step, tirx.IntImm) and int(step.value) == 1
                    and all(positive.can_prove(c) for c in (begin >= 0, begin <= end, end <= extent))):
                return call
            new_begins.append(begin)
            new_ends.append(end)
        return relax.op.strided_slice(data, axes, new_begins, new_ends, strides, assume_inbound=True)

    def _from_start(self, bound, extent):
        """A slice bound counted from the start of an axis of ``extent``: a provably negative one
        plus the extent, one provably past the end the extent itself."""
        positive = self.fit.positive
        if isinstance(bound, tirx.IntImm) and int(bound.value) >= 1 << 62:    # "to the end" (INT64_MAX)
            return extent
        if positive.can_prove(bound < 0):
            return self.fit.analyzer.simplify(extent + bound)
        if positive.can_prove(bound >= extent):
            return extent
        return bound

    def spec(self, nodes, what):
        """A scan's spec (JSON): a field that differs becomes the text of its polynomial (a
        symbolic extent, named by that text)."""
        fields = [json.loads(n.value) for n in nodes]

        def unify(values, key):
            v0 = values[0]
            if all(v == v0 for v in values):
                return v0
            if isinstance(v0, list) and all(isinstance(v, list) and len(v) == len(v0) for v in values):
                return [unify(list(v), f"{key}[{i}]") for i, v in enumerate(zip(*values))]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                text = self.fit.text(values)
                if text is not None:
                    return text
            self.fail(f"{what}: field {key} is " + self.values(values, "not generalizable"))

        merged = {k: unify([f[k] for f in fields], k) for k in fields[0]}
        return tvm.ir.StringImm(json.dumps(merged, sort_keys=True))

    # -- bindings and functions --------------------------------------------------------------
    def new_var(self, old, ty):
        cls = relax.DataflowVar if isinstance(old, relax.DataflowVar) else relax.Var
        return cls(old.name, ty)

    def bind(self, olds, new):
        for m, old in zip(self.var_maps, olds):
            m[old] = new

    def binding(self, bb, bindings):
        b0 = bindings[0]
        self.where = f"binding {b0.var.name}"
        if any(type(b) is not type(b0) for b in bindings):
            self.fail("the binding kind changes")
        self.pending = []
        value = bb.normalize(self.expr([b.value for b in bindings], ""))
        before, self.pending = self.pending, []
        made = self._binding(bb, bindings, value)
        return before + (made if isinstance(made, list) else [made])

    def _binding(self, bb, bindings, value):
        b0 = bindings[0]
        tys = [b.var.ty for b in bindings]
        fitted = self.type(tys, "its type")
        if isinstance(b0, relax.MatchCast):
            cast = self.type([b.ty for b in bindings], "its match_cast type")
            var = self.new_var(b0.var, fitted)
            self.bind([b.var for b in bindings], var)
            return relax.MatchCast(var, value, cast)
        if self.same(value.ty, fitted):
            var = self.new_var(b0.var, value.ty)
            self.bind([b.var for b in bindings], var)
            return relax.VarBinding(var, value)
        if self.agrees(value.ty, tys) or _less_specific(value.ty, fitted):
            # Relax's form is right at the traces but not provably the fitted one (it does not
            # know a dim is positive: a slice to L infers min/max of L), or it is unknown: the
            # match_cast states the fitted shape and checks it at run time.  It casts a var:
            # TVM 0.27's FuseOps/FuseTIR crash (segfault) on a match_cast of a call.
            inferred = self.new_var(b0.var, value.ty)
            var = self.new_var(b0.var, fitted)
            self.bind([b.var for b in bindings], var)
            return [relax.VarBinding(inferred, value), relax.MatchCast(var, inferred, fitted)]
        self.fail(f"Relax infers {value.ty} for {_name(b0.value)}, which disagrees with the traces' "
                  + ", ".join(str(t) for t in tys))

    def seq(self, seqs):
        bb = relax.BlockBuilder()
        blocks = []
        if any(len(s.blocks) != len(seqs[0].blocks) for s in seqs):
            self.fail("the number of binding blocks changes")
        for i, group in enumerate(zip(*(s.blocks for s in seqs))):
            if any(len(b.bindings) != len(group[0].bindings) for b in group):
                self.where = f"block {i}"
                self.fail("the number of bindings changes: " + self.values(
                    [len(b.bindings) for b in group], "bindings; a recurrence fused in one trace and "
                    "not in another leaves its unrolled steps"))
            new = []
            for bs in zip(*(b.bindings for b in group)):
                made = self.binding(bb, list(bs))
                new.extend(made if isinstance(made, list) else [made])
            blocks.append(relax.DataflowBlock(new) if isinstance(group[0], relax.DataflowBlock)
                          else relax.BindingBlock(new))
        self.where = "the result"
        return relax.SeqExpr(blocks, self.expr([s.body for s in seqs], "the result"))

    def function(self, funcs, name):
        self.where = f"function {name}"
        if any(len(f.params) != len(funcs[0].params) for f in funcs):
            self.fail("the number of parameters changes")
        params = []
        for ps in zip(*(f.params for f in funcs)):
            param = relax.Var(ps[0].name, self.type([p.ty for p in ps], f"parameter {ps[0].name}"))
            self.bind(ps, param)
            params.append(param)
        body = self.seq([f.body for f in funcs])
        ret = self.type([f.ret_ty for f in funcs], "the return type")
        return relax.Function(params, body, ret, funcs[0].is_pure, funcs[0].attrs)


def _less_specific(inferred, fitted):
    """Relax inferred less than the traces show (an unknown shape or dims): a match_cast states it."""
    if isinstance(inferred, relax.TensorType) and isinstance(fitted, relax.TensorType):
        return inferred.dtype == fitted.dtype and (inferred.shape is None or inferred.ndim == fitted.ndim)
    return False


def generalize(mods, points, dims, lower=None):
    """One IRModule from ``mods`` (the traces, fused), traced at ``points`` (dim name -> size,
    one dict per module, the first ``2**len(dims)`` a full grid), with ``dims`` (name ->
    ``tirx.Var``) symbolic; ``lower`` (name -> int): the smallest size each dim may take (a
    Dim's ``min``; 1 when absent).  Raises ``GeneralizeError`` naming what does not generalize."""
    if len(mods) != len(points) or len(points) < 2 ** len(dims):
        raise ValueError(f"generalize: {len(mods)} traces at {len(points)} points for {len(dims)} dims")
    unifier = _Unifier(len(mods), _Fit(points, dims, lower))
    names = [gv.name_hint for gv in mods[0].get_global_vars()]
    out = {}
    for name in names:
        funcs = []
        for m in mods:
            if name not in [gv.name_hint for gv in m.get_global_vars()]:
                raise GeneralizeError(f"function {name}: missing from one trace")
            funcs.append(m[name])
        if isinstance(funcs[0], relax.Function):
            out[name] = unifier.function(funcs, name)
        elif all(tvm_ffi.structural_equal(funcs[0], f) for f in funcs[1:]):
            out[name] = funcs[0]
        else:
            raise GeneralizeError(f"function {name}: a PrimFunc that changes with the dims")
    mod = tvm.IRModule(out, attrs=mods[0].attrs)
    return relax.transform.Normalize()(mod)
