"""Find unrolled affine recurrences (chains of steps) in one Relax function.

A chain is a sequence of step bindings ``h_t = a_t*h_{t-1} + b_t`` (see ``steps.py``) whose
coefficient templates are equal and whose slice index moves by +1 (forward) or -1 (reverse)
per step.  Near misses (a non-affine op between steps, a coefficient that depends on the
state, mixed or skipped indices) are reported with the reason and never rewritten.
"""
import re
from dataclasses import dataclass, field

import tvm
from tvm import relax

from scanweaver_core.exprs import VarMap, error_line

from .lift import Lifter, NotLiftable, dims_after_time
from .steps import ONE, Analysis, op_name, tensor_dtype, tensor_shape

MIN_STEPS = 2


@dataclass
class Recurrence:
    """One recurrence found in a function (what ``find_recurrences`` returns).

    ``axis`` is the scan axis of the stacked ``(..., L, ...)`` tensors, ``bindings`` the names
    of the step bindings it covers; rejected near misses carry ``reason``.
    """

    function: str
    form: str
    length: int
    axis: int
    reverse: bool
    state_shape: tuple
    dtype: str
    bindings: tuple
    rejected: bool = False
    reason: str = ""
    validation_s: float = None      # time spent validating the rewrite (None: not validated)

    def bindings_vars(self):
        """The step vars of an accepted chain (not an ``h_0 = b_0`` state put in front)."""
        return self.states[len(self.states) - len(self.bindings):]

    def __repr__(self):
        span = self.bindings[0] if len(self.bindings) == 1 else f"{self.bindings[0]}..{self.bindings[-1]}"
        what = f"rejected: {self.reason}" if self.rejected else (
            f"L={self.length} axis={self.axis} {'reverse' if self.reverse else 'forward'} "
            f"state {self.state_shape} {self.dtype}")
        if self.validation_s is not None and not self.rejected:
            what += f", validated in {self.validation_s * 1e3:.1f} ms"
        return f"<{self.form} recurrence in {self.function} ({span}, {len(self.bindings)} bindings): {what}>"

    # the plan the rewrite follows (not part of the report)
    states: list = field(default_factory=list, repr=False)     # state vars in execution order
    initial: object = field(default=None, repr=False)           # h0 var, or None for zeros
    a: object = field(default=None, repr=False)                 # first step's coefficient exprs
    b: object = field(default=None, repr=False)
    indices: tuple = field(default=(), repr=False)              # slice index of each state
    analysis: object = field(default=None, repr=False)
    selective: object = field(default=None, repr=False)          # SelectiveMatch when form == "selective"
    selective_miss: str = field(default="", repr=False)         # why an affine chain is not selective
    matrix: object = field(default=None, repr=False)             # MatrixMatch when form == "matrix"
    matrix_miss: str = field(default="", repr=False)            # why it is not a matrix-state scan
    lifted: object = field(default=None, repr=False)             # LiftedMatch: a whole-sequence scan
    chunked: object = field(default=None, repr=False)            # ChunkedMatch: a chunked region
    stabilized: object = field(default=None, repr=False)         # StabilizedMatch (stabilized.py)
    mlstm: object = field(default=None, repr=False)              # MLSTMMatch (mlstm.py)
    chunked_mlstm: object = field(default=None, repr=False)      # ChunkedMLSTMMatch (mlstm_chunked.py)
    delta: object = field(default=None, repr=False)              # DeltaMatch (delta.py)
    chunked_delta: object = field(default=None, repr=False)      # ChunkedDeltaMatch (delta_chunked.py)
    facts: object = field(default=None, repr=False)              # (users, value) of the function
    internal: frozenset = field(default=frozenset(), repr=False)  # the bindings inside the steps
    lone: bool = field(default=False, repr=False)               # a near miss of lone steps


