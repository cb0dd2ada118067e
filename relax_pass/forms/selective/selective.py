"""Recognize Mamba's selective scan in an accepted affine chain, by what it computes.

Mamba's loop (``selective_scan_ref``, Hugging Face's ``mamba_selective_scan``, mamba-minimal)
runs an affine chain over (B, D, N) states with ``a_t = exp(delta_t * A)`` and
``b_t = delta_t * B_t * u_t``, read out each step as ``y_t = sum_n h_t C_t`` and stacked.  When
every piece checks out, the chain, its (B, D, L, N) coefficient tensors and the readouts become
ONE ``scanweaver.selective_scan`` on ``u, delta, A, B, C`` (plus the ``D`` skip, the ``silu(z)``
gate and ``softplus(delta + bias)`` when they follow).

The pieces are found by meaning, not by spelling (``operands.py``): ``delta``, ``A``, ``u``,
``B`` are the nearest tensors below a step's coefficients with the extents of (B, D, L), (D, N),
(B, N, L) up to order and unit dims; each choice and axis order is accepted only if evaluating
the coefficient on random values of those tensors (``interpret.py``) gives exactly the einsum
above.  So broadcasts,
einsums, casts, per-step slices of whole-sequence tensors or coefficients computed per step,
and B/C in (B, L, N) or (B, N, L) layout all read the same.  The readout is checked the same
way on random ``h_t`` and ``C_t``, whatever ops (``matmul``, ``einsum``, ``(h*C).sum(-1)``)
and stack axis spell it.  Anything else returns a reason, and the chain stays an affine scan.
"""
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap
from scanweaver_core.spec import SelectiveScanSpec

from ...npeval import SUPPORTED, evaluate, inputs
from ...operands import agrees, choose, layouts_of_shape, operands_of, probe
from ...steps import _step_slice, op_name, tensor_dtype, tensor_shape

READOUT_BUDGET = 80      # bindings walked from a stacked readout back to its state


@dataclass
class SelectiveMatch:
    spec: SelectiveScanSpec
    operands: list          # (expr, axes to permute it by or None, the spec's shape for it, dtype)
    output: relax.Var       # what the scan's y replaces: the stacked readouts, or their epilogue
    out_axes: object        # axes putting y (B, D, L) into ``output``'s layout, or None
    out_dtype: str
    readouts: set           # bindings of the readout subgraphs (consumed)
    last_users: bool        # the final state is used elsewhere (return it too)
    emit_at: relax.Var      # the binding before which the scan is emitted


def _decay(c, t):
    return np.exp(c["delta"][:, :, t, None] * c["A"][None])


def _input(c, t):
    return c["delta"][:, :, t, None] * c["B"][:, None, :, t] * c["u"][:, :, t, None]


def _step_of(rec, expr):
    """The time index the per-step coefficient ``expr`` reads."""
    index = rec.analysis.template(expr).index
    return index if isinstance(index, int) else None


def _only_user(users, var):
    found = users.get(var, [])
    return found[0] if len(found) == 1 and isinstance(found[0], relax.Var) else None


def _leaves(value_of, expr, shape, through=SUPPORTED):
    """Variables (and constants) of ``shape`` that ``expr`` reads through the ops ``through``."""
    found, stack, seen = [], [expr], set()
    while stack:
        v = stack.pop()
        if isinstance(v, relax.Var):
            if v in seen:
                continue
            seen.add(v)
        if tensor_shape(v) == shape and (not isinstance(v, relax.Var) or op_name(value_of.get(v)) not in through):
            found.append(v)
            continue
        if isinstance(v, relax.Var):
            call = value_of.get(v)
            if op_name(call) in through:
                stack.extend(inputs(call))
    return found


# what softplus(raw + bias) is spelled with (PyTorch's threshold form, ONNX's Softplus)
SOFTPLUS_OPS = ("relax.where", "relax.greater", "relax.log", "relax.exp", "relax.add",
                "relax.nn.softplus", "relax.expand_dims", "relax.reshape")


