"""Recognize a matrix-state recurrence in an accepted affine chain, by what it computes.

Gated linear attention, retention, linear attention and Mamba-2 written as per-step loops
keep one (K, V) state per (batch, head), ``S = g_t * S + k_t v_t^T``, read out each step as
``o_t = q_t^T S`` and stacked.  The chain finder sees an affine chain over the state; lifted as
it is, its input ``b_t`` would become a (B, H, L, K, V) tensor: the memory these layers exist to
avoid.  This matcher finds, by evaluating the step's pieces on random values (``interpret.py``):

- the readout: one state and one other per-step value ``q_t`` per stacked piece, equal to a
  contraction of the state over one of its dims (that dim is K; ``einsum``, ``matmul``,
  ``(q[..., None] * S).sum(-2)`` all read the same), the rest of the state's dims kept;
- the input: ``b_t`` as a product (``multiply`` of views, ``einsum`` or ``matmul`` with nothing
  contracted) of factors, exactly one over K (``k_t``), the others not (``v_t`` and per-head
  scales such as Mamba-2's ``dt``, multiplied into v);
- the decay ``a_t``: over the lanes only, or also over K or over V (not both).

Each factor is then lifted to the whole sequence (``lift.py``) and put in the scan's
(B, H, L, .) layout; the state's last non-contracted dim is V, the others are the lanes
(batch, head).  Anything else returns a reason, and the chain stays an affine scan.
"""
import itertools
import string
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap
from scanweaver_core.spec import MatrixScanSpec

from ...narrow import expr_shape, narrowed, non_unit
from ...operands import evaluate_from, operands_of, widening
from .stacks import stack_sources
from ...steps import ONE, op_name, tensor_shape

READOUT_BUDGET = 80     # bindings of one readout piece
ASSIGNMENTS = 4096      # label assignments tried for one product's factors
_VIEWS = ("relax.expand_dims", "relax.squeeze", "relax.reshape", "relax.broadcast_to",
          "relax.permute_dims")


@dataclass
class Factor:
    """A per-step (or invariant) value of the step: ``expr`` and, for each of its non-unit
    axes in order, the state dim it runs along."""
    expr: object
    labels: tuple


@dataclass
class MatrixMatch:
    spec: MatrixScanSpec
    roles: dict             # "B" / "H" / "K" / "V" -> state dim (B and H may be absent)
    q: Factor
    k: Factor
    v: list                 # factors multiplied into v (v_t itself, scales)
    decay: object           # Factor or None
    output: relax.Var       # the stacked readouts the scan's o replaces (None: each readout)
    out_labels: tuple       # for each non-unit axis of ``output``: a state dim, or "L"
    readouts: set           # bindings of the readout pieces (consumed)
    last_users: bool        # the final state is used elsewhere (return it too)
    readout_vars: list      # (each step's q_t^T S_t, its time index), in time order
    readout_labels: tuple   # for each non-unit axis of one readout: a state dim
    epilogue: tuple = None  # (first piece, stack axis) when each piece computes more from its
    #                         readout (a skip term, a gate): lifted, it replaces ``output``


def match_matrix(rec, value_of, users):
    """A ``MatrixMatch`` for an accepted affine ``rec``, or a string saying why not."""
    shape = rec.state_shape
    labels = [d for d, n in enumerate(shape) if n != 1]
    if len(shape) < 2 or len(labels) < 2:
        return "the state is not a matrix per lane"
    value_of = value_of if isinstance(value_of, VarMap) else VarMap(value_of.items())
    if not looks_outer(value_of, rec.b):
        return "b_t is not a product of per-step factors"
    rng = np.random.default_rng(11)
    readout = _readouts(rec, value_of, users, labels, rng)
    if isinstance(readout, str):
        return readout
    found = input_and_decay(rec.b, rec.a, shape, rec.dtype, readout.key, labels, value_of, rng)
    if isinstance(found, str):
        return found
    roles, k, others, decay = found
    consumed = readout.consumed
    stray = [s for s in rec.states[:-1] if any(u not in rec.internal and u not in consumed
                                                for u in users.get(s, []))]
    if stray:
        return f"state {stray[0].name} is used outside the readout"
    last_users = any(u not in rec.internal and u not in consumed for u in users.get(rec.states[-1], []))
    per_step = decay is not None and rec.analysis.template(decay.expr).index is not None
    spec = matrix_spec(rec.state_shape, roles, rec.length, readout.q, k, others, decay, per_step,
                       rec.reverse, rec.initial is not None, rec.dtype, last_users)
    return MatrixMatch(spec, roles, readout.q, k, others, decay, readout.output, readout.out_labels,
                       consumed, last_users, readout.readout_vars, readout.readout_labels,
                       readout.epilogue)


