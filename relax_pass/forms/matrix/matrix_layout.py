"""Between a user's layouts and a matrix scan's (B, H, L, .) ones, for the rewrite.

``match_matrix`` (``matrix.py``) names, for each factor of a step, the state dim each of its
non-unit axes runs along, and gives the state's dims roles: ``K`` (contracted by the readout),
``V``, and the lanes ``B`` and ``H`` (absent when of extent 1).  These helpers move the lifted
whole-sequence tensors, the initial and final state and the stacked readouts between the two
layouts with one ``permute_dims`` and one ``reshape`` each (unit dims only move).
"""
from tvm import relax

from scanweaver_core.scan_op import make_scan

from ...steps import tensor_dtype, tensor_shape
from .matrix import INNER

_LANES = ("B", "H")


def emit_matrix_scan(bb, spec, roles, state_roles, factors, h0, whole):
    """Emit the matrix scan ``spec`` on ``factors`` (``q``, ``k``, ``v``: a list multiplied
    together, ``decay``: a Factor or None), each put in its (B, H, L, .) layout by
    ``whole(factor, inner)`` (lifted from a step, or already whole), broadcast to the spec's
    shape and cast to its dtype; ``h0`` in the user's layout (``state_roles``).  Returns
    ``(scan, o)``."""
    shapes = spec.operand_shapes()

    def operand(x, name):
        if tensor_shape(x) != tuple(shapes[name]):
            x = bb.emit(relax.op.broadcast_to(x, shapes[name]))
        return x if tensor_dtype(x) == spec.dtype else bb.emit(relax.op.astype(x, spec.dtype))

    args = [operand(whole(factors["q"], "K"), "q"), operand(whole(factors["k"], "K"), "k")]
    v = None
    for factor in factors["v"]:
        part = whole(factor, "V")
        v = part if v is None else bb.emit(relax.op.multiply(v, part))
    args.append(operand(v, "v"))
    if factors["decay"] is not None:
        args.append(operand(whole(factors["decay"], INNER.get(spec.decay)), "g"))
    if spec.has_h0:
        args.append(state_to_scan(bb, h0, state_roles, spec))
    scan = bb.emit(make_scan(spec, args), "matrix_scan")
    return scan, (bb.emit(relax.TupleGetItem(scan, 0)) if spec.return_last_state else scan)


def canonical(bb, e, tax, labels, roles, inner):
    """``e`` (time on ``tax``, or on the dim ``roles["L"]`` names when ``tax`` is None) in
    (B, H, L, inner) layout; ``labels``: the state dim of each non-unit non-time axis."""
    shape = tensor_shape(e)
    axes = [i for i, n in enumerate(shape) if i != tax and n != 1]
    if len(axes) != len(labels):
        raise ValueError(f"a lifted factor of shape {shape} does not keep its step's dims {labels}")
    axis_of = dict(zip(labels, axes))
    perm, out = [], []
    for role in _LANES + ("L", inner):
        if role == "L" and tax is not None:
            axis = tax                              # a lifted per-step value
        else:                                       # (a whole-sequence one has L among its labels)
            axis = axis_of.get(roles.get(role)) if role else None
        if axis is None:
            out.append(1)
        else:
            perm.append(axis)
            out.append(shape[axis])
    if set(axis_of.values()) - set(perm):
        raise ValueError(f"a factor runs along state dims {labels} the scan gives it no room for")
    perm += [i for i in range(len(shape)) if i not in perm]
    if perm != list(range(len(shape))):
        e = bb.emit(relax.op.permute_dims(e, perm))
    if tensor_shape(e) != tuple(out):
        e = bb.emit(relax.op.reshape(e, out))
    return e


def state_to_scan(bb, x, roles, spec):
    """A state in the user's layout as the scan's (B, H, K, V)."""
    present = [roles[r] for r in _LANES + ("K", "V") if r in roles]
    perm = present + [d for d in range(len(tensor_shape(x))) if d not in present]
    if perm != list(range(len(perm))):
        x = bb.emit(relax.op.permute_dims(x, perm))
    return _reshaped(bb, x, spec.state_shape)


def state_from_scan(bb, s, roles, state_shape):
    """The scan's (B, H, K, V) state in the user's layout."""
    present = [roles[r] for r in _LANES + ("K", "V") if r in roles]
    s = _reshaped(bb, s, [state_shape[d] for d in present])
    order = sorted(range(len(present)), key=lambda i: present[i])
    if order != list(range(len(order))):
        s = bb.emit(relax.op.permute_dims(s, order))
    return _reshaped(bb, s, state_shape)


def _relabel(bb, o, roles, labels):
    """The scan's o (B, H, L, V) with its non-unit dims in the order ``labels`` names (state
    dims or ``"L"``)."""
    present = [roles[r] for r in _LANES if r in roles] + ["L", roles["V"]]
    extents = [n for n in tensor_shape(o) if n != 1]
    if sorted(map(str, present)) != sorted(map(str, labels)) or len(extents) != len(present):
        raise ValueError(f"the readouts' dims {labels} are not the scan's {present}")
    o = _reshaped(bb, o, extents)
    perm = [present.index(label) for label in labels]
    return o if perm == list(range(len(perm))) else bb.emit(relax.op.permute_dims(o, perm))


def _cast(bb, x, dtype):
    return x if tensor_dtype(x) == dtype else bb.emit(relax.op.astype(x, dtype))


def scan_to_stack(bb, o, roles, out_labels, out_shape, out_dtype):
    """The scan's o (B, H, L, V) as the user's stacked readouts (``out_labels``: for each
    non-unit axis of the stack, a state dim or ``"L"``)."""
    return _cast(bb, _reshaped(bb, _relabel(bb, o, roles, out_labels), out_shape), out_dtype)


def readouts_whole(bb, o, match):
    """Every step's readout ``q_t^T S_t`` read from the scan's o, time first, each in the
    layout (and dtype) of the step's own readout."""
    piece = match.readout_vars[0][0]
    o = _relabel(bb, o, match.roles, ("L",) + tuple(match.readout_labels))
    return _cast(bb, _reshaped(bb, o, (tensor_shape(o)[0],) + tuple(tensor_shape(piece))),
                 tensor_dtype(piece))


def readouts_from_scan(bb, o, match, positions):
    """Each step's readout, one ``take`` of ``readouts_whole`` per step (``positions``: each
    readout's step within the scan), for pieces whose further use is not lifted."""
    o = readouts_whole(bb, o, match)
    return [bb.emit(relax.op.take(o, relax.const(t, "int64"), axis=0)) for t in positions]


def epilogue_stack(bb, lifter, o, match):
    """The stacked pieces ``E(readout_t, x_t)`` on the whole sequence: ``E`` lifted with the
    scan's readouts standing for every step's, time moved to the stack's axis."""
    field, axis = match.epilogue
    lifter.memo[match.readout_vars[0][0]] = (readouts_whole(bb, o, match), 0)
    e, tax = lifter.lift(field)
    rank = len(tensor_shape(e))
    perm = [i for i in range(rank) if i != tax]
    perm.insert(axis, tax)
    if perm != list(range(rank)):
        e = bb.emit(relax.op.permute_dims(e, perm))
    out_shape = tensor_shape(match.output)
    if tensor_shape(e) != tuple(out_shape):
        e = bb.emit(relax.op.reshape(e, out_shape))
    return e


def _reshaped(bb, x, shape):
    return x if tensor_shape(x) == tuple(shape) else bb.emit(relax.op.reshape(x, shape))