def _softplus_of_biased(value_of, delta):
    """``(raw, bias)`` when ``delta = softplus(raw + bias[:, None])`` (Mamba's ``delta_softplus``
    with ``delta_bias``; any spelling of softplus, checked numerically across its threshold),
    so the scan applies it on the fly; else ``(None, None)``."""
    shape = tensor_shape(delta)
    raw = _leaves(value_of, delta, shape, SOFTPLUS_OPS)
    bias = [x for x in _leaves(value_of, delta, (shape[1],), SOFTPLUS_OPS) if str(tensor_dtype(x)) == "float32"]
    if len(raw) != 1 or len(bias) != 1 or not isinstance(raw[0], relax.Var) or raw[0].same_as(delta):
        return None, None
    rng = np.random.default_rng(3)
    rv = rng.standard_normal(shape) * 15.0           # both sides of softplus's linear threshold
    bv = bias[0].value.numpy().astype(np.float64) if isinstance(bias[0], tvm.ir.GenericConst) \
        else rng.standard_normal(shape[1])
    env = {raw[0]: rv} if not isinstance(bias[0], relax.Var) else {raw[0]: rv, bias[0]: bv}
    got = evaluate(value_of, delta, env)
    want = np.logaddexp(0.0, rv + bv[None, :, None])
    if got is None or got.shape != shape or not np.allclose(got, want, rtol=1e-6, atol=1e-6):
        return None, None
    return raw[0], bias[0]


def _epilogue(value_of, users, y, u):
    """Fold Mamba's ``out = (y + u*D) * silu(z)`` into the scan when it follows ``y``:
    returns (the var that becomes the scan's output, D or None, z or None)."""
    bdl = tensor_shape(y)
    output, skip, gate = y, None, None
    add = _only_user(users, y)
    if op_name(value_of.get(add)) == "relax.add":
        other = next((x for x in value_of[add].args if not x.same_as(y)), None)
        d = [x for x in _leaves(value_of, other, (bdl[1],)) if str(tensor_dtype(x)) == "float32"]
        if len(d) == 1 and _computes(value_of, other, [u, d[0]], "bdl,d->bdl"):
            output, skip = add, d[0]
    mul = _only_user(users, output)
    if op_name(value_of.get(mul)) == "relax.multiply":
        other = next((x for x in value_of[mul].args if not x.same_as(output)), None)
        z = _leaves(value_of, other, bdl) if other is not None else []
        if len(z) == 1 and isinstance(z[0], relax.Var):
            zv = np.random.default_rng(2).standard_normal(bdl)
            got = evaluate(value_of, other, {z[0]: zv})
            if got is not None and got.shape == bdl and np.allclose(got, zv / (1.0 + np.exp(-zv))):
                output, gate = mul, z[0]
    return output, skip, gate


def match_selective(rec, value_of, users):
    """A ``SelectiveMatch`` for an accepted affine ``rec``, or a string saying why not."""
    if rec.reverse or len(rec.state_shape) != 3:
        return "not a forward scan over (B, D, N) states"
    if rec.a is None or rec.b is None:
        return "the chain has no decay a_t"
    value_of = value_of if isinstance(value_of, VarMap) else VarMap(value_of.items())
    batch, dim, dstate = rec.state_shape
    bdl, dn, bnl = (batch, dim, rec.length), (dim, dstate), (batch, dstate, rec.length)
    t = _step_of(rec, rec.a)
    if t is None or _step_of(rec, rec.b) != t:
        return "a_t and b_t do not read one time step"
    decay = choose(value_of, rec.a, {"delta": bdl, "A": dn}, _decay, t)
    if decay is None:
        return "a_t is not exp(delta_t * A) for a (B, D, L) delta and a (D, N) A"
    step_input = choose(value_of, rec.b, {"delta": bdl, "u": bdl, "B": bnl}, _input, t,
                           fixed={"delta": decay["delta"]})
    if step_input is None:
        return "b_t is not delta_t * B_t * u_t for (B, D, L) u and a (B, N, L) B"
    found = {**decay, **step_input}
    if str(tensor_dtype(found["A"][0])) != "float32":
        return "A is not float32"
    return _match_readout(rec, value_of, users, found)


