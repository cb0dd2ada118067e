"""Recognize Mamba's selective scan on top of an affine chain found in the graph.

``selective_scan_ref`` exports as an affine chain over (B, D, N) states whose coefficients are
slices of ``exp(delta*A)`` and ``delta*B*u`` (two (B, D, L, N) tensors), read out each step by
``einsum('bdn,bn->bd', h, C_t)`` and stacked.  When every piece checks out, the chain, the two
(B, D, L, N) tensors and the readouts become ONE ``scanweaver.selective_scan`` on the original
``u, delta, A, B, C``.  The coefficient tensors and the readout are checked by evaluating them
with numpy on probe inputs (``npeval``), so it does not matter how the frontend spelled the
einsums: broadcast ``multiply``s of views (PyTorch) or ``relax.einsum`` (ONNX) alike.
Anything unexpected returns a reason, and the chain stays a plain affine scan.
"""
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.spec import SelectiveScanSpec

from .npeval import SUPPORTED, evaluate, inputs, multiply_factors, viewed_tensor
from .steps import op_name, tensor_dtype, tensor_shape


@dataclass
class SelectiveMatch:
    spec: SelectiveScanSpec
    operands: list          # u, delta, A, B, C, [h0]
    output: relax.Var       # the concat of the per-step readouts: becomes the scan's y
    readouts: set           # bindings of the readout subgraphs (consumed)
    last_users: bool        # the final state is used elsewhere (return it too)


def _factors(value_of, expr):
    """The operands of the product ``expr``: the leaves of a ``multiply`` tree or the operands of
    an ``einsum``; [] for anything else.  (What they are multiplied into is checked by
    ``_computes``.)"""
    call = value_of.get(expr) if isinstance(expr, relax.Var) else None
    if op_name(call) == "relax.multiply":
        return multiply_factors(value_of, expr)
    if op_name(call) == "relax.einsum":
        return inputs(call)
    return []


def _computes(value_of, expr, operands, equation):
    """Does ``expr`` equal ``np.einsum(equation, *operands)``, shape included?  Checked by
    evaluating it (supported ops only, down to ``operands``) on random operands; an operand that
    is a constant keeps its value, as it will in the scan."""
    rng = np.random.default_rng(1)
    values = [o.value.numpy().astype(np.float64) if isinstance(o, tvm.ir.GenericConst)
              else rng.standard_normal(tensor_shape(o)) for o in operands]
    got = evaluate(value_of, expr, {o: v for o, v in zip(operands, values) if isinstance(o, relax.Var)})
    try:
        want = np.einsum(equation, *values)
    except ValueError:          # operands of other shapes than the equation's: not this form
        return False
    return got is not None and got.shape == want.shape and np.allclose(got, want, rtol=1e-5, atol=0)


