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
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap
from scanweaver_core.spec import MatrixScanSpec

from ...operands import evaluate_from, operands_of, widening
from ...steps import op_name, tensor_shape
from .factors import _VIEWS, Factor, _assignments, _einsum, _squeezed, input_and_decay, looks_outer
from .stacks import stack_sources

READOUT_BUDGET = 80     # bindings of one readout piece


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


