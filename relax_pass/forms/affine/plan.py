"""The affine forms' plan kinds: a plain affine chain (its whole-sequence coefficients and one
``affine_scan``; the stacked states replace each ``concat`` or in-place written buffer that
gathers them) and a ``cumsum``/``cumprod`` op."""
from typing import NamedTuple

import numpy as np
from tvm import relax

from scanweaver_core.scan_op import emit_affine_scan

from ...form import Plan
from ...interpret import EVAL_ERRORS, Interpreter
from ...lift import Lifter
from ...steps import ONE, op_name, tensor_dtype, tensor_shape
from .cumulative import cumulative_scan


class CumulativePlan(Plan):
    """A ``cumsum`` / ``cumprod`` op made a scan (``cumulative.py``), at the op."""

    @classmethod
    def place(cls, rec):
        return [(rec.states[0], cls(rec))] if rec.form in ("cumsum", "cumprod") else None

    def emit(self, rw, binding):
        x = rw.visit_expr(binding.value.args[0])
        rw.replace(binding.var, cumulative_scan(self.rec, x, rw.builder_.emit))


class Stacking(NamedTuple):
    """How a ``concat`` gathers a chain's states."""
    axis: int               # the concat's axis (normalized)
    expand: object          # the axis each piece was ``expand_dims``-ed at, or None
    increasing: bool        # in time order (else reversed)
    initial: object         # ("first" | "last", the initial state's var) when it is a piece too


class AffinePlan(Plan):
    """A plain affine chain: the whole-sequence coefficients and one ``affine_scan`` at its
    first step (whose operands ``rec.a``, ``rec.b`` are all bound by then; not at an
    ``h_0 = b_0`` state put in front of it: fuzz case 1063, a coefficient recomputed per step,
    is bound after h_0).  The stacked states replace each ``concat`` (or in-place written
    buffer) that gathers them, the final state its other uses, a slice the others'."""

    @classmethod
    def place(cls, rec):
        plan = cls(rec, *rec.facts)
        return [(rec.bindings_vars()[0], plan)] if plan.need_states or plan.need_last else []

    def __init__(self, rec, users, value):
        super().__init__(rec)
        states = rec.states
        first = min(rec.indices)
        self.position = {s: i - first for s, i in zip(states, rec.indices)}
        internal = rec.internal
        self.concats = {}                       # concat var -> Stacking
        for v, val in value.items():
            if op_name(val) in ("relax.concat", "relax.stack"):
                got = self._stacking(val, value, users)
                if got is not None:
                    self.concats[v] = got
        consumed = {f for c in self.concats for f in value[c].args[0].fields} | set(self.concats)
        for buf, (axis, region) in written_buffers(rec, value, users).items():
            self.concats[buf] = Stacking(axis, axis, True, None)   # out[:, t] = h_t for every t
            consumed |= region
        self.external = {}
        for s in states:
            uses = [u for u in users.get(s, []) if u not in internal and u not in consumed]
            if uses:
                self.external[s] = uses
        self.last = states[-1]
        self.need_states = bool(self.concats) or any(not s.same_as(self.last) for s in self.external)
        self.need_last = self.last in self.external

    def _stacking(self, concat, value, users):
        """The ``Stacking`` when ``concat`` (or ``stack``) gathers exactly the chain's states
        (each maybe through its own ``expand_dims``) in time order or its reverse, maybe with the initial
        state in front or behind (``hs = [h0]`` before the loop); axes normalized
        (``torch.stack(hs, -1)`` exports with negative ones)."""
        fields = list(concat.args[0].fields)
        rank = len(self.rec.state_shape)
        states, expand_axes = [], set()
        if op_name(concat) == "relax.stack":       # concat of expand_dims at the same axis
            states, expand_axes = fields, {int(concat.attrs.axis) % (rank + 1)}
            fields = ()
        for f in fields:
            inner = value.get(f)
            if (op_name(inner) == "relax.expand_dims" and len(inner.attrs.axis) == 1
                    and len(users.get(f, [])) == 1):
                expand_axes.add(int(inner.attrs.axis[0]) % (rank + 1))
                f = inner.args[0]
            else:
                expand_axes.add(None)
            states.append(f)
        initial = None
        if len(states) == len(self.rec.states) + 1:
            for end, k in (("first", 0), ("last", -1)):
                if self._is_initial(states[k]):
                    initial = (end, states[k])
                    states.pop(k)
                    break
        if len(expand_axes) != 1 or len(states) != len(self.rec.states) or set(states) != set(self.rec.states):
            return None
        order = [self.position[s] for s in states]
        n = len(order)
        if order == list(range(n)):
            increasing = True
        elif order == list(range(n - 1, -1, -1)):
            increasing = False
        else:
            return None
        expand = expand_axes.pop()
        return Stacking(int(concat.attrs.axis) % (rank + (expand is not None)), expand, increasing, initial)

    def _is_initial(self, x):
        """``x`` is the state before the first step: the chain's initial state, or zeros."""
        rec = self.rec
        if rec.initial is not None:
            return x.same_as(rec.initial)
        return tensor_shape(x) == rec.state_shape and rec.analysis.is_zeros(x)

    def emit(self, rw, binding):
        rec, bb = self.rec, rw.builder_
        rank, axis = len(rec.state_shape), rec.axis
        lifter = Lifter(rec.analysis, (min(rec.indices), rec.length), bb.emit, rw.visit_expr)
        a = _vectorize(lifter, rec.a, rank - axis)
        b = _vectorize(lifter, rec.b, rank - axis)
        outputs = tuple(k for k, need in (("states", self.need_states), ("last", self.need_last)) if need)
        h0 = rw.visit_expr(rec.initial) if rec.initial is not None else None
        outs = emit_affine_scan(bb.emit, None if a is ONE else a, b, h0, rec.state_shape, rec.length,
                                axis, rec.reverse, outputs)
        for s in self.external:
            if s.same_as(self.last):
                rw.replace(s, outs["last"])
            else:
                pos = relax.const(self.position[s], "int64")
                rw.replace(s, bb.emit(relax.op.take(outs["states"], pos, axis=axis)))
        for c, stacking in self.concats.items():
            gathered_states = _gather(bb, outs["states"], axis, rank, stacking, tensor_shape(c), rw.visit_expr)
            if tensor_dtype(gathered_states) != tensor_dtype(c):   # (a bf16 buffer written h_t.to(bf16))
                gathered_states = bb.emit(relax.op.astype(gathered_states, tensor_dtype(c)))
            rw.replace(c, gathered_states)