def _readout(value_of, y, state, time):
    """If ``y`` is computed from ``state`` and one slice ``C[:, :, time]`` by supported ops,
    return (C, bindings of the subgraph); else None."""
    bindings, leaves, stack = set(), {}, [y]
    while stack:
        v = stack.pop()
        if v.same_as(state) or v in bindings or not isinstance(v, relax.Var):
            continue
        call = value_of.get(v)
        name = op_name(call)
        if name == "relax.take":
            idx = call.args[1]
            leaves[v] = (call.args[0], int(call.attrs.axis), idx)
            bindings.add(v)
            continue
        if name not in SUPPORTED:
            return None
        bindings.add(v)
        stack.extend(a for a in inputs(call) if isinstance(a, relax.Var))
    if len(leaves) != 1:
        return None
    (c_slice, (c, axis, idx)), = leaves.items()
    t = idx.value.numpy().item() if hasattr(idx, "value") else None
    if axis != 2 or t != time or tensor_shape(c) is None or len(tensor_shape(c)) != 3:
        return None
    return c, c_slice, bindings


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
    if rec.reverse or len(rec.state_shape) != 3 or rec.axis != 2:
        return "not a forward scan over (B, D, N) states stacked at axis 2"
    batch, dim, dstate = rec.state_shape
    length = rec.length
    slice_a, slice_b = value_of.get(rec.a), value_of.get(rec.b)
    if op_name(slice_a) != "relax.take" or op_name(slice_b) != "relax.take":
        return "coefficients are not slices of (B, D, L, N) tensors"
    decay = value_of.get(slice_a.args[0])
    factors = _factors(value_of, decay.args[0]) if op_name(decay) == "relax.exp" else []
    if len(factors) != 2:
        return "a_t is not a slice of exp(delta * A)"
    bdl, dn, bnl = (batch, dim, length), (dim, dstate), (batch, dstate, length)
    bases = {tensor_shape(b): b for x in factors for b in [viewed_tensor(value_of, x, (bdl, dn))] if b is not None}
    if set(bases) != {bdl, dn}:
        return "exp() argument is not delta (B, D, L) times A (D, N)"
    delta, A = bases[bdl], bases[dn]
    if not _computes(value_of, decay.args[0], [delta, A], "bdl,dn->bdln"):
        return "delta or A is not broadcast as delta[b, d, l] * A[d, n]"
    factors = _factors(value_of, slice_b.args[0])
    by_base = {}
    for f in factors:
        by_base.setdefault(viewed_tensor(value_of, f, (bdl, bnl)), []).append(f)
    others = [b for b in by_base if b is not None and not b.same_as(delta)]
    if len(factors) != 3 or delta not in by_base or len(others) != 2 or None in by_base:
        return "b_t is not a slice of delta * B * u"
    # which of the two is B and which u: by shape, and numerically when D == N makes them alike
    B, u = next(((B, u) for B, u in (others, others[::-1])
                 if tensor_shape(B) == bnl and tensor_shape(u) == bdl
                 and _computes(value_of, slice_b.args[0], [delta, B, u], "bdl,bnl,bdl->bdln")), (None, None))
    if B is None:
        return "b_t is not delta[b, d, l] * B[b, n, l] * u[b, d, l]"
    return _match_readout(rec, value_of, users, [u, delta, A, B])


def _match_readout(rec, value_of, users, operands):
    batch, dim, dstate = rec.state_shape
    concats = [v for v, call in value_of.items() if op_name(call) == "relax.concat"
               and tensor_shape(v) == (batch, dim, rec.length) and int(call.attrs.axis) == 2]
    rng = np.random.default_rng(0)
    for cat in concats:
        fields = value_of[cat].args[0].fields
        ys = [value_of[f].args[0] if op_name(value_of.get(f)) == "relax.expand_dims" else None for f in fields]
        if len(ys) != len(rec.states) or any(y is None for y in ys):
            continue
        readouts, c_base = set(fields), None
        for y, h, t in zip(ys, rec.states, rec.indices):
            found = _readout(value_of, y, h, t)
            if found is None:
                break
            c, c_slice, bindings = found
            if c_base is not None and not c.same_as(c_base):
                break
            c_base = c
            hv, cv = rng.standard_normal(rec.state_shape), rng.standard_normal((batch, dstate))
            got = evaluate(value_of, y, {h: hv, c_slice: cv})
            want = np.einsum("bdn,bn->bd", hv, cv)
            if got is None or got.shape != want.shape or not np.allclose(got, want):
                break
            readouts |= bindings
        else:
            if tensor_shape(c_base) != (batch, dstate, rec.length):
                continue
            internal = readouts | rec.internal
            stray = [s for s in rec.states[:-1] if any(u not in internal for u in users.get(s, []))]
            if stray:
                return f"state {stray[0].name} is used outside the readout"
            last_users = any(u not in internal for u in users.get(rec.states[-1], []))
            if str(tensor_dtype(operands[2])) != "float32":
                return "A is not float32"
            output, skip, gate = _epilogue(value_of, users, cat, operands[0])
            raw, bias = _softplus_of_biased(value_of, operands[1])
            if raw is not None:
                operands = [operands[0], raw] + operands[2:]
            spec = SelectiveScanSpec(batch, dim, rec.length, dstate, has_D=skip is not None,
                                     has_z=gate is not None, has_delta_bias=bias is not None,
                                     delta_softplus=raw is not None, has_h0=rec.initial is not None,
                                     dtype=rec.dtype, return_last_state=last_users)
            ops = operands + [c_base] + [x for x in (skip, gate, bias, rec.initial) if x is not None]
            return SelectiveMatch(spec, ops, output, readouts, last_users)
    return "no concat of per-step einsum('bdn,bn->bd', h, C_t) readouts"
