"""Is a value affine in a state?  One step of a recurrence read with the state as a symbol.

``affine_in(value_of, position, v, p)`` interprets the bindings between a candidate state ``p``
and a step ``v``: every value is state-free, or ``coef * p + off`` (``Affine``; ``coef`` /
``off`` are Relax expressions of state-free values, ``None`` for 1 / 0), or not affine
(``NotAffine`` names the op).  It is closed under ``add``/``subtract`` (sums of any number of
terms), ``multiply`` and ``divide`` by state-free values, ``negative``, ``where`` with a
state-free condition (what ``torch.lerp`` exports to), and casts between float dtypes.  Layout
ops on the state (``permute_dims``, ``reshape``, ``expand_dims``, ``squeeze``) are followed
through an index map, so a state transposed inside the step and transposed back reads as the
state itself; the coefficients are carried through the same ops.  A value bound before ``p``
cannot depend on it, which keeps each reading local to its step.
"""
import functools
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .exprs import VarMap, call_args, op_name, tensor_dtype, tensor_shape

FLOATS = ("float16", "bfloat16", "float32", "float64")
LAYOUT_OPS = ("relax.permute_dims", "relax.reshape", "relax.expand_dims", "relax.squeeze")


@dataclass(frozen=True)
class Affine:
    coef: object            # relax expr or None (1)
    off: object             # relax expr or None (0)
    layout: object = None   # None (the state as it is) or an int array: source element of each


@dataclass(frozen=True)
class NotAffine:
    op: str                 # the op that is not affine in the state
    var: object             # the binding it is at


FREE = object()             # state-free: the expression itself stands for its value
READ_BUDGET = 64            # bindings one reading may visit between a state and its step


class _TooFar(Exception):
    """The reading left the neighbourhood of one step."""


def _join(op, x, y):
    """``op(x, y)``, where ``None`` is the op's identity (1 for a coefficient, 0 for an offset)."""
    if x is None:
        return y
    if y is None:
        return x
    return op(x, y)


def _mul(x, y):
    return _join(relax.op.multiply, x, y)


@functools.lru_cache(maxsize=64)
def _const(value, dtype):
    """One scalar constant node per value and dtype: a reading builds thousands of them, each
    a tensor made through the FFI (an immutable node is shared safely)."""
    return relax.const(value, dtype)


def _add(x, y):
    return _join(relax.op.add, x, y)


def _neg(x):
    return None if x is None else relax.op.negative(x)


def _same_layout(x, y):
    if x is None or y is None:
        return x is None and y is None
    return x.shape == y.shape and bool(np.all(x == y))


def _first_use(value_of, position, v, const, budget):
    """Just before the binding that reads the constant ``const`` (found walking back from
    ``v``): nothing bound earlier can depend on it.  (The frontends make a constant node per
    use; without this bound, a constant initial state far into a function reads as "too far
    from the state" and its first step is lost.)"""
    queue, seen = [v], VarMap()
    for e in queue:
        if len(queue) > budget or not isinstance(e, relax.Var) or e in seen:
            continue
        seen[e] = True
        value = value_of.get(e)
        if not isinstance(value, relax.Call):
            continue
        args = call_args(value)
        if any(a.same_as(const) for a in args):
            return position.get(e, 0) - 1
        queue.extend(a for a in args if isinstance(a, relax.Var))
    return -1


