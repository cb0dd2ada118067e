"""Between a user's layouts and a matrix scan's (B, H, L, .) ones, for the rewrite.

``match_matrix`` (``matrix.py``) names, for each factor of a step, the state dim each of its
non-unit axes runs along, and gives the state's dims roles: ``K`` (contracted by the readout),
``V``, and the lanes ``B`` and ``H`` (absent when of extent 1).  These helpers move the lifted
whole-sequence tensors, the initial and final state and the stacked readouts between the two
layouts with one ``permute_dims`` and one ``reshape`` each (unit dims only move).
"""
from tvm import relax

from .steps import tensor_dtype, tensor_shape

_LANES = ("B", "H")


def matrix_operand(bb, lifter, factor, roles, inner, shape=None, dtype=None, whole=None):
    """A scan operand: ``factor`` lifted to the whole sequence (or the ``whole`` tensor given,
    already in the scan's layout) in (B, H, L, inner) layout, broadcast to ``shape`` and cast
    to ``dtype`` if needed."""
    if whole is None:
        whole = canonical(bb, *lifter.lift(factor.expr), factor.labels, roles, inner)
    if shape is not None and tensor_shape(whole) != tuple(shape):
        whole = bb.emit(relax.op.broadcast_to(whole, shape))
    if dtype is not None and tensor_dtype(whole) != dtype:
        whole = bb.emit(relax.op.astype(whole, dtype))
    return whole


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
    if tensor_shape(x) != tuple(spec.state_shape):
        x = bb.emit(relax.op.reshape(x, spec.state_shape))
    return x


def state_from_scan(bb, s, roles, state_shape):
    """The scan's (B, H, K, V) state in the user's layout."""
    present = [roles[r] for r in _LANES + ("K", "V") if r in roles]
    s = _reshaped(bb, s, [state_shape[d] for d in present])
    order = sorted(range(len(present)), key=lambda i: present[i])
    if order != list(range(len(order))):
        s = bb.emit(relax.op.permute_dims(s, order))
    return bb.emit(relax.op.reshape(s, state_shape)) if tensor_shape(s) != tuple(state_shape) else s


def scan_to_stack(bb, o, match, out_shape, out_dtype):
    """The scan's o (B, H, L, V) as the user's stacked readouts (``match.out_labels``)."""
    roles = match.roles
    present = [roles[r] for r in _LANES if r in roles] + ["L", roles["V"]]
    extents = [n for n in tensor_shape(o) if n != 1]
    if sorted(map(str, present)) != sorted(map(str, match.out_labels)) or len(extents) != len(present):
        raise ValueError(f"the stacked readouts' dims {match.out_labels} are not the scan's {present}")
    o = _reshaped(bb, o, [n for n in tensor_shape(o) if n != 1])
    perm = [present.index(label) for label in match.out_labels]
    if perm != list(range(len(perm))):
        o = bb.emit(relax.op.permute_dims(o, perm))
    if tensor_shape(o) != tuple(out_shape):
        o = bb.emit(relax.op.reshape(o, out_shape))
    if tensor_dtype(o) != out_dtype:
        o = bb.emit(relax.op.astype(o, out_dtype))
    return o


def readouts_whole(bb, o, match):
    """Every step's readout ``q_t^T S_t`` read from the scan's o, time first, each in the
    layout (and dtype) of the step's own readout."""
    roles, piece = match.roles, match.readout_vars[0][0]
    present = [roles[r] for r in _LANES if r in roles] + ["L", roles["V"]]
    labels = ("L",) + tuple(match.readout_labels)
    if sorted(map(str, present)) != sorted(map(str, labels)):
        raise ValueError(f"a readout's dims {match.readout_labels} are not the scan's {present}")
    o = _reshaped(bb, o, [n for n in tensor_shape(o) if n != 1])
    perm = [present.index(label) for label in labels]
    if perm != list(range(len(perm))):
        o = bb.emit(relax.op.permute_dims(o, perm))
    o = _reshaped(bb, o, (tensor_shape(o)[0],) + tuple(tensor_shape(piece)))
    if tensor_dtype(o) != tensor_dtype(piece):
        o = bb.emit(relax.op.astype(o, tensor_dtype(piece)))
    return o


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