def input_and_decay(b, a, shape, dtype, key, labels, value_of, rng, lanes_from=None):
    """``(roles, k Factor, other factors, decay Factor or None)`` of a step ``S = a*S + b``
    over a state of ``shape`` whose readout contracts dim ``key``, or a reason.  The last
    non-unit dim other than K is V, the rest are lanes (``lanes_from``: the dims that may
    be lanes, default all)."""
    rest = [d for d in labels if d != key and (lanes_from is None or d in lanes_from)]
    if not rest:
        return "the state has no dim besides the contracted one: not a matrix per lane"
    value_dim, lanes = rest[-1], rest[:-1]
    if len(lanes) > 2:
        return f"the state has {len(lanes)} lane dims besides K and V (at most 2: batch, head)"
    roles = {"K": key, "V": value_dim, **dict(zip(("B", "H"), lanes))}
    product = _product(b, shape, dtype, value_of, labels, rng)
    if isinstance(product, str):
        return product
    keyed = [f for f in product if key in f.labels]
    if len(keyed) != 1 or value_dim in keyed[0].labels:
        return "b_t is not an outer product k_t v_t^T of a key vector and a value vector"
    others = [f for f in product if f is not keyed[0]]
    if not any(value_dim in f.labels for f in others):
        return "b_t has no factor over the value dim"
    decay = _decay(a, shape, roles, value_of)
    if isinstance(decay, str):
        return decay
    return roles, keyed[0], others, decay


# -- the readout ---------------------------------------------------------------------------------
@dataclass
class Piece:
    """One step's readout inside a stacked piece: ``readout = q_t^T state`` (``region``: its
    bindings), under what the piece computes from it (``readout is field``: nothing)."""
    state: relax.Var
    readout: relax.Var
    q: object
    region: set


class Readouts(NamedTuple):
    """A stack of one piece per state in time order, each computing ``q_t^T S_t`` (and maybe
    more from it: a skip term, a gate, a normalizer)."""
    output: object          # the stacked var (the scan's output replaces it), or None
    out_labels: tuple       # its labels (None without it)
    key: int                # the state dim the readout contracts (K)
    q: Factor
    consumed: set           # the bindings the pieces are made of
    readout_vars: list      # (each step's q_t^T S_t, its time index)
    readout_labels: tuple   # for each non-unit axis of one readout: a state dim
    epilogue: tuple         # (first piece, stack axis) when each piece computes more, else None