def _vectorize(lifter, expr, rho):
    """The whole-sequence tensor of a step coefficient, time ``rho`` dims from the end."""
    if expr is ONE:
        return expr
    return lifter.align(*lifter.lift(expr), rho)


def _gather(bb, states, axis, rank, stacking, shape, visit):
    """What the stacking ``concat`` computed (``shape``), from the scan's stacked ``states``;
    with the initial state as a piece, that piece (bound before the chain; its own
    ``expand_dims`` may come after it) and then the states."""
    shape = list(shape)
    cat_axis, expand, increasing, initial = stacking
    if initial is not None:
        piece = visit(initial[1])
        if expand is not None:
            piece = bb.emit(relax.op.expand_dims(piece, [expand]))
        shape[cat_axis] -= tensor_shape(piece)[cat_axis]
    states = gathered(bb, states, axis, rank, cat_axis, expand, increasing, tuple(shape))
    if initial is not None:
        pieces = [piece, states] if initial[0] == "first" else [states, piece]
        states = bb.emit(relax.op.concat(pieces, cat_axis))
    return states


def gathered(bb, states, axis, rank, cat_axis, expand, increasing, shape):
    """What ``concat([expand_dims(h_t, expand) ...], cat_axis)`` computed, from the scan's
    stacked ``states`` (L at ``axis``): concatenating the pieces along ``cat_axis`` is
    stacking them there and merging L with the next dim (a reshape)."""
    if not increasing:
        states = bb.emit(relax.op.flip(states, axis))
    if expand == cat_axis:                                             # a plain torch.stack
        perm = [i for i in range(rank + 1) if i != axis]
        perm.insert(cat_axis, axis)
        return states if perm == list(range(rank + 1)) else bb.emit(relax.op.permute_dims(states, perm))
    perm = [i for i in range(rank + 1) if i != axis] + [axis]        # L last
    if perm != list(range(rank + 1)):
        states = bb.emit(relax.op.permute_dims(states, perm))
    piece_rank = rank
    if expand is not None:                                             # the pieces' unit dim
        states = bb.emit(relax.op.expand_dims(states, [expand]))
        piece_rank += 1
    perm = list(range(piece_rank))
    perm.insert(cat_axis, piece_rank)                                  # L stacked at cat_axis
    if perm != list(range(piece_rank + 1)):
        states = bb.emit(relax.op.permute_dims(states, perm))
    if tensor_shape(states) != shape:
        states = bb.emit(relax.op.reshape(states, shape))
    return states


def written_buffers(rec, value, users):
    """In-place output writes ``out = x.new_empty(..); out[:, t] = h_t`` export as one
    ``where(arange == t, broadcast(h_t), out)`` per step over the whole buffer.  A last such
    ``where`` that equals the states stacked at an axis (checked by evaluating it on random
    states and a random first buffer: every slot written, in time order) is that stack:
    ``{buffer var: (axis, the bindings that built it)}``."""
    shape, n = rec.state_shape, rec.length
    found = {}
    rng = np.random.default_rng(5)
    for v, val in value.items():
        full = tensor_shape(v)
        if op_name(val) != "relax.where" or full is None or len(full) != len(shape) + 1:
            continue
        fits = [k for k in range(len(shape) + 1) if full == shape[:k] + (n,) + shape[k:]]
        if not fits or any(op_name(value.get(u)) == "relax.where" and tensor_shape(u) == full
                           for u in users.get(v, []) if isinstance(u, relax.Var)):
            continue                    # not of a stack's shape, or not the last write
        env = {s: rng.standard_normal(shape) for s in rec.states}
        interp = Interpreter(value, missing=lambda var: rng.standard_normal(tensor_shape(var) or ()))
        interp.memo.update(env)
        first = v                       # the buffer before the writes: random, whatever made it
        while op_name(value.get(first)) == "relax.where" and tensor_shape(first) == full:
            first = value[first].args[2]
        interp.memo[first] = rng.standard_normal(full)
        try:
            got = interp(v)
        except EVAL_ERRORS:
            continue
        stacked = [env[s] for _, s in sorted(zip(rec.indices, rec.states), key=lambda p: p[0])]
        for k in fits:
            if np.array_equal(got, np.stack(stacked, k)):
                found[v] = (k, {x for x in interp.memo if x not in env})
                break
    return found