def _readout_piece(value_of, field, states):
    """``(state, slice var, slice key, t, bindings)`` when ``field`` is computed from one of
    ``states`` and one per-step slice only (constants aside), else None."""
    bindings, found_state, found_slice, stack = set(), None, None, [field]
    while stack:
        v = stack.pop()
        if not isinstance(v, relax.Var) or v in bindings:
            continue
        state = states.get(v)
        if state is not None:
            if found_state is not None and not found_state.same_as(v):
                return None
            found_state = v
            continue
        value = value_of.get(v)
        if value is None or len(bindings) > READOUT_BUDGET:
            return None                              # a parameter: not a readout of h and C_t
        step = _step_slice(value_of, value)
        if step is not None:
            if found_slice is not None and not found_slice[0].same_as(v):
                return None
            found_slice = (v, *step)
            continue
        if not isinstance(value, (relax.Call, relax.TupleGetItem)):
            return None
        bindings.add(v)
        stack.extend(operands_of(value))
    if found_state is None or found_slice is None:
        return None
    return (found_state, *found_slice, bindings)


def _c_layout(value_of, field, piece, state_shape, rng):
    """The axes putting C (the tensor ``piece`` slices) in (B, N, L) order (a reshape then
    gives that shape) when the stack field ``field`` is ``einsum('bdn,bn->bd', h_t, C_t)``
    (maybe with a unit dim; checked on random ``h_t``, ``C_t``), else None."""
    h, c_slice, key, _, _ = piece
    c, c_axis, keep = key[1].node, key[2], len(key) > 3
    batch, _, dstate = state_shape
    hv, cv = rng.uniform(-1, 1, state_shape), rng.uniform(-1, 1, tensor_shape(c_slice))
    c_step = np.squeeze(cv, c_axis) if keep else cv        # C_t's dims: C's, time removed
    rest = [a for a in range(len(tensor_shape(c))) if a != c_axis]
    wanted = sum(n != 1 for n in (batch, dstate))
    if tensor_shape(field) is None or int(np.prod(tensor_shape(field))) != batch * state_shape[1]:
        return None
    for p in layouts_of_shape(c_step.shape, (batch, dstate)):
        c_bn = np.transpose(c_step, p).reshape(batch, dstate)
        want = np.einsum("bdn,bn->bd", hv, c_bn).reshape(tensor_shape(field))
        if agrees(value_of, field, {h: hv, c_slice: cv}, want):
            return [rest[i] for i in p[:wanted]] + [c_axis] + [rest[i] for i in p[wanted:]]
    return None


def _stacked_readouts(rec, value_of, users):
    """``(stacked var, stack axis, C, C's axes, consumed bindings)`` for the stack of one
    readout of each state in time order (a ``concat`` of unit-dim pieces, or of the pieces
    themselves followed by a ``reshape``: PyTorch's ``stack`` exports both ways), or a string
    saying why there is none."""
    batch, dim, _ = rec.state_shape
    states = VarMap(zip(rec.states, rec.indices))
    rng = np.random.default_rng(0)
    why = "no stack of per-step readouts sum_n h_t[b, d, n] * C_t[b, n]"
    for cat, call in value_of.items():
        if op_name(call) != "relax.concat" or not isinstance(call.args[0], relax.Tuple):
            continue
        fields = list(call.args[0].fields)
        stacked, axis = _stack_of(value_of, users, cat, (batch, dim), rec.length)
        if stacked is None or len(fields) != len(rec.states):
            continue
        pieces = [_readout_piece(value_of, f, states) for f in fields]
        if any(p is None for p in pieces) or len({hash(p[2][1]) for p in pieces}) != 1:
            continue
        times = [states[p[0]] for p in pieces]
        if times != sorted(times) or any(p[3] != t for p, t in zip(pieces, times)):
            why = f"the readouts in {cat.name} are not stacked in time order, each with its own C_t"
            continue
        c_axes = _c_layout(value_of, fields[0], pieces[0], rec.state_shape, rng)
        if c_axes is None:
            why = f"the readouts in {cat.name} are not sum_n h_t[b, d, n] * C_t[b, n]"
            continue
        consumed = set(fields).union(*(p[4] for p in pieces)) | {cat}
        return stacked, axis, pieces[0][2][1].node, c_axes, consumed
    return why


