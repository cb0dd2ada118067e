"""A loop body's recurrences, read with the shared affine analysis and lifted to scans.

Frontends whose loops stay loops (ONNX ``Scan``/``Loop``) import the body *twice* into one Relax
function: copy 0 is step ``k``, copy 1 step ``k + 1``.  Each per-step input of a copy is a slice
``take(X, k or k+1, axis)`` of a tensor ``X``: of a placeholder standing for a whole scan input,
or of an outer tensor the body indexes by the iteration number.  Each state of a copy is the
slice of a placeholder ``S`` standing for the sequence of previous states.  With that, the body
is exactly two steps of an unrolled chain, and the chain detector's own tools apply:

- ``affine.affine_in`` reads each state update of copy 0 as ``coef * h + off``;
- templates (``steps.Analysis``) say whether copy 1 computes the same thing one step on: equal
  keys, slice indices ``k`` and ``k + 1``.  A use of the iteration number other than as a slice
  index, or an op that does not commute with slicing along time, makes the copies differ;
- ``lift.Lifter`` rebuilds coefficients and per-step outputs on the whole sequences, and
  ``scan_op.emit_affine_scan`` builds each scan.

Per-step outputs may read the new states (they read the scan's stacked states) and the previous
states (the stacked states shifted by one, the initial state first).
"""
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.affine import FREE, Affine, NotAffine, affine_in
from scanweaver_core.exprs import VarMap, error_line, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_affine_scan

from .lift import Lifter, NotLiftable, dims_after_time
from .steps import Analysis

BODY_BUDGET = 100_000       # bindings one reading may visit: a body is one step, however long


class BodyError(ValueError):
    """The body is not a set of independent affine recurrences; the message says where and why."""


@dataclass
class TwoSteps:
    """A body imported twice (see the module docstring).  ``prev[i]`` is state i's placeholder
    parameter (shape ``(2,) + state``), ``states[i]`` its reads ``(copy 0, copy 1)``,
    ``updates[i]`` its new values, ``outputs[j]`` the per-step outputs; ``describe(var)`` names
    the body node a var comes from, for messages."""

    func: relax.Function
    prev: list
    states: list
    updates: list
    outputs: list
    describe: object = lambda var: f"'{var.name}'"
    pairs: list = ()        # (copy 0, copy 1) of each body node's result, in body order


@dataclass
class Lifted:
    """What the body computes over the whole sequence: per state, its scan's ``last`` state and
    ``states`` (time on ``axis[i]``); per output, ``(tensor, time axis)``."""

    last: list
    states: list
    axis: list
    outputs: list


def lift_body(body, emit, leaf, h0s, length, reverse):
    """Read ``body`` (``TwoSteps``) and emit its scans over ``length`` steps, in position order
    (``reverse``: the loop visits positions ``length - 1 .. 0``).  ``leaf(param)`` is what a
    parameter of ``body.func`` other than ``prev`` reads in the outer scope (a placeholder: its
    whole sequence, time on the same axis, in position order); ``h0s`` the initial states."""
    an = Analysis([b for blk in body.func.body.blocks for b in blk.bindings])
    an.positions()
    readings = [_reading(an, body, i) for i in range(len(body.prev))]
    rebuild = _Rebuilder(an, emit, leaf, body)
    lifter = Lifter(an, (0, length), emit, rebuild)
    last, states, axes = [], [], []
    for i, (coef, off) in enumerate(readings):
        first_slice = len(lifter.slice_rhos)
        try:
            a = None if coef is None else lifter.lift(coef)
            b = lifter.lift(off) if off is not None else None
        except NotLiftable as err:
            raise BodyError(f"state {i}'s update uses {err}, which does not commute with slicing "
                            "along time") from None
        shape = tensor_shape(body.prev[i])[1:]
        rank = len(shape)
        varying = [x for x in (b, a) if x is not None and x[1] is not None]
        # time where this state's sliced tensors have it (no transposes of them), if it fits
        natural = [r for r in lifter.slice_rhos[first_slice:] if r <= rank]
        rho = natural[0] if natural else dims_after_time(*varying[0]) if varying else rank
        rho = min(rho, rank)
        a = None if a is None else lifter.align(*a, rho)
        b = lifter.align(*b, rho) if b is not None else \
            relax.const(np.zeros((1,) * (rank + 1), tensor_dtype(h0s[i])))
        try:
            outs = emit_affine_scan(emit, a, b, h0s[i], shape, length, rank - rho, reverse,
                                    ("states", "last"))
        except (ValueError, RuntimeError) as err:
            raise BodyError(f"state {i}: its scan could not be built: {error_line(err)}") from None
        last.append(outs["last"])
        states.append(outs["states"])
        axes.append(rank - rho)
        new = body.updates[i][0]
        if isinstance(new, relax.Var) and new in an.value:
            lifter.memo[new] = (outs["states"], rank - rho)    # outputs read the stacked states
    rebuild.scans = (states, axes, h0s, reverse)
    outputs = []
    for j, (y0, y1) in enumerate(body.outputs):
        _same_step(an, body, y0, y1, f"scan output {j}")
        try:
            outputs.append(lifter.lift(y0))
        except NotLiftable as err:
            raise BodyError(f"scan output {j} uses {err}, which does not commute with slicing "
                            "along time") from None
    return Lifted(last, states, axes, outputs)