def find_chains(function_name, bindings):
    """All recurrences (accepted and rejected) among ``bindings`` (one binding block)."""
    an = Analysis(bindings)
    order = [b.var for b in bindings if isinstance(b, relax.VarBinding)]
    cands = {}
    for v in order:
        readings = _Readings(an, v)
        if readings:
            cands[v] = readings

    def keys(reading):
        return reading[3].key, reading[4].key

    # link each step to the previous one: a reading whose state is a step with equal templates
    link, taken = {}, set()
    for v in order:
        for reading in cands.get(v, ()):
            p = reading[0]
            if p in cands and p not in taken and any(keys(r) == keys(reading) for r in cands[p]):
                link[v] = reading
                taken.add(p)
                break
    found, near = [], {}
    linked_to = {r[0]: v for v, r in link.items()}
    for v in order:
        if v in link or v not in cands:
            continue
        if v in linked_to:  # v starts a chain: its own reading is the one matching its successor
            succ = link[linked_to[v]]
            matching = [r for r in cands[v] if keys(r) == keys(succ)]
            # with h_0 = b_0 and ``b + h``, both operands of the first step are slices: the
            # reading whose index neighbours the successor's is the one that makes a chain
            first = next((r for r in matching if _adjacent(_index(r), _index(succ))), matching[0])
            steps, readings = [v], [first]
            while steps[-1] in linked_to:
                nxt = linked_to[steps[-1]]
                steps.append(nxt)
                readings.append(link[nxt])
            chain = _chain(function_name, an, steps, readings)
            if chain is not None:
                found.append(chain)
        else:
            reason = _near_miss(an, cands, v)
            if reason:       # one report per loop: its steps differ only in binding names
                near.setdefault(("near", re.sub(r"\b[A-Za-z_]\w*\d\w*\b", "#", reason)), (reason, []))[1].append(v)
    for v in order:          # steps that read their state in a way that is not affine
        if v in cands or v not in an.not_affine:
            continue
        p, why = an.not_affine[v]
        if isinstance(p, relax.Var) and (p in an.not_affine or p in cands):
            reason = (f"step {v.name}: the state {p.name} goes through {why.op} "
                      f"({why.var.name}): not affine in h")
            near.setdefault(("not affine", why.op, tensor_shape(v)), (reason, []))[1].append(v)
    for v in order:          # max-plus steps m = max(m + w, k_t): a near miss of its own kind
        prev, decayed = _max_plus_state(an, v)
        if prev is not None:
            form = "max-plus recurrence m = max(m + w, k_t)" if decayed else "running max m = max(m, k_t)"
            reason = (f"step {v.name}: {form} on {prev.name} (a max-stabilized normalizer, as in "
                      "RWKV/xLSTM, online softmax or a logcumsumexp loop): not affine in h; left as it was")
            near.setdefault(("max-plus", tensor_shape(v)), (reason, []))[1].append(v)
    for reason, steps in near.values():
        more = f" (and {len(steps) - 1} more steps like it)" if len(steps) > 1 else ""
        found.append(_rejected(function_name, steps, reason + more))
        found[-1].lone = True
    return _drop_inner_chains(an, found)


def _max_plus_state(an, v):
    """``(previous state, decayed)`` when ``v = maximum(add(p, w), k)`` (either order;
    ``decayed``) or ``maximum(p, k)`` (a running max, ``p`` reading one more), with ``p``
    itself such a step of v's type; else ``(None, False)``."""
    value = an.value.get(v)
    if op_name(value) != "relax.maximum":
        return None, False

    def is_step(p):
        return isinstance(p, relax.Var) and op_name(an.value.get(p)) == "relax.maximum" \
            and tensor_shape(p) == tensor_shape(v)

    for x in value.args:
        inner = an.value.get(x) if isinstance(x, relax.Var) else None
        if op_name(inner) == "relax.add":
            for p in inner.args:
                if is_step(p):
                    return p, True
    for p in value.args:     # (three maxima in a row: not just a max of a few tensors)
        if is_step(p) and any(is_step(q) for q in an.value[p].args):
            return p, False
    return None, False


