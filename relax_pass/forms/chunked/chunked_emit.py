"""Emit one matrix scan for a chunked region (``chunked.ChunkedMatch``).

Each operand is moved from the user's layout to the scan's (B, H, L, .) one by one
``permute_dims`` and one ``reshape``; the log-decay becomes ``g = exp(log_decay)``; the output
goes back to the exit's layout, zero-padded to the blocks' length as the region computed it
(validation checks that the padded rows were zeros), and the final state to each of its uses'
layouts.
"""
import numpy as np
from tvm import relax

from scanweaver_core.scan_op import make_scan
from scanweaver_core.spec import MatrixScanSpec

from ...steps import tensor_dtype, tensor_shape

SCAN_ROLES = ("B", "H", "L")
STATE_ROLES = ("B", "H", "K", "V")


def _to_roles(bb, x, labels, roles, shape):
    """``x`` (dims named by ``labels``) permuted to ``roles`` order, reshaped to ``shape``."""
    present = [labels.index(r) for r in roles if r in labels]
    perm = present + [d for d in range(len(labels)) if d not in present]
    if perm != list(range(len(labels))):
        x = bb.emit(relax.op.permute_dims(x, perm))
    if tensor_shape(x) != tuple(shape):
        x = bb.emit(relax.op.reshape(x, shape))
    return x


def _from_roles(bb, o, roles, labels, shape):
    """The inverse: ``o`` in ``roles`` order to a tensor of ``shape`` named by ``labels`` (a
    role absent from ``labels`` has extent 1)."""
    kept = [r for r in labels if r is not None]
    absent = [r for r in roles if r not in kept]
    perm = [roles.index(r) for r in kept + absent]
    if perm != list(range(len(roles))):
        o = bb.emit(relax.op.permute_dims(o, perm))
    if tensor_shape(o) != tuple(shape):
        o = bb.emit(relax.op.reshape(o, shape))
    return o


def _cast(bb, x, dtype):
    return x if tensor_dtype(x) == dtype else bb.emit(relax.op.astype(x, dtype))


def emit_chunked(bb, match, visit):
    """Emit the scan of ``match``; ``[(old var, new expr)]`` for its output and final-state
    uses.  ``visit`` maps a var of the old function to the new one."""
    spec: MatrixScanSpec = match.spec
    shapes = spec.operand_shapes()

    def operand(op, inner, name):
        x = visit(op.source())
        if not isinstance(x, relax.Var):                 # a narrowed operand: bind it
            x = bb.emit(x)
        time = op.labels.index("L")
        if tensor_shape(x)[time] > spec.length:          # padded before it was scaled: its tail
            x = bb.emit(relax.op.strided_slice(x, [time], [0], [spec.length]))   # is not read
        return _to_roles(bb, x, op.labels, SCAN_ROLES + (inner,), shapes[name])

    args = [_cast(bb, operand(match.q, "K", "q"), spec.dtype), _cast(bb, operand(match.k, "K", "k"), spec.dtype),
            _cast(bb, operand(match.v, "V", "v"), spec.dtype)]
    if match.decay_values is not None:                  # a constant decay per head
        g = np.asarray(match.decay_values, dtype="float32").reshape(spec.g_shape)
        args.append(_cast(bb, relax.const(g, "float32"), spec.dtype))
    elif match.log_decay is not None:
        inner = "K" if spec.decay == "key" else "_"
        g = bb.emit(relax.op.exp(operand(match.log_decay, inner, "g")))
        args.append(_cast(bb, g, spec.dtype))
    if spec.has_h0:
        args.append(_cast(bb, _to_roles(bb, visit(match.h0.var), match.h0.labels, STATE_ROLES,
                                        spec.state_shape), "float32"))
    scan = bb.emit(make_scan(spec, args), "matrix_scan")
    o = bb.emit(relax.TupleGetItem(scan, 0)) if spec.return_last_state else scan
    if match.scale is not None:                         # a scale on the scores, per head
        c = np.asarray(match.scale, dtype="float32").reshape(1, -1, 1, 1)
        o = bb.emit(relax.op.multiply(o, _cast(bb, relax.const(c, "float32"), spec.dtype)))
    shape = list(tensor_shape(match.output))
    time = match.out_labels.index("L")
    shape[time] = spec.length
    y = _from_roles(bb, o, ("B", "H", "L", "V"), match.out_labels, shape)
    if match.padded > spec.length:
        width = [0] * (2 * len(shape))
        width[2 * time + 1] = match.padded - spec.length
        y = bb.emit(relax.op.nn.pad(y, width))
    out = [(match.output, _cast(bb, y, tensor_dtype(match.output)))]
    if spec.return_last_state:
        last = bb.emit(relax.TupleGetItem(scan, 1))
        for var, labels in match.final:
            s = _from_roles(bb, last, STATE_ROLES, labels, tensor_shape(var))
            out.append((var, _cast(bb, s, tensor_dtype(var))))
    return out