def _readouts(rec, value_of, users, labels, rng):
    """The ``Readouts`` of ``rec``'s states, or a reason.  The stacked var is set when the
    pieces are the readouts themselves, or compute the same thing from each."""
    states = VarMap(zip(rec.states, rec.indices))
    position = rec.analysis.positions()
    start = position.get(rec.states[0], -1)
    why = "no stack of per-step readouts q_t^T S_t (a contraction of the state with a per-step vector)"
    for where, fields, stack in stack_sources(value_of, users, rec.length):
        if len(fields) != len(rec.states) or not all(isinstance(f, relax.Var) for f in fields):
            continue
        first = readout_piece(value_of, fields[0], states, position, start, rec.state_shape, labels, rng)
        if first is None:
            if _reads_previous_states(value_of, fields, rec.states, position, start):
                why = _READ_BEFORE.format(where.name)
            continue
        piece, (key, q_labels, r_labels) = first
        pieces = [piece] + [readout_piece(value_of, f, states, position, start, like=piece) for f in fields[1:]]
        if any(p is None for p in pieces):
            why = f"the pieces stacked in {where.name} do not each read one state the same way"
            continue
        times = [states[p.state] for p in pieces]
        keys = {rec.analysis.template(p.q).key for p in pieces}
        if times != sorted(times) or len(keys) != 1 or \
                any(rec.analysis.template(p.q).index != t for p, t in zip(pieces, times)):
            why = (f"the readouts in {where.name} are not stacked in time order, each reading its "
                   "own step's q_t and state")
            continue
        consumed = set().union(*(p.region for p in pieces))
        readouts = [(p.readout, t) for p, t in zip(pieces, times)]
        pure = all(p.readout.same_as(f) for p, f in zip(pieces, fields))
        stacked = stack(fields) if pure or _same_epilogues(rec.analysis, value_of, fields, pieces, times) else None
        out_labels, var, epilogue = None, None, None
        if stacked is not None:
            var, time_axis, region = stacked
            out_labels = list(r_labels)
            out_labels.insert(_non_unit_rank(tensor_shape(var)[:time_axis]), "L")
            out_labels = tuple(out_labels)
            consumed |= set(fields) | region
            epilogue = None if pure else (fields[0], time_axis)
        return Readouts(var, out_labels, key, Factor(pieces[0].q, q_labels), consumed, readouts,
                        r_labels, epilogue)
    for where, fields, _ in stack_sources(value_of, users, rec.length + 1):   # (the last update unread)
        if all(isinstance(f, relax.Var) for f in fields) and \
                _reads_previous_states(value_of, fields, rec.states, position, start):
            return _READ_BEFORE.format(where.name)
    return why


_READ_BEFORE = ("the pieces stacked in {} read the state before each step's update (o_t from "
                "S_(t-1), as RWKV's bonus form o_t = q_t (S_(t-1) + u k_t v_t^T) does): not a matrix "
                "scan's o_t = q_t^T S_t; left an affine scan")


def _reads_previous_states(value_of, fields, states, position, start):
    """Each stacked piece but the first reads the state of the step before its own (and not
    its own): a readout before the update."""
    if len(fields) < 2:
        return False
    reads = [_states_read(value_of, f, states, position, start) for f in fields]
    return not reads[0] and all(r == {i - 1} for i, r in enumerate(reads) if i > 0)


def _states_read(value_of, x, states, position, start):
    """The indices (in ``states``) of the states ``x`` depends on."""
    index = VarMap((s, i) for i, s in enumerate(states))
    found, stack, seen = set(), [x], VarMap()
    while stack:
        v = stack.pop()
        if not isinstance(v, relax.Var) or v in seen:
            continue
        seen[v] = True
        if v in index:
            found.add(index[v])
            continue
        if position.get(v, -1) <= start or v not in value_of or len(seen) > 4 * READOUT_BUDGET:
            continue
        stack.extend(operands_of(value_of[v]))
    return found


def _same_epilogues(an, value_of, fields, pieces, times):
    """Each piece computes the same thing from its readout (``field = E(readout, x_t)``), one
    step apart: the ops between readout and field agree, and what else they read has equal
    templates at the piece's own step (or none): so ``E`` lifts to the whole sequence."""
    shapes = []
    for f, p, t in zip(fields, pieces, times):
        ops, others, reach = [], [], VarMap()

        def reaches(v, p=p, reach=reach):
            if v.same_as(p.readout):
                return True
            if not isinstance(v, relax.Var) or v not in value_of:
                return False
            if v not in reach:
                reach[v] = False
                reach[v] = any([reaches(a) for a in operands_of(value_of[v])])
            return reach[v]

        stack, seen = [f], set()
        while stack:
            v = stack.pop()
            if v.same_as(p.readout) or v in seen:
                continue
            seen.add(v)
            ops.append(op_name(value_of[v]))
            for a in operands_of(value_of[v]):
                if reaches(a):
                    stack.append(a)
                else:
                    tpl = an.template(a)
                    if tpl.index not in (None, t):
                        return False
                    others.append(tpl.key)
        if len(seen) > READOUT_BUDGET:
            return False
        shapes.append((tuple(ops), tuple(others)))
    return len(set(shapes)) == 1


