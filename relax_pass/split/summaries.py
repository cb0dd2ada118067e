"""What a part of a scan tells the other ranks, per form, in Relax: its transition
(``transition``) and its state from the empty one (``summary_state``), and how a state passes
through a part so summarized (``combine``).

A part of a linear recurrence ``h -> M h + s`` is the pair (M, s): ``s`` its last state from
zero, ``M`` its response to the identity state with no input.  Both come from the compiled
kernel itself, so they agree with its numerics (a softplus, a decay read per key or per value, a
delta rule's rank-1 updates) whatever the form: the transition of an elementwise form (affine,
selective, matrix) is the scan of zero input from a state of ones; a delta rule's (a K x K
matrix) the scan of zero values from the identity.  The max-stabilized forms (RWKV's WKV, the
mLSTM) carry their state in log space: a part is its state from the empty one and the sum of
its log decays, and a state passes through it by a max-stabilized sum
(``scanweaver_core.algebra.log_compose``'s rule)."""
import dataclasses

import numpy as np
from tvm import relax

from scanweaver_core.algebra import LOG_FLOOR
from scanweaver_core.scan_op import make_scan
from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

from scanweaver_core.sequence_parts import view, with_state

F32 = "float32"


def run_scan(bb, spec, given):
    """Emit ``spec``'s scan on ``given`` (``{input name: expr}``); ``{output name: expr}``."""
    names = view(spec).outputs
    call = bb.emit(make_scan(spec, [given[n] for n in view(spec).operands]))
    if len(names) == 1:
        return {names[0]: call}
    return {n: bb.emit(relax.TupleGetItem(call, i)) for i, n in enumerate(names)}


def _full(bb, shape, value, dtype):
    return bb.emit(relax.op.full(shape, relax.const(value, dtype), dtype))


def _shape_of(expr):
    return [d for d in expr.ty.shape.values]


def is_log_space(spec):
    return isinstance(spec, (StabilizedScanSpec, MLSTMScanSpec))


def state_parts(spec):
    """``[(h0 name, last name, shape, dtype)]`` of the state the ranks pass on."""
    return view(spec).states


def default_state(bb, spec):
    """The state a scan given no initial one starts from: zeros, but RWKV's WKV starts empty
    (its running max at ``LOG_FLOOR``), as its kernel does."""
    floor = isinstance(spec, StabilizedScanSpec)
    return [_full(bb, shape, LOG_FLOOR if floor and name == "max0" else 0.0, F32)
            for name, _, shape, _ in state_parts(spec)]


def summary_state(bb, spec, given):
    """The part's last state from the empty state, each part float32."""
    if isinstance(spec, MLSTMScanSpec):      # (its kernel's default m0 = 0 is not empty)
        run = with_state(spec, True, True)
        empty = {name: _full(bb, shape, LOG_FLOOR if name == "m0" else 0.0, F32)
                 for name, _, shape, _ in state_parts(spec)}
        got = run_scan(bb, run, {**given, **empty})
    else:
        run = with_state(spec, False, True)
        got = run_scan(bb, run, given)
    return [bb.emit(relax.op.astype(got[last], F32)) for _, last, _, _ in state_parts(run)]


