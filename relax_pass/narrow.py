"""Read a coefficient below the broadcasts that spread it over the state.

A per-step coefficient is often built at the state's full shape (HF's Mamba-2 cache path
expands dt and A to (B, H, P, N) before ``exp(dt * A)``; ``.repeat()`` and constants equal
along a dim do the same), though it varies along fewer dims.  ``narrowed`` rebuilds it below
those broadcasts, through elementwise ops and unit-dim views, so the matcher sees the dims it
really varies along (``matrix._decay``).
"""
import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap

from .steps import ELEMENTWISE, op_name, tensor_shape

NARROW_BUDGET = 48      # bindings ``narrowed`` walks below one expression


def narrowed(value_of, x):
    """``(y, shape)``: an expression equal to ``x`` broadcast from ``shape`` (x's rank, with
    1 on every dim where x only repeats values): rebuilt below the ``broadcast_to``s (and
    constants equal along a dim) that spread it, through elementwise ops and unit-dim views.
    ``(x, x's shape)`` when nothing narrows.  ``y`` is built of ops the lifter lifts (its
    nodes are not bound: only the rewrite binds them)."""
    memo, budget = VarMap(), [NARROW_BUDGET]

    def go(e):
        shape = expr_shape(e)
        if shape is None:
            return e, None
        if isinstance(e, tvm.ir.GenericConst):
            return _narrow_const(e, shape)
        if isinstance(e, relax.Call):           # a coefficient the affine reading built
            return _narrow_call(e, shape, go) or (e, shape)
        if not isinstance(e, relax.Var) or e not in value_of:
            return e, shape
        if e not in memo:
            budget[0] -= 1
            memo[e] = (e, shape) if budget[0] < 0 else _narrow_call(value_of[e], shape, go) or (e, shape)
        return memo[e]

    return go(x)


def expr_shape(x):
    """The static shape of ``x``, also of a Call the affine reading built (not yet normalized:
    ``h * 0.99 * g`` gives the coefficient ``0.99 * g``), or None."""
    shape = tensor_shape(x)
    if shape is not None or not isinstance(x, relax.Call):
        return shape
    bb = relax.BlockBuilder()
    bb._begin_dataflow_block()  # pylint: disable=protected-access  # a scratch scope to normalize in
    try:
        return tensor_shape(bb.normalize(x))
    except (RuntimeError, ValueError, TypeError):     # (TVM raises RuntimeError subclasses)
        return None
    finally:
        bb._end_block()  # pylint: disable=protected-access


def _narrow_const(c, shape):
    data = c.value.numpy()
    if data.ndim == 0:
        return c, shape
    for axis, n in enumerate(data.shape):
        if n > 1 and np.all(data == np.take(data, [0], axis=axis)):
            data = np.take(data, [0], axis=axis)
    return (c, shape) if data.shape == tuple(shape) else (relax.const(data, str(c.value.dtype)), data.shape)


def _narrow_call(call, shape, go):
    """``(y, narrowed shape)`` for a binding ``call`` of ``shape`` (its operands narrowed by
    ``go``), or None when it does not narrow."""
    name = op_name(call)
    rank = len(shape)
    if name == "relax.broadcast_to":
        inner, ns = go(call.args[0])
        if ns is None or len(ns) > rank:
            return None
        if len(ns) < rank:
            ns = (1,) * (rank - len(ns)) + tuple(ns)
            inner = relax.op.reshape(inner, ns)
        return inner, tuple(ns)
    if name in ELEMENTWISE:
        args, shapes, changed = [], [], False
        for a in call.args:
            if isinstance(a, (relax.Var, relax.Call, tvm.ir.GenericConst)) and expr_shape(a) is not None:
                na, ns = go(a)
                changed |= not na.same_as(a)
                args.append(na)
                shapes.append(tuple(ns))
            else:
                args.append(a)
        if not changed:
            return None
        out = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
        out = (1,) * (rank - len(out)) + out
        return relax.Call(call.op, args, call.attrs), out
    if name == "relax.tile":                    # x.repeat(...) of a dim x holds once: a broadcast
        inner, ns = go(call.args[0])
        reps = [int(v) for v in call.attrs.repeats]
        if ns is None or len(reps) > len(ns) or len(ns) != rank:
            return None
        reps = [1] * (rank - len(reps)) + reps
        if any(r != 1 and n != 1 for r, n in zip(reps, ns)):
            return None
        return inner, tuple(ns)
    if name not in ("relax.expand_dims", "relax.permute_dims", "relax.squeeze", "relax.reshape"):
        return None
    inner, ns = go(call.args[0])
    source = expr_shape(call.args[0])
    if inner.same_as(call.args[0]) or ns is None or source is None:
        return None
    if name == "relax.permute_dims":
        axes = list(range(len(ns)))[::-1] if call.attrs.axes is None else [int(v) for v in call.attrs.axes]
        return relax.op.permute_dims(inner, axes), tuple(ns[i] for i in axes)
    if name == "relax.expand_dims":
        out = list(ns)
        for axis in sorted(int(v) % rank for v in call.attrs.axis):
            out.insert(axis, 1)
        return relax.op.expand_dims(inner, [int(v) for v in call.attrs.axis]), tuple(out)
    if name == "relax.squeeze":
        axes = [i for i, n in enumerate(source) if n == 1] if call.attrs.axis is None else \
            [int(v) % len(source) for v in call.attrs.axis]
        return relax.op.squeeze(inner, axes), tuple(n for i, n in enumerate(ns) if i not in axes)
    if non_unit(source) != non_unit(shape):      # a reshape that regroups dims: not followed
        return None
    kept = iter(n for n, m in zip(ns, source) if m != 1)
    out = tuple(next(kept) if n != 1 else 1 for n in shape)
    return relax.op.reshape(inner, out), out


def non_unit(shape):
    """``shape``'s extents other than 1 (what a unit-dim view keeps)."""
    return [n for n in shape if n != 1]