class _Reader:
    """One reading of ``v`` as affine in ``p``: memoized over the bindings between them."""

    def __init__(self, value_of, position, p, budget, v=None):
        self.value_of, self.position, self.p = value_of, position, p
        self.start = position.get(p, -1) if isinstance(p, relax.Var) else \
            _first_use(value_of, position, v, p, budget)
        self.memo = VarMap()
        self.budget = budget

    def read(self, e):
        if e.same_as(self.p):
            return Affine(None, None)
        if not isinstance(e, relax.Var):
            return FREE
        if self.position.get(e, -1) <= self.start:
            return FREE
        if e not in self.memo:
            self.budget -= 1
            if self.budget < 0:          # a step is a few bindings: this is not one
                raise _TooFar()
            self.memo[e] = FREE          # cycle guard (none in SSA; keeps it total)
            self.memo[e] = self._read_var(e)
        return self.memo[e]

    def _read_var(self, var):
        value = self.value_of.get(var)
        if not isinstance(value, relax.Call):
            if isinstance(value, relax.TupleGetItem):
                inner = self.read(value.tuple_value)
                return FREE if inner is FREE else NotAffine("TupleGetItem", var)
            return FREE
        args = list(call_args(value))
        reads = [self.read(a) if isinstance(a, (relax.Var, relax.Call)) or a.same_as(self.p) else FREE
                 for a in args]
        if all(r is FREE for r in reads):
            return FREE
        bad = next((r for r in reads if isinstance(r, NotAffine)), None)
        if bad is not None:
            return bad
        name = op_name(value)
        shape, dtype = tensor_shape(var), tensor_dtype(var)
        rule = _RULES.get(name)
        if rule is None or shape is None:
            return NotAffine(name or type(value).__name__, var)
        for a, r in zip(args, reads):        # broadcasting the state up is not elementwise
            if isinstance(r, Affine) and name in _ELEMENTWISE and tensor_shape(a) != shape:
                return NotAffine(f"{name} (the state is broadcast from {tensor_shape(a)} to {shape})", var)
        return rule(self, value, args, reads, shape, dtype) or NotAffine(name, var)


def _r_add(_, value, args, reads, shape, dtype, sign=1):
    (x, y), (rx, ry) = args, reads
    if isinstance(rx, Affine) and isinstance(ry, Affine):
        if not _same_layout(rx.layout, ry.layout):
            return None
        one = _const(1.0, dtype)
        cx = one if rx.coef is None else rx.coef
        cy = one if ry.coef is None else ry.coef
        coef = relax.op.add(cx, cy) if sign > 0 else relax.op.subtract(cx, cy)
        off = _add(rx.off, ry.off if sign > 0 else _neg(ry.off))
        return Affine(coef, off, rx.layout)
    if isinstance(rx, Affine):
        return Affine(rx.coef, _add(rx.off, y if sign > 0 else relax.op.negative(y)), rx.layout)
    coef = ry.coef if sign > 0 else (_const(-1.0, dtype) if ry.coef is None else relax.op.negative(ry.coef))
    return Affine(coef, _add(x, ry.off if sign > 0 else _neg(ry.off)), ry.layout)


def _r_sub(reader, value, args, reads, shape, dtype):
    return _r_add(reader, value, args, reads, shape, dtype, sign=-1)


def _r_mul(_, value, args, reads, shape, dtype):
    (x, y), (rx, ry) = args, reads
    if isinstance(rx, Affine) and isinstance(ry, Affine):
        return None                      # state times state
    aff, other = (rx, y) if isinstance(rx, Affine) else (ry, x)
    off = None if aff.off is None else relax.op.multiply(aff.off, other)     # None is 0 here
    return Affine(_mul(aff.coef, other), off, aff.layout)


def _r_div(_, value, args, reads, shape, dtype):
    (_, y), (rx, ry) = args, reads
    if not isinstance(rx, Affine) or ry is not FREE:
        return None                      # dividing by the state
    div = (lambda e: None if e is None else relax.op.divide(e, y))
    coef = relax.op.divide(_const(1.0, dtype), y) if rx.coef is None else div(rx.coef)
    return Affine(coef, div(rx.off), rx.layout)


def _r_neg(_, value, args, reads, shape, dtype):
    r = reads[0]
    return Affine(_const(-1.0, dtype) if r.coef is None else relax.op.negative(r.coef), _neg(r.off), r.layout)


def _r_where(_, value, args, reads, shape, dtype):
    (cond, x, y), (rc, rx, ry) = args, reads
    if rc is not FREE:
        return None                      # the condition reads the state
    zero, one = _const(0.0, dtype), _const(1.0, dtype)

    def parts(arg, r):
        if r is FREE:
            return zero, arg, None
        return (one if r.coef is None else r.coef), (zero if r.off is None else r.off), r.layout

    cx, ox, lx = parts(x, rx)
    cy, oy, ly = parts(y, ry)
    if rx is not FREE and ry is not FREE and not _same_layout(lx, ly):
        return None
    layout = lx if rx is not FREE else ly
    return Affine(relax.op.where(cond, cx, cy), relax.op.where(cond, ox, oy), layout)