def _stack_of(value_of, users, cat, piece, length):
    """``(var, axis)``: the (B, D, L)-like stack ``cat`` makes of ``length`` ``piece``-sized
    readouts, time at ``axis``; ``(None, None)`` when it is not one."""
    shape, call = tensor_shape(cat), value_of[cat]
    if shape is None or len(shape) not in (2, 3):
        return None, None
    axis = int(call.attrs.axis) % len(shape)
    if len(shape) == 3:                     # concat of expand_dims(y_t, axis)
        if shape[axis] == length and shape[:axis] + shape[axis + 1:] == piece:
            return cat, axis
        return None, None
    found = users.get(cat, [])              # concat of y_t along axis, then a reshape
    stacked = list(piece)
    stacked.insert(axis, length)
    if len(found) == 1 and isinstance(found[0], relax.Var) and \
            op_name(value_of.get(found[0])) == "relax.reshape" and tensor_shape(found[0]) == tuple(stacked):
        return found[0], axis
    return None, None


def _axes_or_none(axes):
    return None if list(axes) == list(range(len(axes))) else list(axes)


def _permutation(x, axes):
    """``axes`` (from ``layouts``), or None when transposing by them moves only unit dims
    (a reshape alone then does it)."""
    shape = tensor_shape(x)
    moved = [a for a in axes if shape[a] != 1]
    return None if moved == sorted(moved) else list(axes)


def _as_is(x, axes, sizes):
    """``x`` is already in the layout ``sizes`` (``axes`` from ``layouts``)."""
    return _permutation(x, axes) is None and tensor_shape(x) == tuple(sizes)


def _match_readout(rec, value_of, users, found):
    stack = _stacked_readouts(rec, value_of, users)
    if isinstance(stack, str):
        return stack
    cat, axis, c, c_axes, readouts = stack
    internal = readouts | rec.internal
    stray = [s for s in rec.states[:-1] if any(u not in internal for u in users.get(s, []))]
    if stray:
        return f"state {stray[0].name} is used outside the readout"
    last_users = any(u not in internal for u in users.get(rec.states[-1], []))
    batch, dim, dstate = rec.state_shape
    bdl, bnl = (batch, dim, rec.length), (batch, dstate, rec.length)
    (u, u_axes), (delta, delta_axes) = found["u"], found["delta"]
    output, skip, gate, raw, bias = cat, None, None, None, None
    if axis == 2 and _as_is(u, u_axes, bdl):                    # y in u's (B, D, L) layout
        output, skip, gate = _epilogue(value_of, users, cat, u)
    if _as_is(delta, delta_axes, bdl):
        raw, bias = _softplus_of_biased(value_of, delta)
    spec = SelectiveScanSpec(batch, dim, rec.length, dstate, has_D=skip is not None,
                             has_z=gate is not None, has_delta_bias=bias is not None,
                             delta_softplus=raw is not None, has_h0=rec.initial is not None,
                             dtype=rec.dtype, return_last_state=last_users)
    dt, f32 = rec.dtype, "float32"
    operands = [(u, u_axes, bdl, dt),
                (raw, None, None, dt) if raw is not None else (delta, delta_axes, bdl, dt),
                (*found["A"], (dim, dstate), f32), (*found["B"], bnl, dt), (c, c_axes, bnl, dt)]
    operands += [(x, None, None, d) for x, d in ((skip, f32), (gate, dt), (bias, f32), (rec.initial, dt))
                 if x is not None]
    operands = [(x, None if p is None else _permutation(x, p), shape, d) for x, p, shape, d in operands]
    out_axes = [0, 1]
    out_axes.insert(axis, 2)
    emit_at = _emit_point(rec, value_of, [op[0] for op in operands], output, last_users)
    if emit_at is None:
        return "an operand of the scan is computed after the loop that uses the final state"
    return SelectiveMatch(spec, operands, output, _axes_or_none(out_axes), str(tensor_dtype(output)),
                          readouts, last_users, emit_at)


def _emit_point(rec, value_of, operands, output, last_users):
    """Where the scan can be emitted: at the chain's first state when every operand is bound
    before it, else (when nothing uses the final state) at the output it replaces."""
    position = VarMap((v, i) for i, v in enumerate(value_of))
    first = position.get(rec.states[0], -1)
    if all(position.get(x, -1) < first for x in operands if isinstance(x, relax.Var)):
        return rec.states[0]
    return None if last_users else output


def _computes(value_of, expr, operands, equation):
    """Does ``expr`` equal ``np.einsum(equation, *operands)`` on random operands?"""
    rng = np.random.default_rng(1)
    values = {x: probe(x, rng) for x in operands}
    try:
        want = np.einsum(equation, *values.values())
    except ValueError:
        return False
    return agrees(value_of, expr, values, want)