def stacked(emit, y, tax, length, axis=0, flip=False):
    """A lifted per-step output ``(y, tax)`` (``Lifted.outputs``) with time on ``axis``, flipped
    if asked; an invariant one (``tax`` None) repeated at every step."""
    if tax is None:
        y = emit(relax.op.broadcast_to(emit(relax.op.expand_dims(y, [0])), (length,) + tensor_shape(y)))
        tax = 0
    if flip:
        y = emit(relax.op.flip(y, tax))
    if tax != axis:
        order = [d for d in range(len(tensor_shape(y))) if d != tax]
        order.insert(axis, tax)
        y = emit(relax.op.permute_dims(y, order))
    return y


def _reading(an, body, i):
    """State i's update of copy 0 as ``(coef, off)`` (None: 1 and 0); copy 1 must compute it
    one step on (equal templates, slice indices 0 and 1)."""
    h, n = body.states[i][0], body.updates[i][0]
    _same_step(an, body, n, body.updates[i][1], f"state {i}'s update")
    r = Affine(None, None) if n.same_as(h) else affine_in(an.value, an.position, n, h, BODY_BUDGET)
    if isinstance(r, NotAffine):
        raise BodyError(f"{body.describe(r.var)} is not affine in state {i} ({r.op}); only "
                        "h = a*h + b, a and b free of the state, elementwise, converts to a scan")
    if r is FREE:                                   # h = b, whatever h was
        r = Affine(relax.const(0.0, tensor_dtype(n)), n)
    for j, p in enumerate(body.prev):
        for x in (r.coef, r.off):
            if x is not None and an.mentions(an.template(x).key, p):
                raise BodyError(f"state {i}'s update reads state {j} through a coefficient: coupled "
                                "states are not independent scans")
    return r.coef, r.off


def _same_step(an, body, x0, x1, what):
    """Copy 1 must compute ``what`` as copy 0 does, one step on: equal templates, and slices at
    index 0 in copy 0 and 1 in copy 1 (or none).  Else the first body node that differs is named."""
    if _one_step_on(an, x0, x1):
        return
    node = next((body.describe(v0) for v0, v1 in body.pairs if not _one_step_on(an, v0, v1)), None)
    raise BodyError(f"{what} is not the same function of step t's inputs at every t"
                    f"{f' (from {node} on)' if node else ''}: it uses the iteration number other "
                    "than as the index of a per-step slice (x[i], Slice(x, i, i+1)), or an op that "
                    "does not commute with slicing along time")


def _one_step_on(an, x0, x1):
    t0, t1 = an.template(x0), an.template(x1)
    return t0.key == t1.key and (t0.index, t1.index) in ((None, None), (0, 1))


class _Rebuilder:
    """The Lifter's ``leaf``: an expression of ``body.func`` rebuilt in the outer scope (bound
    vars re-emitted once, parameters read through ``leaf``, the PrimFuncs of ``call_tir``s
    copied), and the ``prev`` placeholders as the stacked previous states."""

    def __init__(self, an, emit, leaf, body):
        self.an, self.emit, self.leaf, self.body = an, emit, leaf, body
        self.memo = VarMap()
        self.prev = VarMap((p, i) for i, p in enumerate(body.prev))
        self.scans = None

    def __call__(self, expr):
        if isinstance(expr, relax.Var):
            if expr not in self.memo:
                self.memo[expr] = self._var(expr)
            return self.memo[expr]
        if isinstance(expr, relax.Call):
            op = self._kernel(expr.op) if isinstance(expr.op, tvm.ir.GlobalVar) else expr.op
            return relax.Call(op, [self(a) for a in expr.args], expr.attrs, expr.ty_args)
        if isinstance(expr, relax.Tuple):
            return relax.Tuple([self(f) for f in expr.fields])
        if isinstance(expr, relax.TupleGetItem):
            return relax.TupleGetItem(self(expr.tuple_value), expr.index)
        if isinstance(expr, tvm.ir.GlobalVar):
            return self._kernel(expr)
        return expr

    def _var(self, var):
        if var in self.prev:
            return self._previous(self.prev[var])
        value = self.an.value.get(var)
        if value is None:
            return self.leaf(var)
        return self.emit(self(value))

    @staticmethod
    def _kernel(gvar):
        raise BodyError(f"a coefficient calls the TIR kernel {gvar.name_hint} (one of TVM's "
                        "converters made it), which a scan cannot take in")

    def _previous(self, i):
        """State i before each step, time first: h0, then the states but the last."""
        if self.scans is None:
            raise BodyError(f"a coefficient reads state {i}: coupled states are not independent scans")
        states, axes, h0s, reverse = self.scans
        s = states[i]
        if axes[i]:
            order = [axes[i]] + [d for d in range(len(tensor_shape(s))) if d != axes[i]]
            s = self.emit(relax.op.permute_dims(s, order))
        n = tensor_shape(s)[0]
        first = self.emit(relax.op.expand_dims(h0s[i], [0]))
        if n == 1:
            return first
        if reverse:     # position t's previous state is position t+1's; the last one's is h0
            rest = self.emit(relax.op.strided_slice(s, [0], [1], [n]))
            return self.emit(relax.op.concat([rest, first], 0))
        rest = self.emit(relax.op.strided_slice(s, [0], [0], [n - 1]))
        return self.emit(relax.op.concat([first, rest], 0))
