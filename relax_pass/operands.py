"""Find the tensors an expression is made of, by what it computes.

``choose(value_of, expr, roles, formula, t)`` picks, for each role (``delta``, ``A``, ...), one of
the nearest tensors below ``expr`` whose extents are the role's up to order and unit dims, and
an axis order for it, such that evaluating ``expr`` (``interpret.py``) on random values of the
chosen tensors gives exactly ``formula`` of them.  So however the frontend spelled an einsum
(broadcast ``multiply``s of views, ``relax.einsum``, casts, per-step slices of whole-sequence
tensors or values computed per step), the same operands are found, and a wrong guess can only
fail the check.  Used by the selective-scan matcher (``selective.py``).
"""
import itertools

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap, call_args

from .interpret import EVAL_ERRORS, Interpreter
from .steps import WIDTH, op_name, tensor_dtype, tensor_shape

SEARCH_BUDGET = 80       # nodes walked below an expression looking for its operands
TRIES = 4                # nearest candidates tried per role
TENSORS = (relax.Var, relax.Call, tvm.ir.GenericConst)


def nearest(value_of, expr, sizes):
    """Tensors below ``expr`` with the extents of ``sizes`` (up to order and unit dims), each
    as its ``view_root``, nearest first (breadth-first through any op, a bounded walk)."""
    want, found, queue, seen = sizes_of(sizes), [], [expr], VarMap()
    for v in queue:
        if len(queue) > SEARCH_BUDGET:
            break
        if isinstance(v, relax.Var):
            if v in seen:
                continue
            seen[v] = True
        shape = tensor_shape(v)
        if shape is not None and sizes_of(shape) == want and not v.same_as(expr):
            root = view_root(value_of, v)
            if not any(root.same_as(f) for f in found):
                found.append(root)
        queue.extend(operands_of(value_of.get(v) if isinstance(v, relax.Var) else v))
    return found[:TRIES]


def view_root(value_of, x):
    """The tensor ``x`` is a view of, in the same layout (through unit-dim ops and widening
    casts, which keep what it holds and in which order): two coefficients reading one
    ``delta`` through their own ``expand_dims`` (or ``.float()``) share it."""
    while isinstance(x, relax.Var):
        call = value_of.get(x)
        if not (op_name(call) in UNIT_VIEWS or widening(call) or keeps_order(call)):
            break
        inner = call.args[0]
        if tensor_shape(inner) is None or extents(tensor_shape(inner)) != extents(tensor_shape(x)):
            break
        x = inner
    return x


UNIT_VIEWS = ("relax.expand_dims", "relax.squeeze", "relax.reshape")


def keeps_order(call):
    """A ``permute_dims`` that moves only unit dims (the identity permutations export makes)."""
    if op_name(call) != "relax.permute_dims" or call.attrs.axes is None:
        return False
    shape = tensor_shape(call.args[0])
    moved = [int(a) for a in call.attrs.axes if shape is not None and shape[int(a)] != 1]
    return shape is not None and moved == sorted(moved)


def extents(shape):
    return [n for n in shape if n != 1]


def widening(call):
    """``call`` is an ``astype`` to a float type at least as wide (no value changes)."""
    if op_name(call) != "relax.astype":
        return False
    source, target = tensor_dtype(call.args[0]), str(call.attrs.dtype)
    return source in WIDTH and target in WIDTH and WIDTH[target] >= WIDTH[source]


def operands_of(value):
    """The tensors ``value`` reads directly (tuple fields included)."""
    if isinstance(value, relax.TupleGetItem):
        return [value.tuple_value]
    if not isinstance(value, relax.Call):
        return []
    out = []
    for a in call_args(value):
        out.extend(a.fields if isinstance(a, relax.Tuple) else [a])
    return [a for a in out if isinstance(a, TENSORS)]


def sizes_of(shape):
    """The extents that are not 1, sorted: what a tensor holds, up to layout and unit dims."""
    return sorted(n for n in shape if n != 1)


def layouts(x, sizes):
    """Axis orders ``p`` of ``x`` such that ``transpose(x, p).reshape(sizes)`` is ``x`` in the
    layout ``sizes`` names: its non-unit axes in that order, unit axes last (a constant
    ``A[None, :, None, :]`` is ``A``).  Several when extents repeat."""
    return layouts_of_shape(tensor_shape(x), sizes)


def layouts_of_shape(shape, sizes):
    keep = [i for i, n in enumerate(shape) if n != 1]
    units = tuple(i for i, n in enumerate(shape) if n == 1)
    want = [n for n in sizes if n != 1]
    return [p + units for p in itertools.permutations(keep) if [shape[i] for i in p] == want]


def probe(x, rng):
    if isinstance(x, tvm.ir.GenericConst):
        return x.value.numpy().astype(np.float64)
    return rng.uniform(-1.0, 1.0, tensor_shape(x))


def evaluate_from(value_of, expr, env):
    """``expr`` evaluated from ``env`` alone (constants aside), or None when it cannot be."""
    interp = Interpreter(value_of)
    interp.memo.update((k, v) for k, v in env.items() if isinstance(k, relax.Var))
    try:
        return np.asarray(interp(expr))
    except EVAL_ERRORS:
        return None


def agrees(value_of, expr, env, want):
    """Does ``expr``, evaluated from ``env`` alone (constants aside), equal ``want``?"""
    got = evaluate_from(value_of, expr, env)
    return got is not None and got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-9)


def choose(value_of, expr, roles, formula, t, fixed=()):
    """Choose one tensor (and axis order) per role so that ``expr`` equals ``formula`` at step
    ``t``: ``roles`` maps a role to its canonical sizes; ``fixed`` gives roles already known
    as ``(tensor, axes)``.  Returns ``{role: (tensor, axes)}`` or None."""
    rng = np.random.default_rng(7)
    fixed = dict(fixed)
    free = [r for r in roles if r not in fixed]
    options = [[(x, p) for x in nearest(value_of, expr, roles[r]) for p in layouts(x, roles[r])]
               for r in free]
    for choice in itertools.product(*options):
        pick = {**fixed, **dict(zip(free, choice))}
        tensors = [x for x, _ in pick.values()]
        if len({hash(x) for x in tensors}) != len(tensors):
            continue
        values = {x: probe(x, rng) for x in tensors}
        canonical = {r: np.transpose(values[x], p).reshape(roles[r]) for r, (x, p) in pick.items()}
        if agrees(value_of, expr, values, formula(canonical, t)):
            return pick
    return None