def _r_astype(_, value, args, reads, shape, dtype):
    r = reads[0]
    if dtype not in FLOATS or tensor_dtype(args[0]) not in FLOATS:
        return None
    cast = (lambda e: None if e is None else relax.op.astype(e, dtype))
    return Affine(cast(r.coef), cast(r.off), r.layout)


def _r_layout(_, value, args, reads, shape, dtype):
    """A layout op applied to ``coef * L(p) + off``: the op applied to each part (made full-size
    first where it does not commute with broadcasting), and to the index map of L."""
    r, x = reads[0], args[0]
    src = tensor_shape(x)
    if src is None:
        return None
    call_on = (lambda e: relax.Call(value.op, [e] + list(args[1:]), value.attrs))
    layout = r.layout if r.layout is not None else np.arange(int(np.prod(src))).reshape(src)
    layout = _apply_layout(value, layout, shape)
    coef = None if r.coef is None else call_on(relax.op.broadcast_to(r.coef, src))
    off = None if r.off is None else call_on(relax.op.broadcast_to(r.off, src))
    return Affine(coef, off, layout)


def _apply_layout(value, index, shape):
    name = op_name(value)
    if name == "relax.permute_dims":
        axes = value.attrs.axes
        return np.transpose(index, None if axes is None else [int(a) for a in axes])
    return index.reshape(shape)          # reshape, expand_dims, squeeze keep row-major order


_ELEMENTWISE = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.where")
_RULES = {"relax.add": _r_add, "relax.subtract": _r_sub, "relax.multiply": _r_mul,
          "relax.divide": _r_div, "relax.negative": _r_neg, "relax.where": _r_where,
          "relax.astype": _r_astype, **{n: _r_layout for n in LAYOUT_OPS}}


# ops a step can end with (a product alone, ``a*h``, is a part of a step, not one)
STEP_OPS = frozenset(("relax.add", "relax.subtract", "relax.where", "relax.astype", "relax.negative",
                      *LAYOUT_OPS))


def affine_in(value_of, position, v, p, budget=READ_BUDGET):
    """``Affine`` (with ``layout`` None: the state as it is) or ``NotAffine`` for ``v`` read as a
    function of ``p``; ``FREE`` when ``v`` does not depend on ``p``.  At most ``budget`` bindings
    are visited (a step of an unrolled chain is a few)."""
    try:
        r = _Reader(value_of, position, p, budget, v).read(v)
    except _TooFar:
        return NotAffine("(too far from the state for one step)", v)
    if isinstance(r, Affine) and r.layout is not None:
        identity = np.arange(r.layout.size).reshape(r.layout.shape)
        if r.layout.shape != tuple(tensor_shape(v) or ()) or not np.array_equal(r.layout, identity):
            return NotAffine("a layout op (the state comes back permuted)", v)
        r = Affine(r.coef, r.off)
    return r


def candidates(value_of, v, limit=64, most=12, most_parts=4):
    """States ``v`` may be a step from, nearest first: vars (or constants) of ``v``'s type
    reached from it backwards through the ops the reading is closed under; a bounded walk.
    Products and quotients are parts of a step, rarely its state: at most ``most`` of them
    (the others, which a state usually is, first)."""
    shape, dtype = tensor_shape(v), tensor_dtype(v)
    found, parts, queue, seen = [], [], [v], {v}
    while queue and len(seen) < limit and len(found) < most:
        e = queue.pop(0)
        value = value_of.get(e) if isinstance(e, relax.Var) else None
        if value is None or op_name(value) not in _RULES:
            continue
        for a in call_args(value):
            if isinstance(a, tvm.ir.expr.GenericConst):
                if tuple(a.value.shape) == shape and str(a.value.dtype) == dtype:
                    found.append(a)
                continue
            if not isinstance(a, relax.Var) or a in seen:
                continue
            seen.add(a)
            if tensor_shape(a) == shape and tensor_dtype(a) == dtype:
                if op_name(value_of.get(a)) in ("relax.multiply", "relax.divide"):
                    if len(parts) < most_parts:
                        parts.append(a)
                else:
                    found.append(a)
            queue.append(a)
    return found + parts