def _drop_inner_chains(an, found):
    """``h = a*h + b + c`` has two chains: the steps, and the partial sums ``a*h + b`` inside
    them (affine too, in each other).  Keep the outer one: drop a chain whose every state is a
    term of another chain's steps (two bindings deep)."""
    accepted = [r for r in found if r.states]         # a rejected outer chain covers too
    coverers = [r for r in accepted if not r.lone]

    def terms(rec):
        out = set()
        for s in rec.states:
            for x in an.value.get(s).args if isinstance(an.value.get(s), relax.Call) else ():
                out.add(x)
                inner = an.value.get(x) if isinstance(x, relax.Var) else None
                if isinstance(inner, relax.Call):
                    out.update(inner.args)
        return out

    covered = {id(r): terms(r) for r in coverers}
    inner = {id(x) for x in accepted for y in coverers
             if x is not y and all(s in covered[id(y)] for s in x.bindings_vars())}
    return [r for r in found if id(r) not in inner]


class _Reading:
    """A step's reading ``a * p + b``, indexed as ``(p, a, b, template(a), template(b))``; the
    templates are made on first use: a long chain's steps each have a dozen readings and
    linking compares one or two of them."""
    __slots__ = ("p", "a", "b", "_an", "_templates")

    def __init__(self, an, p, a, b):
        self.p, self.a, self.b, self._an, self._templates = p, a, b, an, None

    def _all(self):
        if self._templates is None:
            self._templates = (self._an.template(self.a), self._an.template(self.b))
        return (self.p, self.a, self.b) + self._templates

    def __getitem__(self, i):
        return (self.p, self.a, self.b)[i] if isinstance(i, int) and 0 <= i < 3 else self._all()[i]

    def __iter__(self):
        return iter(self._all())


class _Readings:
    """A binding's readings as a step (``Analysis.step_candidates``), read as they are iterated:
    a step of a long chain has a dozen, and linking it reads the first one or two."""

    def __init__(self, an, v):
        self._an, self._pending, self._got = an, an.step_candidates(v), []

    def __iter__(self):
        i = 0
        while i < len(self._got) or self._read_one():
            yield self._got[i]
            i += 1

    def __bool__(self):
        return bool(self._got) or self._read_one()

    def _read_one(self):
        nxt = next(self._pending, None)
        if nxt is not None:
            self._got.append(_Reading(self._an, *nxt))
        return nxt is not None


def _index(reading):
    """The one time index a step reading takes, or None."""
    idx = {t.index for t in reading[3:5] if t.index is not None}
    return idx.pop() if len(idx) == 1 else None


def _adjacent(i, j):
    return isinstance(i, int) and isinstance(j, int) and abs(i - j) == 1


def _near_miss(an, cands, v):
    """Why a lone step is not part of a chain, when it looks like one that was meant to be."""
    for p, a, b, ta, tb in cands[v]:
        if ta.index is None and tb.index is None:
            continue  # no per-step input: not a recurrence over time
        if p in cands and (an.mentions(ta.key, p) or an.mentions(tb.key, p)):
            return f"step {v.name}: its coefficient depends on the state {p.name} (not affine in h)"
        value = an.value.get(p)
        name = op_name(value)
        if name and name != "relax.add":
            # the state passed through another op, from a step that looks like this one
            inner = [x for x in value.args if isinstance(x, relax.Var) and x in cands
                     and any((r[3].key, r[4].key) == (ta.key, tb.key) for r in cands[x])]
            if inner:
                return (f"step {v.name}: the state {inner[0].name} goes through {name} "
                        f"({p.name}) before this step: not affine in h")
    return None


def _rejected(function_name, steps, reason):
    v = steps[0]
    return Recurrence(function_name, "affine", len(steps), -1, False, tensor_shape(v), tensor_dtype(v),
                      tuple(s.name for s in steps), rejected=True, reason=reason, states=list(steps))