def _non_unit_rank(shape):
    return sum(1 for n in shape if n != 1)


def readout_piece(value_of, field, states, position, start, state_shape=None, labels=None, rng=None,
           like=None):
    """The ``Piece`` in ``field``: the highest binding that reads one state and one other
    non-constant value only, through which every path from ``field`` to the state goes.  For
    the first piece (``like`` None) it must be a contraction (checked numerically; returns
    ``(piece, contraction)``); the others must read like ``like`` (same op, same shape)."""
    depends, memo = VarMap(), VarMap()

    def reads_state(v):
        if not isinstance(v, relax.Var):
            return False
        if v in states:
            return True
        if position.get(v, -1) <= start or v not in value_of:
            return False
        if v not in depends:
            depends[v] = False
            depends[v] = any([reads_state(a) for a in operands_of(value_of[v])])
        return depends[v]

    def visit(v):                    # v reads a state: (its other inputs, its states, region)
        if v in states:
            return (), (v,), set()
        if v not in memo:
            if len(memo) > READOUT_BUDGET:
                raise _TooBig()
            ins, sts, region = [], [], {v}
            for a in operands_of(value_of[v]):
                if reads_state(a):
                    i2, s2, r2 = visit(a)
                    ins += i2
                    sts += s2
                    region |= r2
                elif not isinstance(a, tvm.ir.GenericConst):
                    ins.append(a)
            memo[v] = (_unique(ins), _unique(sts), region)
        return memo[v]

    if not reads_state(field):
        return None
    try:
        visit(field)
    except _TooBig:
        return None
    candidates = [v for v, (ins, sts, _) in memo.items() if len(ins) == 1 and len(sts) == 1]
    candidates.sort(key=lambda v: position.get(v, -1), reverse=True)
    for r in candidates:
        (top,), (state,), region = memo[r]
        if not _dominates(value_of, field, r, states, reads_state):
            continue
        for q in _view_chain(value_of, top)[::-1]:      # the least reshaped view first
            piece = Piece(state, r, q, region)
            if like is not None:
                if op_name(value_of[r]) == op_name(value_of[like.readout]) and \
                        tensor_shape(r) == tensor_shape(like.readout) and tensor_shape(q) == tensor_shape(like.q):
                    return piece
                continue
            found = _contraction(value_of, r, piece, state_shape, labels, rng)
            if found is not None:
                return piece, found
    return None


def _view_chain(value_of, x):
    """``x`` and the tensors it is a layout view of (through reshapes, broadcasts, unit dims,
    transposes and widening casts): the readout's q may be read in any of these layouts."""
    chain = [x]
    while isinstance(x, relax.Var):
        call = value_of.get(x)
        if not (op_name(call) in _VIEWS or widening(call)) or not isinstance(call.args[0], relax.Var):
            break
        x = call.args[0]
        chain.append(x)
    return chain


class _TooBig(Exception):
    pass


def _unique(xs):
    out = []
    for x in xs:
        if not any(x.same_as(y) for y in out):
            out.append(x)
    return tuple(out)


def _dominates(value_of, field, r, states, reads_state):
    """Every path from ``field`` down to a state goes through ``r``."""
    stack, seen = [field], set()
    while stack:
        v = stack.pop()
        if v.same_as(r) or v in seen:
            continue
        if v in states:
            return False
        seen.add(v)
        stack.extend(a for a in operands_of(value_of.get(v)) if reads_state(a))
    return True


