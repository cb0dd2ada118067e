"""Matrix-state scans in whole-sequence form: ONNX ``Scan`` bodies and PyTorch's ``scan`` op.

Frontends that keep a loop a loop (``onnx_loops``, ``torch_frontend.convert_scan``) lift its
body to the whole sequence: a matrix state becomes one ``scanweaver.affine_scan`` whose input
``b`` is the outer product of whole-sequence factors, (B, H, L, K, V) in size, and whose stacked
states are read only by a contraction with a whole-sequence ``q``.  The same checks as the
per-step matcher (``matrix.py``), with time as one more dim of every tensor, turn that into one
``scanweaver.matrix_scan`` on the factors: the (B, H, L, K, V) tensors are then dead.
"""
from dataclasses import dataclass

import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec

from ...steps import tensor_dtype, tensor_shape
from .factors import Factor, input_and_decay, looks_outer
from .matrix import matrix_spec, readout_piece
from .matrix_layout import canonical, emit_matrix_scan, scan_to_stack, state_from_scan

READOUT_TRIES = 40      # bindings above the states tried as their readout


@dataclass
class LiftedMatch:
    scan: relax.Var         # the affine scan's binding
    spec: MatrixScanSpec
    roles: dict             # "B", "H", "L", "K", "V" -> a dim of the scan's b
    state_roles: dict       # the same over the state's dims (b's without L)
    q: Factor
    k: Factor
    v: list
    decay: object
    h0: object
    readout: relax.Var      # what the matrix scan's o replaces
    out_labels: tuple       # for each non-unit axis of ``readout``: a role's dim or "L"
    last: relax.Var         # the binding of the final state, or None
    state_shape: tuple      # the affine scan's state


def find_lifted(func, users, errors=()):
    """``[(scan var, LiftedMatch or reason)]`` for the affine scans of ``func`` over states of
    rank >= 2 per step (``users``: var -> the bindings using it; ``errors``: exceptions that
    make a scan a reason, not a failure)."""
    value_of = VarMap((b.var, b.value) for blk in func.body.blocks for b in blk.bindings)
    position = VarMap((v, i) for i, v in enumerate(value_of))
    found = []
    for var, value in value_of.items():
        parsed = parse_scan(value)
        if parsed is None or not isinstance(parsed[0], AffineScanSpec) or len(parsed[0].state_shape) < 2:
            continue
        if parsed[0].is_symbolic or "states" not in parsed[0].outputs:
            continue
        try:
            found.append((var, _match(var, *parsed, value_of, users, position)))
        except errors as err:
            found.append((var, f"the matrix matcher could not read it: {err}"))
    return found


def _match(var, spec, operands, value_of, users, position):
    axis, shape = spec.axis, spec.shape
    if not looks_outer(value_of, operands[1]):
        return "b is not a product of whole-sequence factors"
    states, last = var, None
    if len(spec.outputs) == 2:                       # (states, last): bound by TupleGetItems
        gets = {value_of[u].index: u for u in users.get(var, []) if isinstance(u, relax.Var)
                and isinstance(value_of.get(u), relax.TupleGetItem)}
        if len(gets) != len(users.get(var, [])) or 0 not in gets:
            return "the scan's outputs are used other than through their fields"
        states, last = gets[0], gets.get(1)
    labels = [d for d, n in enumerate(shape) if n != 1]
    rng = np.random.default_rng(17)
    readout = _readout(states, shape, labels, value_of, users, position, rng)
    if isinstance(readout, str):
        return readout
    piece, key, q_labels, r_labels = readout
    if key == axis:
        return "the readout contracts the time axis"
    a, b = operands[0], operands[1]
    found = input_and_decay(b, a, shape, spec.dtype, key, labels, value_of, rng,
                            lanes_from=[d for d in labels if d != axis])
    if isinstance(found, str):
        return found
    roles, k, others, decay = found
    roles["L"] = axis
    state_roles = {r: d - (d > axis) for r, d in roles.items() if r != "L"}
    out_labels = tuple("L" if d == axis else d for d in r_labels)

    q = Factor(piece.q, q_labels)
    matrix = matrix_spec(shape, roles, spec.length, q, k, others, decay,
                         decay is not None and axis in decay.labels, spec.reverse, spec.has_h0,
                         spec.dtype, last is not None)
    h0 = operands[2] if spec.has_h0 else None
    return LiftedMatch(var, matrix, roles, state_roles, q, k, others, decay, h0, piece.readout,
                       out_labels, last, spec.state_shape)


def _readout(states, shape, labels, value_of, users, position, rng):
    """``(piece, K dim, q's labels, readout's labels)`` for the lowest binding above
    ``states`` that contracts them with one other tensor and through which every use of them
    goes, or a reason."""
    start = position.get(states, -1)
    mark = VarMap([(states, 0)])
    tried = 0
    for r in list(value_of)[start + 1:]:
        if tried >= READOUT_TRIES:
            break
        if not _reads(value_of, r, states, position, start):
            continue
        tried += 1
        got = readout_piece(value_of, r, mark, position, start, shape, labels, rng)
        if got is None:
            continue
        piece, (key, q_labels, r_labels) = got
        if all(u in piece.region for u in users.get(states, [])):
            return piece, key, q_labels, r_labels
    return "the stacked states are not read only by a contraction with a per-step vector"


def _reads(value_of, v, states, position, start):
    """Does binding ``v`` depend on ``states``?"""
    memo, stack = VarMap(), [v]
    while stack:
        x = stack.pop()
        if x.same_as(states):
            return True
        if not isinstance(x, relax.Var) or position.get(x, -1) <= start or x in memo:
            continue
        memo[x] = True
        value = value_of.get(x)
        if isinstance(value, (relax.Call, relax.TupleGetItem)):
            stack.extend(y for y in relax.analysis.free_vars(value))
    return False


def emit_lifted(bb, match, visit):
    """Emit the matrix scan of ``match``; returns ``[(old var, new expr)]`` to replace."""
    factors = {"q": match.q, "k": match.k, "v": match.v, "decay": match.decay}
    h0 = visit(match.h0) if match.spec.has_h0 else None
    scan, out = emit_matrix_scan(
        bb, match.spec, match.roles, match.state_roles, factors, h0,
        lambda f, inner: canonical(bb, visit(f.expr), None, f.labels, match.roles, inner))
    replaced = [(match.readout, scan_to_stack(bb, out, match.roles, match.out_labels,
                                              tensor_shape(match.readout), tensor_dtype(match.readout)))]
    if match.last is not None:
        replaced.append((match.last, state_from_scan(bb, bb.emit(relax.TupleGetItem(scan, 1)),
                                                     match.state_roles, match.state_shape)))
    return replaced
