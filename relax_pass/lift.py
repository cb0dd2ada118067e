"""Lift a per-step coefficient to the whole sequence: one op on all steps at once.

A chain's ``a_t``/``b_t`` are expressions of per-step slices (``take(X, t, k)``, ``X[:, t:t+1]``
as ``strided_slice`` or a ``split`` piece) and loop-invariant values.  ``Lifter.lift`` rebuilds
such an expression on the unsliced tensors and returns ``(E, tax)``: ``E`` holds every step's
value, with time on axis ``tax`` (``None`` for an invariant), i.e. ``take(E, t, tax)`` is step
t's value.  Elementwise ops line the time axes of their operands up (an invariant operand that
would reach the time axis gets a unit dim there); layout ops, reductions, ``matmul`` (a Linear
layer per step), ``einsum``, softmax and norms over feature dims move time to the front and act
on the per-step dims.  Any other op raises ``NotLiftable`` naming it.
"""
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name, tensor_shape

import numpy as np

from .interpret_ops import const_ints


class NotLiftable(Exception):
    """The coefficient uses an op that does not commute with slicing along time."""


REDUCTIONS = ("relax.sum", "relax.mean", "relax.max", "relax.min", "relax.prod")
FEATURE_OPS = ("relax.permute_dims", "relax.expand_dims", "relax.squeeze", "relax.reshape",
               "relax.broadcast_to", "relax.matmul", "relax.einsum", "relax.nn.softmax",
               "relax.nn.layer_norm", "relax.nn.rms_norm", "relax.take", "relax.tile",
               "relax.strided_slice", *REDUCTIONS)


def _norm(axis, rank):
    return int(axis) % rank