def _contraction(value_of, field, piece, state_shape, labels, rng):
    """``(K dim, q's labels, field's labels)`` when ``field`` is ``sum_k q[.., k] S[.., k, ..]``
    for one state dim k (q may omit lane dims: shared across heads), checked on random S and
    q; else None."""
    state, q = piece.state, piece.q
    qs, fs = tensor_shape(q), tensor_shape(field)
    if qs is None or fs is None:
        return None
    sv, qv = rng.uniform(-1, 1, state_shape), rng.uniform(-1, 1, qs)
    got = evaluate_from(value_of, field, {state: sv, q: qv})
    if got is None:
        return None
    got = _squeezed(got)
    for key in labels:
        kept = [d for d in labels if d != key]
        if sorted(state_shape[d] for d in kept) != sorted(got.shape):
            continue
        for q_labels in _assignments(qs, labels, state_shape):
            if key not in q_labels:
                continue
            want = _einsum([(_squeezed(sv), tuple(labels)), (_squeezed(qv), q_labels)], kept, state_shape)
            for order in itertools.permutations(range(len(kept))):
                if [want.shape[i] for i in order] == list(got.shape) and \
                        np.allclose(np.transpose(want, order), got, rtol=1e-6, atol=1e-9):
                    return key, q_labels, tuple(kept[i] for i in order)
    return None


def readout_einsum_split(call, state):
    """How to read a readout einsum of three or more operands (``einsum("nhd,nhdm,nh->nhm",
    q, S, 1 / z)``, fast-transformers' recurrent linear attention) as ``q^T S`` then the rest:
    ``(i, j, inner, rest, outer)`` with ``inner`` the subscripts of ``einsum(op_i, op_j)``
    (``op_j`` is ``state``; the letters only they share contracted), ``rest`` the other
    operands' indices and ``outer`` the subscripts of ``einsum(inner's result, *rest)``; or
    None.  (The same product, summed in another order.)"""
    if op_name(call) != "relax.einsum" or not isinstance(call.args[0], relax.Tuple):
        return None
    fields = list(call.args[0].fields)
    subscripts = str(call.attrs.subscripts).replace(" ", "")
    if len(fields) < 3 or "->" not in subscripts or "." in subscripts:
        return None
    ins, out = subscripts.split("->")
    ins = ins.split(",")
    at = [j for j, f in enumerate(fields) if f.same_as(state)]
    if len(ins) != len(fields) or len(at) != 1 or any(len(set(x)) != len(x) for x in ins):
        return None
    j = at[0]
    for i, sub in enumerate(ins):
        if i == j:
            continue
        rest = [r for r in range(len(ins)) if r not in (i, j)]
        elsewhere = set(out).union(*(ins[r] for r in rest))
        summed = [c for c in ins[j] if c in sub and c not in elsewhere]
        if not summed or any(c not in sub for c in ins[j] if c not in elsewhere):
            continue            # the state's contracted letters must all be op_i's
        kept = [c for c in ins[j] + sub if c not in summed]
        kept = "".join(dict.fromkeys(kept))
        return (i, j, f"{sub},{ins[j]}->{kept}", rest,
                ",".join([kept] + [ins[r] for r in rest]) + "->" + out)
    return None


# -- the input and the decay ---------------------------------------------------------------------
def _product(b, shape, dtype, value_of, labels, rng):
    """``b``'s factors (``Factor``s), checked: ``b`` equals their product on random values.
    The factors are read through every layout view first; when that fails, without going
    below a reshape that regroups dims (a factor repeated from groups to heads,
    ``B.expand(b, g, h // g, n).reshape(b, h, n)``, is one over the heads)."""
    first = _product_of(b, shape, dtype, value_of, labels, rng, _product_leaves(value_of, b))
    if not isinstance(first, str):
        return first
    leaves, through = _product_leaves(value_of, b, regroup=False), _product_leaves(value_of, b)
    if len(leaves) == len(through) and all(x.same_as(y) for x, y in zip(leaves, through)):
        return first
    found = _product_of(b, shape, dtype, value_of, labels, rng, leaves)
    return first if isinstance(found, str) else found