def transition(bb, spec, given):
    """The part's transition, a list of float32 exprs (empty: the identity)."""
    if isinstance(spec, StabilizedScanSpec):
        if spec.decay == "none":
            return []
        axis = spec.time_axis
        w = relax.op.astype(given["w"], F32)
        if spec.decay == "channel":       # w (C,) each step: broadcast over k's steps
            ones = relax.op.ones_like(relax.op.astype(given["k"], F32))
            w = relax.op.multiply(ones, relax.op.reshape(w, (1, 1, spec.channels) if axis == 1
                                                          else (1, spec.channels, 1)))
        return [bb.emit(relax.op.sum(w, axis=axis))]
    if isinstance(spec, MLSTMScanSpec):
        return [bb.emit(relax.op.sum(relax.op.astype(given["f"], F32), axis=2))]
    if isinstance(spec, MatrixScanSpec) and spec.decay == "none":
        return []
    (h0, last, shape, dtype), = state_parts(spec)
    if isinstance(spec, DeltaScanSpec):      # the identity through the part, values zero
        run = with_state(dataclasses.replace(spec, value=spec.key), True, True)   # (a K x K state)
        zero, zero_shape = "v", _shape_of(given["v"])[:3] + [spec.key]
        eye = np.broadcast_to(np.eye(spec.key, dtype=np.float32), tuple(shape[:2]) + (spec.key,) * 2)
        start = bb.emit(relax.const(eye.copy()))
    else:                                    # ones through the part, input zero
        run = with_state(spec, True, True)
        zero = {AffineScanSpec: "b", SelectiveScanSpec: "u", MatrixScanSpec: "k"}[type(spec)]
        zero_shape = _shape_of(given[zero])
        start = _full(bb, shape, 1.0, dtype)
    nothing = _full(bb, zero_shape, 0.0, view(run).operands[zero][1])
    got = run_scan(bb, run, {**given, zero: nothing, h0: start})
    moved = relax.op.astype(got[last], F32)
    constant = constant_axes(spec)
    if constant:                             # (one entry where the decay does not vary)
        moved = relax.op.strided_slice(moved, axes=constant, begin=[0] * len(constant), end=[1] * len(constant))
    return [bb.emit(moved)]


def constant_axes(spec):
    """The state's axes along which an elementwise transition cannot vary, so that one entry
    of each is sent: an affine scan's where ``a`` broadcasts, a matrix scan's value axis under a
    per-key decay, its key axis under a per-value decay, both under a scalar one."""
    if isinstance(spec, AffineScanSpec):
        a_state = spec.a_shape[:spec.axis] + spec.a_shape[spec.axis + 1:]
        return [i for i, (n, full) in enumerate(zip(a_state, spec.state_shape)) if n == 1 and full != 1]
    if not isinstance(spec, MatrixScanSpec):
        return []
    key, value = (3, 2) if spec.layout == "channel_major" else (2, 3)
    return {"scalar": [2, 3], "key": [value], "value": [key]}.get(spec.decay, [])


def transition_shapes(spec):
    """The shapes of ``transition``'s parts."""
    if isinstance(spec, StabilizedScanSpec):
        return [] if spec.decay == "none" else [(spec.batch, spec.channels)]
    if isinstance(spec, MLSTMScanSpec):
        return [(spec.batch, spec.heads)]
    if isinstance(spec, MatrixScanSpec) and spec.decay == "none":
        return []
    shape = state_parts(spec)[0][2]
    if isinstance(spec, DeltaScanSpec):
        return [tuple(shape[:2]) + (spec.key, spec.key)]
    constant = constant_axes(spec)
    return [tuple(1 if i in constant else n for i, n in enumerate(shape))]


def combine(bb, spec, state, moved, summary):
    """The state ``state`` (float32 parts) carried through a part with transition ``moved`` and
    state-from-empty ``summary``."""
    if is_log_space(spec):
        *values, top = state
        *part_values, part_top = summary
        shift = relax.op.add(top, moved[0]) if moved else top
        new_top = bb.emit(relax.op.maximum(shift, part_top))
        keep = bb.emit(relax.op.exp(relax.op.subtract(shift, new_top)))
        take = bb.emit(relax.op.exp(relax.op.subtract(part_top, new_top)))
        out = []
        for x, y in zip(values, part_values):
            rank = len(x.ty.shape.values) - len(top.ty.shape.values)
            k, t = keep, take
            for _ in range(rank):
                k, t = relax.op.expand_dims(k, -1), relax.op.expand_dims(t, -1)
            out.append(bb.emit(relax.op.add(relax.op.multiply(k, x), relax.op.multiply(t, y))))
        return out + [new_top]
    h, s = state[0], summary[0]
    if not moved:
        return [bb.emit(relax.op.add(h, s))]
    if isinstance(spec, DeltaScanSpec):
        return [bb.emit(relax.op.add(relax.op.matmul(moved[0], h), s))]
    return [bb.emit(relax.op.add(relax.op.multiply(moved[0], h), s))]