class Lifter:
    """``emit`` normalizes (and, in a rewrite, binds) each built op; ``leaf`` maps an original
    invariant expression to what the lifted code reads; ``window`` is ``(lo, n)``, the steps
    the chain covers."""

    def __init__(self, analysis, window, emit, leaf=lambda e: e):
        self.an, self.window, self.emit, self.leaf = analysis, window, emit, leaf
        self.memo = VarMap()
        self.slice_rhos = []    # dims after time in each sliced tensor, in the order lifted

    def lift(self, expr):
        if expr not in self.memo:                # by handle: wrappers are made anew per access
            self.memo[expr] = self._lift(expr)
        return self.memo[expr]

    # -- leaves ------------------------------------------------------------------------------
    def _lift(self, expr):
        t = self.an.template(expr)
        if t.index is None:
            inv = self.leaf(expr)
            if isinstance(expr, relax.Call):     # a coefficient the affine reading built
                inv = self.emit(inv)
            return inv, None
        if t.key[0] == "slice":
            return self._slice(t.key[1].node, t.key[2], len(t.key) > 3)
        value = self.an.value[expr] if isinstance(expr, relax.Var) else expr
        name = op_name(value)
        if name in FEATURE_OPS:
            return self._feature_op(value, name)
        if name is None:
            raise NotLiftable(type(value).__name__)
        return self._elementwise(value)

    def _slice(self, x, axis, keep):
        self.slice_rhos.append(len(tensor_shape(x)) - 1 - axis)
        x = self.leaf(x)
        lo, n = self.window
        if lo + n > tensor_shape(x)[axis]:
            raise NotLiftable(f"a slice of steps {lo}..{lo + n - 1} of an axis of length "
                              f"{tensor_shape(x)[axis]}")
        if (lo, n) != (0, tensor_shape(x)[axis]):
            x = self.emit(relax.op.strided_slice(x, [axis], [lo], [lo + n]))
        if keep:                                 # X[:, t:t+1]: the step keeps a unit dim
            x = self.emit(relax.op.expand_dims(x, [axis + 1]))
        return x, axis

    # -- ops ---------------------------------------------------------------------------------
    def _elementwise(self, value):
        tensors = (relax.Var, relax.Call, tvm.ir.expr.GenericConst)
        lifted = [self.lift(a) if isinstance(a, tensors) else None for a in value.args]
        varying = [(e, tax) for e, tax in (x for x in lifted if x is not None) if tax is not None]
        # dims after time (rho) must agree; per-step rank q = rank - 1
        ranks = [len(tensor_shape(e)) - 1 for e, _ in varying]
        rhos = [dims_after_time(e, tax) for e, tax in varying]
        rho = rhos[0] if len(set(rhos)) == 1 else min(min(ranks), max(rhos))
        args = [arg if got is None else self.align(*got, rho) for arg, got in zip(value.args, lifted)]
        out = self.emit(relax.Call(value.op, args, value.attrs))
        return out, len(tensor_shape(out)) - 1 - rho

    def _time_first(self, e, tax):
        if tax == 0:
            return e
        perm = [tax] + [i for i in range(len(tensor_shape(e))) if i != tax]
        return self.emit(relax.op.permute_dims(e, perm))

    def _feature_op(self, value, name):  # pylint: disable=too-many-return-statements
        a = value.attrs
        if name == "relax.einsum":
            return self._einsum(value)
        if name == "relax.matmul":
            return self._matmul(value)
        x, tax = self.lift(value.args[0])
        if tax is None:
            raise NotLiftable(name)              # (only its invariant operands vary? not here)
        x = self._time_first(x, tax)
        q = len(tensor_shape(x)) - 1
        emit = self.emit
        if name == "relax.permute_dims":
            axes = list(range(q)) if a.axes is None else [_norm(v, q) for v in a.axes]
            return emit(relax.op.permute_dims(x, [0] + [v + 1 for v in axes])), 0
        if name == "relax.expand_dims":
            out_rank = q + len(a.axis)
            return emit(relax.op.expand_dims(x, [_norm(v, out_rank) + 1 for v in a.axis])), 0
        if name == "relax.squeeze":
            axes = None if a.axis is None else [_norm(v, q) + 1 for v in a.axis]
            if axes is None:
                axes = [i + 1 for i, n in enumerate(tensor_shape(x)[1:]) if n == 1]
            return emit(relax.op.squeeze(x, axes)), 0
        if name == "relax.reshape":
            shape = [int(v) for v in value.args[1].values]
            return emit(relax.op.reshape(x, [tensor_shape(x)[0]] + shape)), 0
        if name == "relax.broadcast_to":
            shape = [int(v) for v in value.args[1].values]
            x = self._pad(x, len(shape) - q)
            return emit(relax.op.broadcast_to(x, [tensor_shape(x)[0]] + shape)), 0
        if name == "relax.tile":            # x.repeat(...): the per-step dims only
            reps = [int(v) for v in a.repeats]
            if len(reps) > q:
                raise NotLiftable("relax.tile (adding dims)")
            return emit(relax.op.tile(x, [1] * (q + 1 - len(reps)) + reps)), 0
        if name in REDUCTIONS:
            axes = list(range(q)) if a.axis is None else [_norm(v, q) for v in a.axis]
            call = getattr(relax.op, name.split(".")[-1])
            return emit(call(x, [v + 1 for v in axes], bool(a.keepdims))), 0
        if name == "relax.take":            # x_t[:, 0]: one index of a per-step dim
            axis = _norm(a.axis, q)
            index = getattr(value.args[1], "value", None)
            if index is None or index.numpy().size != 1 or tensor_shape(value.args[1]) != ():
                raise NotLiftable("relax.take (of a per-step value)")
            if tensor_shape(x)[axis + 1] == 1:
                return emit(relax.op.squeeze(x, [axis + 1])), 0
            return emit(relax.op.take(x, value.args[1], axis + 1)), 0
        if name == "relax.strided_slice":   # x_t[..., :1]: a slice of per-step dims
            try:
                axes, begin, end = (const_ints(v) for v in value.args[1:4])
                strides = const_ints(value.args[4]) if len(value.args) > 4 else [1] * len(axes)
            except (TypeError, ValueError):
                raise NotLiftable("relax.strided_slice (symbolic bounds)") from None
            return emit(relax.op.strided_slice(x, [_norm(v, q) + 1 for v in axes], begin, end, strides)), 0
        if name == "relax.nn.softmax":
            return emit(relax.op.nn.softmax(x, _norm(a.axis, q) + 1)), 0
        rest = [self._invariant(v, name) for v in value.args[1:]]
        axes = [_norm(v, q) + 1 for v in a.axes]
        if name == "relax.nn.layer_norm":
            return emit(relax.op.nn.layer_norm(x, *rest, axes, float(a.epsilon), bool(a.center),
                                               bool(a.scale))), 0
        return emit(relax.op.nn.rms_norm(x, *rest, axes, float(a.epsilon))), 0

    def _invariant(self, expr, name):
        e, tax = self.lift(expr)
        if tax is not None:
            raise NotLiftable(f"{name} with a per-step weight")
        return e

    def _pad(self, x, count):
        """``count`` unit dims right after time (a per-step value given leading unit dims)."""
        if count <= 0:
            return x
        shape = tensor_shape(x)
        return self.emit(relax.op.reshape(x, [shape[0]] + [1] * count + list(shape[1:])))

    def _matmul(self, value):
        (x, tx), (y, ty) = self.lift(value.args[0]), self.lift(value.args[1])
        qx = len(tensor_shape(x)) - (tx is not None)
        qy = len(tensor_shape(y)) - (ty is not None)
        if tx is not None and ty is None and (qy <= qx if qx >= 2 else qy <= 2):
            return self.emit(relax.op.matmul(self._time_first(x, tx), y)), 0
        if tx is None and ty is not None and qy >= 2 and qx <= qy:
            return self.emit(relax.op.matmul(x, self._time_first(y, ty))), 0
        if tx is not None and ty is not None and qx == qy and qx >= 2:
            return self.emit(relax.op.matmul(self._time_first(x, tx), self._time_first(y, ty))), 0
        raise NotLiftable("relax.matmul (time would meet a contracted or broadcast dim)")

    def _einsum(self, value):
        subscripts = str(value.attrs.subscripts)
        if "..." in subscripts or "->" not in subscripts:
            raise NotLiftable("relax.einsum (implicit output or ellipsis)")
        ins, out = subscripts.split("->")
        letters = set(subscripts)
        fresh = next(c for c in "ZYXWVUTSRQPONMLKJIHGFEDCBAzyxwvutsrqponmlkjihgfedcba" if c not in letters)
        operands, specs = [], []
        for spec, arg in zip(ins.split(","), value.args[0].fields):
            e, tax = self.lift(arg)
            if tax is None:
                operands.append(e)
                specs.append(spec)
            else:
                operands.append(self._time_first(e, tax))
                specs.append(fresh + spec)
        return self.emit(relax.op.einsum(operands, ",".join(specs) + "->" + fresh + out)), 0

    # -- the scan's layout ------------------------------------------------------------------
    def align(self, e, tax, rho):
        """``e`` with time ``rho`` dims from the end (leading unit dims added if needed); an
        invariant (``tax`` None) gets a unit dim there if it reaches that far, so it broadcasts."""
        if tax is None:
            q = len(tensor_shape(e) or ())
            return self.emit(relax.op.expand_dims(e, [q - rho])) if q > rho else e
        rank = len(tensor_shape(e))
        if rank - 1 < rho:
            shape = tensor_shape(e)
            e = self.emit(relax.op.reshape(e, [1] * (rho - rank + 1) + list(shape)))
            tax += rho - rank + 1
            rank = rho + 1
        target = rank - 1 - rho
        if tax == target:
            return e
        perm = [i for i in range(rank) if i != tax]
        perm.insert(target, tax)
        return self.emit(relax.op.permute_dims(e, perm))