def _product_of(b, shape, dtype, value_of, labels, rng, leaves):
    tensors = [x for x in leaves if not (isinstance(x, tvm.ir.GenericConst) and x.value.numpy().size == 1)]
    if len(tensors) < 2:
        return "b_t is not a product of per-step factors"
    values = {x: rng.uniform(0.5, 1.5, tensor_shape(x)) for x in tensors}
    got = evaluate_from(value_of, b, values)
    if got is None:
        return "b_t could not be evaluated on random factors"
    got = np.broadcast_to(got, shape) if _broadcasts(got.shape, shape) else None
    if got is None:
        return "b_t does not broadcast to the state"
    scalar = 1.0
    for x in leaves:
        if x not in values:
            scalar *= float(x.value.numpy().reshape(()))
    options = [_assignments(tensor_shape(x), labels, shape) for x in tensors]
    if int(np.prod([len(o) for o in options])) > ASSIGNMENTS:
        return "b_t's factors have too many readings along the state's dims"
    for choice in itertools.product(*options):
        want = scalar * _spread([_squeezed(values[x]) for x in tensors], choice, shape)
        if np.allclose(want, got, rtol=1e-6, atol=1e-9):
            return [Factor(x, ls) for x, ls in zip(tensors, choice)] + \
                ([Factor(relax.const(scalar, dtype), ())] if scalar != 1.0 else [])
    return "b_t is not a product of factors along the state's dims"


def looks_outer(value_of, b):
    """A cheap structural test before the numeric ones: ``b`` is a product of at least two
    tensors (not scalars)."""
    return len([x for x in _product_leaves(value_of, b) if tensor_shape(x) not in (None, ())]) >= 2


def _product_leaves(value_of, expr, regroup=True):
    """The factors of a product tree: through ``multiply``, layout views (reshapes that
    regroup dims only with ``regroup``), widening casts, ``einsum`` and ``matmul`` that
    contract nothing (a unit dim at most)."""
    out, stack = [], [expr]
    while stack:
        x = stack.pop()
        value = value_of.get(x) if isinstance(x, relax.Var) else (x if isinstance(x, relax.Call) else None)
        name = op_name(value)
        if not regroup and name == "relax.reshape" and _regroups(value):
            out.append(x)       # (B, G, R, N) -> (B, G*R, N): the merged dims are one state dim
        elif name == "relax.multiply" or (name in _VIEWS) or widening(value):
            stack.extend(a for a in value.args[:2 if name == "relax.multiply" else 1])
        elif name == "relax.einsum" and _contracts_nothing(value):
            stack.extend(value.args[0].fields)
        elif name == "relax.matmul" and _outer_matmul(value):
            stack.extend(value.args)
        else:
            out.append(x)
    return out


def _regroups(call):
    """A ``reshape`` that merges or splits dims that are not 1 (not a unit-dim view)."""
    inner, outer = tensor_shape(call.args[0]), tensor_shape(call)
    return inner is None or outer is None or non_unit(inner) != non_unit(outer)


def _contracts_nothing(call):
    subscripts = str(call.attrs.subscripts)
    if "->" not in subscripts or "..." in subscripts:
        return False
    ins, out = subscripts.split("->")
    return set(ins.replace(",", "")) <= set(out)


def _outer_matmul(call):
    x, y = (tensor_shape(a) for a in call.args)
    return x is not None and y is not None and len(x) >= 2 and len(y) >= 2 and x[-1] == 1 and y[-2] == 1