def _chain(function_name, an, steps, readings):
    names = [s.name for s in steps]
    indices = []
    for s, (_, _, _, ta, tb) in zip(steps, readings):
        idx = {t.index for t in (ta, tb) if t.index is not None}
        if "mixed" in idx or len(idx) > 1:
            return _rejected(function_name, steps, f"step {s.name} reads different time indices {sorted(map(str, idx))}")
        if not idx:
            return None      # no per-step input: not a loop over time (say nothing)
        indices.append(idx.pop())
    if len(steps) < MIN_STEPS:
        return _rejected(function_name, steps, f"only {len(steps)} step(s)")
    deltas = {j - i for i, j in zip(indices, indices[1:])}
    if deltas not in ({1}, {-1}):
        return _rejected(function_name, steps, f"time indices are not consecutive: {indices[:8]}{'...' if len(indices) > 8 else ''}")
    direction = deltas.pop()
    shape, dtype = tensor_shape(steps[0]), tensor_dtype(steps[0])
    if shape is None:
        return _rejected(function_name, steps, "the state has a symbolic shape")
    p0, a0, b0, _, tb = readings[0]
    initial = None if an.is_zeros(p0) else p0
    states = list(steps)
    t_prev = an.template(_drop_zero_term(an, p0)) if isinstance(p0, relax.Var) else None
    if initial is not None and t_prev is not None and t_prev.key == tb.key and t_prev.index == indices[0] - direction:
        states.insert(0, p0)              # h_0 = b_0: the same as a step from zero
        indices.insert(0, indices[0] - direction)
        initial = None
    if a0 is not ONE and tensor_dtype(a0) not in ("", dtype):
        return _rejected(function_name, steps, f"coefficient dtype {tensor_dtype(a0)} differs from the state's {dtype}")
    axis = _scan_axis(an, a0, b0, len(shape), (min(indices), len(states)))
    if isinstance(axis, str):
        return _rejected(function_name, steps, axis)
    return Recurrence(function_name, "affine", len(states), axis, direction < 0, shape, dtype, tuple(names),
                      states=states, initial=initial, a=a0, b=b0, indices=tuple(indices), analysis=an,
                      internal=_inside_steps(an, states))


def _inside_steps(an, states):
    """Every binding on a path from one state to the next (the steps themselves included):
    a use of a state there is the recurrence's own, not the rest of the graph's."""
    an.positions()
    inside = set()
    for prev, step in zip(states, states[1:]):
        start, memo = an.position.get(prev, -1), VarMap()

        def reaches(v):                           # does v depend on prev (within this step)?
            if v.same_as(prev):
                return True
            if not isinstance(v, relax.Var) or an.position.get(v, -1) <= start:
                return False
            if v not in memo:
                memo[v] = False
                value = an.value.get(v)
                hits = [reaches(a) for a in relax.analysis.free_vars(value)] if value is not None else []
                memo[v] = any(hits)           # (every operand visited: all of them are inside)
            return memo[v]

        reaches(step)
        inside.update(v for v, hit in memo.items() if hit)
    return frozenset(inside)


def _drop_zero_term(an, var):
    """``x`` when ``var = zeros + x`` (what FoldConstant leaves of ``a_0 * zeros + b_0``)."""
    value = an.value.get(var)
    if op_name(value) == "relax.add":
        x, y = value.args
        for zero, other in ((x, y), (y, x)):
            if isinstance(zero, tvm.ir.expr.GenericConst) and an.is_zeros(zero) and isinstance(other, relax.Var):
                return other
    return var


def _scan_axis(an, a, b, rank, window):
    """The L axis of the stacked tensors: where the lifted ``b`` (else ``a``) has time, counted
    from the end, so the big operand needs no transpose; else a reason.  Lifted on a scratch
    builder here, for real (the same way) when the rewrite emits it."""
    bb = relax.BlockBuilder()
    bb._begin_dataflow_block()  # pylint: disable=protected-access  # a scratch scope to normalize in
    lifter = Lifter(an, window, bb.emit)
    try:
        lifted = [lifter.lift(x) for x in (b, a) if x is not ONE]
    except NotLiftable as err:
        return f"a coefficient uses {err}, which does not commute with slicing along time"
    except (RuntimeError, ValueError, TypeError) as err:
        return f"its whole-sequence coefficients could not be built: {error_line(err)}"
    finally:
        bb._end_block()  # pylint: disable=protected-access
    e, tax = next((x for x in lifted if x[1] is not None), (None, None))
    if e is None:
        return "no per-step input"
    # where the sliced tensors have time (no transposes of the big operands), if it fits
    natural = [r for r in lifter.slice_rhos if r <= rank]
    rho = natural[0] if natural else dims_after_time(e, tax)
    if rho > rank:
        return "a slice has more dims after its axis than the state has"
    return rank - rho