def dims_after_time(e, tax):
    return len(tensor_shape(e)) - 1 - tax


def head_major_sequence(lifter, emit, expr, lead, length, last, dtype, what):
    """``expr`` (one step's operand) lifted to every step as ``(*lead, length[, last])`` in
    ``dtype``: time moved after the ``lead`` dims (batch, heads), then reshaped.  What cannot be
    laid out so raises ``ValueError`` naming ``what`` (the rewrite is then refused, not crashed)."""
    from scanweaver_core.exprs import tensor_dtype  # pylint: disable=import-outside-toplevel

    try:
        e, tax = lifter.lift(expr)
    except NotLiftable as err:
        raise ValueError(f"{what} cannot be lifted to the whole sequence: {err}") from None
    if tax is None:
        raise ValueError(f"{what} does not vary over time")
    shape, at = tensor_shape(e), len(lead)
    if tax != at:
        rest = [d for d in range(len(shape)) if d != tax]
        e = emit(relax.op.permute_dims(e, rest[:at] + [tax] + rest[at:]))
    want = tuple(lead) + (length,) + ((last,) if last else ())
    if tuple(tensor_shape(e)) != want:
        if int(np.prod(tensor_shape(e))) != int(np.prod(want)):
            raise ValueError(f"{what} has shape {tensor_shape(e)}, not {want}")
        e = emit(relax.op.reshape(e, want))
    return e if tensor_dtype(e) == dtype else emit(relax.op.astype(e, dtype))


def as_stacked_output(emit, out, output, out_axis):
    """A scan's (B, H, L, V) ``out`` laid out as the per-step readouts were stacked into
    ``output`` (time on ``out_axis``, maybe merged with V), in its dtype; ``ValueError`` when
    that layout is none of those."""
    target = tuple(tensor_shape(output))
    if out_axis != 2:
        perm = {0: [2, 0, 1, 3], 1: [0, 2, 1, 3], 3: [0, 1, 3, 2]}.get(out_axis)
        if perm is None or len(target) != 4:
            raise ValueError(f"the output stacks along axis {out_axis} of {target}")
        out = emit(relax.op.permute_dims(out, perm))
    return as_value_of(emit, out, output)


def as_value_of(emit, new, old):
    """``new`` reshaped and cast to ``old``'s shape and dtype (what replaces ``old``)."""
    from scanweaver_core.exprs import tensor_dtype  # pylint: disable=import-outside-toplevel

    if tuple(tensor_shape(new)) != tuple(tensor_shape(old)):
        new = emit(relax.op.reshape(new, tensor_shape(old)))
    return new if tensor_dtype(new) == tensor_dtype(old) else emit(relax.op.astype(new, tensor_dtype(old)))