def _decay(a, state_shape, roles, value_of=None):
    """``a_t`` as a Factor (None when it is 1), or why it is not a decay over the lanes
    and at most one of K, V.  A decay spread over the state by broadcasts (``exp(dt[..., None]
    * A)`` with dt and A expanded to the state's shape first, as HF's Mamba-2 cache path
    writes it) is read below them (``narrowed``), over the dims it varies along."""
    if a is None or a is ONE or _all_ones(a):
        return None
    shape = expr_shape(a)
    if shape is None or not _broadcasts(shape, state_shape):
        return "a_t does not broadcast to the state"
    if value_of is not None:
        a, shape = narrowed(value_of, a)
    offset = len(state_shape) - len(shape)
    labels = tuple(offset + i for i, n in enumerate(shape) if n != 1)
    if roles["K"] in labels and roles["V"] in labels:
        return "the decay a_t varies over both state dims (K and V): not a gate of one of them"
    return Factor(a, labels)


def _all_ones(x):
    return isinstance(x, tvm.ir.GenericConst) and bool(np.all(x.value.numpy() == 1))


INNER = {"key": "K", "value": "V"}     # the decay kind -> the state dim its g runs along


def matrix_spec(shape, roles, length, q, k, v, decay, decay_per_step, reverse, has_h0, dtype,
                last_users):
    """The ``MatrixScanSpec`` of a match: ``shape`` is what ``roles`` index (the state, or the
    whole-sequence b), each factor's canonical (B, H, L, .) shape from the dims it runs along."""
    def extent(role, factor=None):
        """The role's extent (1 when absent, or when ``factor`` does not run along it)."""
        if role not in roles or (factor is not None and roles[role] not in factor.labels):
            return 1
        return shape[roles[role]]

    def canonical(factor, inner):
        return (extent("B", factor), extent("H", factor), length, extent(inner, factor))

    v_shape = _broadcast([canonical(f, "V") for f in v])[:2] + (length, extent("V"))
    kind, g_shape = "none", ()
    if decay is not None:
        kind = "key" if roles["K"] in decay.labels else "value" if roles["V"] in decay.labels else "scalar"
        inner = INNER.get(kind)
        g_shape = (extent("B", decay), extent("H", decay), length if decay_per_step else 1,
                   extent(inner, decay) if inner else 1)
    return MatrixScanSpec.create(extent("B"), extent("H"), length, extent("K"), extent("V"),
                                 canonical(q, "K"), canonical(k, "K"), v_shape, kind, g_shape,
                                 reverse, has_h0, dtype, last_users)


def _broadcast(shapes):
    return tuple(max(ns) for ns in zip(*shapes))


# -- numeric helpers -----------------------------------------------------------------------------
def _squeezed(x):
    return np.reshape(x, [n for n in np.shape(x) if n != 1])


def _broadcasts(shape, target):
    if len(shape) > len(target):
        return False
    return all(n in (1, m) for n, m in zip(shape[::-1], target[::-1]))


def _assignments(shape, labels, state_shape):
    """Each way to read the non-unit axes of ``shape``, in order, as distinct state dims of
    equal extent: tuples of state dims."""
    axes = [n for n in shape if n != 1]
    return [p for p in itertools.permutations(labels, len(axes))
            if all(state_shape[d] == n for d, n in zip(p, axes))]


def _spread(arrays, labels, state_shape):
    """The product of ``arrays`` (each along its ``labels``), broadcast to the state's shape."""
    arrays = list(arrays)
    covered = sorted(set().union(*labels))
    prod = _einsum(list(zip(arrays, labels)), covered, state_shape)
    return np.broadcast_to(prod.reshape([state_shape[d] if d in covered else 1
                                         for d in range(len(state_shape))]), state_shape)


def _einsum(operands, out, state_shape):
    """``prod`` of the operands (each ``(array, labels)``) summed over what ``out`` omits."""
    letter = {d: string.ascii_letters[i] for i, d in enumerate(range(len(state_shape)))}
    spec = ",".join("".join(letter[d] for d in ls) for _, ls in operands)
    return np.einsum(f"{spec}->{''.join(letter[d] for d in out)}", *[x for x, _ in operands])
