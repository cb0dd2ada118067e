"""Max-stabilized recurrences (RWKV-4's WKV) read from an unrolled loop, by what they compute.

HF ``RwkvForCausalLM`` on a CPU runs ``rwkv_linear_attention_cpu``: per step a max state
``m_t = maximum(m_{t-1} + w, k_t)`` and two states rescaled by it,
``num_t = exp(m_{t-1} + w - m_t) num_{t-1} + exp(k_t - m_t) v_t`` and ``den_t`` (the same with
1 for ``v_t``), read out before the update with the bonus ``u`` and written in place into an
output buffer.  ``torch.export`` unrolls it into ~35 bindings a step.  None of them is affine in
the state (``chains.py`` reports the max steps as a near miss); together they are one step of
the max-stabilized monoid (``algebra.log_compose``), i.e. one ``StabilizedScanSpec`` scan.

How a loop is read (``find_stabilized``):

1. the max chain: bindings ``m = maximum(add(p, w), k)`` (either order) linked through ``p``,
   at least two steps; ``w`` is the step's log-decay, ``k`` its key;
2. per step, the coupled states: the two bindings ``add(multiply(e1, X), Y)`` whose ``e1`` is
   ``exp(. - m_t)`` and whose ``X`` is the previous step's state (or, at step 0, the initial
   one); the one whose ``Y`` is ``multiply(e2, V)`` is num (``V`` the value), the one with
   ``Y = e2`` is den (no num: a den-only scan);
3. the readout: a ``divide`` of two terms read from the states before the update (with a
   bonus ``u``, found as ``maximum(m_{t-1}, add(k_t, u))``) or after it, and where it goes: an
   in-place write ``where(arange == t, broadcast(y_t), buffer)`` per step (the last such write
   is the stacked output), or a ``concat`` of the per-step values;
4. the numbers: steps 0, 1 and the last are evaluated with the interpreter (float64) on random
   previous states and the function's probe inputs, and must equal ``algebra.log_apply`` of the
   operands read (and the readout its formula) to 1e-9; otherwise the loop is not this scan
   and the reason says which value differed.

The operands ``k``, ``v`` (and a per-step ``w``) are the per-step slices lifted to the whole
sequence (``lift.Lifter``); ``w`` and ``u`` that are the same value every step are per-channel
parameters; the initial state is passed as it is (zeros and -1e38 in HF).  The emitted scan
(``emit_stabilized``) replaces the stacked output and, where the rest of the graph reads them,
the final states; the whole rewrite is then validated like every other (``validate.py``).
"""
from dataclasses import dataclass, field

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst

from scanweaver_core import algebra
from scanweaver_core.exprs import VarMap, op_name, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_stabilized_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from ...form import users_of
from ...interpret import Interpreter, Unsupported, random_input
from ...lift import Lifter, NotLiftable
from ...prune import prune_dead_bindings
from ...steps import Analysis

__all__ = ["StabilizedMatch", "find_stabilized", "find_stabilized_scans", "emit_stabilized",
           "FuseStabilizedScans", "fuse_stabilized"]

MIN_STEPS = 2
RTOL = 1e-9


class NotStabilized(Exception):
    """The loop is not a stabilized scan (the message says why)."""


@dataclass
class _Step:
    m: object                  # m_t
    prev_m: object             # m_{t-1}
    w: object
    k: object
    num: object = None         # num_t, or None (den-only)
    den: object = None
    prev_num: object = None
    prev_den: object = None
    v: object = None
    y: object = None           # the readout of step t
    u: object = None           # the bonus, with a read-before-update readout (None: 0)
    before: bool = False       # the readout reads the state before the update
    inside: set = field(default_factory=set)   # the bindings of this step


@dataclass
class StabilizedMatch:
    """One loop read as a stabilized scan; ``emit_stabilized`` builds it."""

    steps: list
    reverse: bool
    output: object             # the var holding the stacked readouts (replaced by the scan)
    out_axis: int              # its time axis
    emit_at: object            # the binding at which the scan is emitted (the output's)
    last_used: bool            # the final states are read by the rest of the graph
    analysis: object = None
    window: tuple = ()
    has_bonus: bool = False
    has_values: bool = True
    channel_w: bool = True
    channel_u: bool = True
    bindings: tuple = ()

    @property
    def length(self):
        return len(self.steps)


def _args(value):
    return list(value.args) if isinstance(value, relax.Call) else []


def _is(value, name):
    return op_name(value) == name


class _Reader:
    """Reads the loops of one function (``value``: var -> bound value, ``users``: var -> users)."""

    def __init__(self, func, value, users):
        self.func, self.value, self.users = func, value, users
        self.vmap = VarMap((k, v) for k, v in value.items())

    def val(self, x):
        return self.vmap.get(x) if isinstance(x, relax.Var) else None

    # 1. the max chain -----------------------------------------------------------------------
    def max_steps(self):
        """``{m: [(p, w, k, where)]}`` for every ``m = maximum(add(p, w), k)``: each reading
        (``where``: the argument positions of the add and of p in it), as both operands of
        the add may have the state's shape (xLSTM's ``max(f + m, i)``)."""
        out = VarMap()
        for var, val in self.value.items():
            if not _is(val, "relax.maximum"):
                continue
            readings = []
            for i, x in enumerate(_args(val)):
                inner = self.val(x)
                if not _is(inner, "relax.add"):
                    continue
                other = _args(val)[1 - i]
                for j, p in enumerate(_args(inner)):     # (a constant: a given initial max)
                    if isinstance(p, (relax.Var, GenericConst)) and tensor_shape(p) == tensor_shape(var):
                        readings.append((p, _args(inner)[1 - j], other, (i, j)))
            if readings:
                out[var] = readings
        return out

    def chains(self):
        """The max chains: each step's ``p`` is the previous step's max; the first step's
        reading is the one in its successor's argument positions."""
        steps = self.max_steps()
        linked = VarMap()                 # m -> its reading whose p is a max step
        nxt = VarMap()
        for m, readings in steps.items():
            for reading in readings:
                if reading[0] in steps:
                    linked[m] = reading
                    nxt.setdefault(reading[0], []).append(m)
                    break
        chains = []
        for m in steps.keys():
            if m in linked or len(nxt.get(m, [])) != 1:
                continue            # not a start
            chain = [m]
            while len(nxt.get(chain[-1], [])) == 1:
                chain.append(nxt[chain[-1]][0])
            if len(chain) < MIN_STEPS:
                continue
            where = linked[chain[1]][3]
            first = next((r for r in steps[m] if r[3] == where), steps[m][0])
            readings = [first] + [linked[c] for c in chain[1:]]
            chains.append([_Step(c, r[0], r[1], r[2]) for c, r in zip(chain, readings)])
        return chains

    # 2. the coupled states ------------------------------------------------------------------
    def _exps_of(self, m):
        """``exp(x - m)`` vars: ``{exp var: x}``."""
        out = VarMap()
        for s in self.users.get(m, []):
            sv = self.val(s)
            if _is(sv, "relax.subtract") and _args(sv)[1].same_as(m):
                for e in self.users.get(s, []):
                    if _is(self.val(e), "relax.exp"):
                        out[e] = _args(sv)[0]
        return out

    def couple(self, step):
        """Find num_t / den_t (and their previous states) of ``step``."""
        exps = self._exps_of(step.m)
        if len(exps) < 2:
            raise NotStabilized(f"step {step.m.name}: no exp(. - max) rescaling of other states")
        step.inside.update(exps.keys())
        step.inside.update(s for s in self.users.get(step.m, []) if _is(self.val(s), "relax.subtract"))
        found = {}
        for e in exps.keys():
            for mul in self.users.get(e, []):
                if not _is(self.val(mul), "relax.multiply"):
                    continue
                a, b = _args(self.val(mul))
                x = b if a.same_as(e) else a
                if any(x.same_as(f) for f in exps.keys()):
                    continue
                for add in self.users.get(mul, []):
                    if not _is(self.val(add), "relax.add"):
                        continue
                    p, q = _args(self.val(add))
                    y = q if p.same_as(mul) else p
                    if any(y.same_as(f) for f in exps.keys()):
                        found["den"] = (add, x, mul, None)
                    elif _is(self.val(y), "relax.multiply"):
                        ya, yb = _args(self.val(y))
                        if any(ya.same_as(f) for f in exps.keys()):
                            found.setdefault("num", (add, x, mul, y, yb))
                        elif any(yb.same_as(f) for f in exps.keys()):
                            found.setdefault("num", (add, x, mul, y, ya))
        if "den" not in found:
            raise NotStabilized(f"step {step.m.name}: no den state e1*den + e2 rescaled by it")
        step.den, step.prev_den, mul, _ = found["den"]
        step.inside.update([step.den, mul])
        if "num" in found:
            step.num, step.prev_num, mul, y, step.v = found["num"]
            step.inside.update([step.num, mul, y])
        for e, x in exps.items():     # e1's argument m_{t-1} + w is inside the step too
            if isinstance(x, relax.Var) and _is(self.val(x), "relax.add"):
                step.inside.add(x)
        step.inside.update([step.m] + [a for a in _args(self.val(step.m)) if isinstance(a, relax.Var)
                                       and _is(self.val(a), "relax.add")])

    # 3. the readout ---------------------------------------------------------------------------
    def readout(self, step):
        """The divide reading this step's output: before the update (the previous states and
        a bonus) or after it (this step's).  Searched from the step's key (a state may be a
        constant, which has no users)."""
        for d in self._divides_near(step.k):
            read = self._denominator_state(d)
            for den_var, m_var, bonus in ((step.prev_den, step.prev_m, True), (step.den, step.m, False)):
                if read is not None and read.same_as(den_var):
                    step.y, step.inside, step.before = d, step.inside | self._terms(d), bonus
                    if bonus:
                        step.u = self._bonus(step, m_var, d)
                    return
        raise NotStabilized(f"step {step.m.name}: no readout num/den of its states")

    def _divides_near(self, start, depth=6):
        found, frontier, seen = [], [start], set()
        for _ in range(depth):
            nxt = []
            for x in frontier:
                for u in self.users.get(x, []):
                    if u == "return" or u in seen:
                        continue
                    seen.add(u)
                    if _is(self.val(u), "relax.divide"):
                        found.append(u)
                    elif op_name(self.val(u)) in ("relax.add", "relax.maximum", "relax.subtract",
                                                  "relax.exp", "relax.multiply"):
                        nxt.append(u)
            frontier = nxt
        return found

    def _denominator_state(self, d):
        """``D`` of a divide whose denominator is ``add(multiply(e, D), e2)`` (e, e2 exps)."""
        den = self.val(_args(self.val(d))[1])
        if not _is(den, "relax.add"):
            return None
        for a, b in (_args(den), _args(den)[::-1]):
            if _is(self.val(a), "relax.multiply") and _is(self.val(b), "relax.exp"):
                x, y = _args(self.val(a))
                if _is(self.val(x), "relax.exp"):
                    return y
                if _is(self.val(y), "relax.exp"):
                    return x
        return None

    def _divides_reading(self, den):
        out = []
        for mul in self.users.get(den, []):
            if not _is(self.val(mul), "relax.multiply"):
                continue
            for add in self.users.get(mul, []):
                if not _is(self.val(add), "relax.add"):
                    continue
                for d in self.users.get(add, []):
                    dv = self.val(d)
                    if _is(dv, "relax.divide") and _args(dv)[1].same_as(add):
                        out.append(d)
        return out

    def _terms(self, d):
        """The readout's bindings (two levels of adds/multiplies below the divide, its exps)."""
        inside = {d}
        for x in _args(self.val(d)):
            if isinstance(x, relax.Var):
                inside.add(x)
                for y in _args(self.val(x)):
                    if isinstance(y, relax.Var) and _is(self.val(y), "relax.multiply"):
                        inside.add(y)
                        for e in _args(self.val(y)):
                            if isinstance(e, relax.Var) and _is(self.val(e), "relax.exp"):
                                inside.add(e)
                                inside.update(a for a in _args(self.val(e)) if isinstance(a, relax.Var))
        for e in list(inside):
            if _is(self.val(e), "relax.subtract"):
                top = _args(self.val(e))[1]
                if _is(self.val(top), "relax.maximum"):
                    inside.add(top)
                    inside.update(a for a in _args(self.val(top)) if isinstance(a, relax.Var)
                                  and _is(self.val(a), "relax.add"))
        return inside

    def _bonus(self, step, m_prev, d):
        """``u`` of ``p = maximum(m_{t-1}, add(k_t, u))`` among the readout's bindings."""
        for x in self._terms(d):
            xv = self.val(x)
            if _is(xv, "relax.maximum") and any(a.same_as(m_prev) for a in _args(xv)):
                other = next(a for a in _args(xv) if not a.same_as(m_prev))
                ov = self.val(other)
                if _is(ov, "relax.add"):
                    a, b = _args(ov)
                    return b if a.same_as(step.k) else a if b.same_as(step.k) else b
                return None       # max(m, k): a bonus of 0
        raise NotStabilized(f"step {step.m.name}: its readout has no max(m, k + u)")


    # where the readouts go ----------------------------------------------------------------------
    def gathered(self, steps, reverse=False):
        """``(output var, time axis, bindings)`` of the per-step writes of the readouts (in
        place, or a ``concat``/``stack`` of them in time order: ``reverse`` steps run back)."""
        stacked = self._stacked(steps, reverse)
        if stacked is not None:
            return stacked
        writes, inside = [], set()
        for step in steps:
            w = self._write_of(step.y, inside)
            if w is None:
                raise NotStabilized(f"readout {step.y.name} is not written into an output buffer")
            writes.append(w)
        for a, b in zip(writes, writes[1:]):
            if not _args(self.val(b))[2].same_as(a):
                raise NotStabilized(f"the writes {a.name}, {b.name} do not chain")
        last = writes[-1]
        cond = _args(self.val(writes[0]))[0]
        shape = tensor_shape(cond) or ()
        axes = [i for i, n in enumerate(shape) if n == len(steps)]
        if len(axes) != 1:
            raise NotStabilized("the output buffer's time axis is ambiguous")
        inside.update(writes)
        return last, axes[0], inside

    def _stacked(self, steps, reverse):
        """``torch.stack(ys, dim)``: one ``concat`` of the readouts in time order, each through
        ``expand_dims`` (a new time axis), or bare along the channel axis (what export makes
        of a stack at dim 1 of (B, C) readouts: (B, L*C), reshaped after)."""
        pieces, concats = [], set()
        for step in steps:
            piece = next((u for u in self.users.get(step.y, []) if u != "return" and
                          _is(self.val(u), "relax.expand_dims")), step.y)
            cat = [u for u in self.users.get(piece, []) if u != "return" and _is(self.val(u), "relax.concat")]
            if len(cat) != 1:
                return None
            pieces.append(piece)
            concats.add(cat[0])
        if len(concats) != 1:
            return None
        cat = concats.pop()
        fields = list(_args(self.val(cat))[0].fields)
        timed = pieces[::-1] if reverse else pieces
        if len(fields) != len(pieces) or not all(f.same_as(p) for f, p in zip(fields, timed)):
            return None           # (only in time order: the scan's output is)
        rank = len(tensor_shape(cat))
        axis = int(self.val(cat).attrs.axis) % rank
        if pieces[0].same_as(steps[0].y):
            if axis != rank - 1:
                raise NotStabilized(f"the readouts are concatenated along axis {axis}, not after the channels")
            axis = 1              # (B, L*C) holds (B, L, C)
        return cat, axis, {p for p in pieces if not p.same_as(steps[0].y)} | {cat}

    def _write_of(self, y, inside):
        frontier, seen = [y], []
        for _ in range(6):       # (the layout ops a write goes through, and a cast to its dtype)
            nxt = []
            for x in frontier:
                for u in self.users.get(x, []):
                    if u == "return":
                        continue
                    uv = self.val(u)
                    if _is(uv, "relax.where") and _args(uv)[1].same_as(x):
                        inside.update(seen)
                        return u
                    if op_name(uv) in ("relax.broadcast_to", "relax.expand_dims", "relax.reshape",
                                       "relax.astype"):
                        nxt.append(u)
                        seen.append(u)
            frontier = nxt
        return None


def _last_readout(reader, an, last):
    """The readout after the last update, reading it with the bonus (whose own update was
    removed as dead code when the final state is not returned): a step with a readout only."""
    divides = reader._divides_reading(last.den)  # pylint: disable=protected-access
    if not divides:
        return None
    y = divides[0]
    step = _Step(None, last.m, last.w, None, prev_num=last.num, prev_den=last.den, y=y, before=True)
    step.inside = reader._terms(y)  # pylint: disable=protected-access
    for x in step.inside:
        xv = reader.val(x)
        if _is(xv, "relax.maximum") and any(a.same_as(last.m) for a in _args(xv)):
            other = next(a for a in _args(xv) if not a.same_as(last.m))
            ov = reader.val(other)
            pieces = _args(ov) if _is(ov, "relax.add") else [other]
            sliced = [a for a in pieces if an.template(a).index is not None]
            if len(sliced) != 1:
                raise NotStabilized(f"readout {y.name}: no per-step key in its max")
            step.k = sliced[0]
            rest = [a for a in pieces if not a.same_as(step.k)]
            step.u = rest[0] if rest else None
    if step.k is None:
        raise NotStabilized(f"readout {y.name}: its max does not read the last state")
    if last.num is not None:
        top = _args(reader.val(y))[0]
        for term in _args(reader.val(top)):
            tv = reader.val(term)
            if _is(tv, "relax.multiply") and not any(a.same_as(last.num) for a in _args(tv)):
                step.v = next((a for a in _args(tv) if not _is(reader.val(a), "relax.exp")), None)
        if step.v is None:
            raise NotStabilized(f"readout {y.name}: no value term")
    return step


def _check_numbers(reader, match, seed=0):
    """Evaluate steps 0, 1 and the last with random previous states; they must equal the
    stabilized step (``algebra.log_apply``) of the operands read, the readout its formula."""
    rng = np.random.default_rng(seed)
    leaves = VarMap()

    def leaf(var):
        if var not in leaves:
            leaves[var] = random_input(var.ty, rng, 1.0)
        return leaves[var]

    probe = Interpreter(reader.vmap, missing=leaf)
    for idx in sorted({0, 1, match.length - 1}):
        step = match.steps[idx]
        shape = tensor_shape(step.prev_den)
        given = VarMap()
        randoms = [(step.prev_m, rng.normal(size=shape) * 3), (step.prev_den, rng.random(shape) + 0.5)]
        if step.prev_num is not None:
            randoms.append((step.prev_num, rng.normal(size=shape)))
        for x, r in randoms:     # a constant (a given initial state) keeps its value
            given[x] = r if isinstance(x, relax.Var) else np.broadcast_to(probe(x), shape)
        side = Interpreter(reader.vmap, missing=leaf,
                           shared=lambda v, given=given: given.get(v) if v in given else (
                               probe(v) if _outside(v, step) else None))
        k = np.asarray(side(step.k), dtype=np.float64)
        w = np.asarray(side(step.w), dtype=np.float64)
        v = None if step.v is None else np.asarray(side(step.v), dtype=np.float64)
        state = (given.get(step.prev_num) if step.prev_num is not None else None,
                 given[step.prev_den], given[step.prev_m])
        want = algebra.log_apply(algebra.log_step(w, k, v), state)
        got = [side(step.num) if step.num is not None else None, side(step.den), side(step.m)] \
            if step.m is not None else [None, None, None]      # (a readout-only last step)
        for name, g, x in zip(("num", "den", "max"), got, want):
            if g is None:
                continue
            g = np.asarray(g, dtype=np.float64)
            if g.shape != np.shape(x) or not _close(g, x):
                raise NotStabilized(f"step {idx}: its {name} is not the stabilized step's "
                                    f"(max error {np.max(np.abs(g - x)):.3g})")
        if match.has_bonus:
            u = 0.0 if step.u is None else np.asarray(side(step.u), dtype=np.float64)
            read = algebra.log_apply(algebra.log_step(0.0, u + k, v), state)
        else:
            read = want
        y_want = read[0] / read[1] if v is not None else read[2] + np.log(read[1])
        y = np.asarray(side(step.y), dtype=np.float64)
        if y.shape != np.shape(y_want) or not _close(y, y_want):
            raise NotStabilized(f"step {idx}: its readout {step.y.name} is not the stabilized readout")


def _outside(var, step):
    return var not in step.inside


def _close(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want), initial=0.0)) <= RTOL * max(1.0, float(np.max(np.abs(want), initial=0.0)))


def find_stabilized(func, value, users):
    """``[(var, StabilizedMatch | reason str)]`` for the max-stabilized loops of ``func``:
    ``value`` maps each bound var to its value, ``users`` each var to the vars that use it
    (``"return"`` for the function's result)."""
    if not isinstance(func.body, relax.SeqExpr):
        return []
    reader = _Reader(func, value, users)
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    found, an = [], None
    for steps in reader.chains():
        try:
            an = an or _analysis(bindings)
            found.append((steps[0].m, _match(reader, steps, an)))
        except NotStabilized as err:
            found.append((steps[0].m, str(err)))
        except (Unsupported, NotLiftable, ValueError, TypeError, KeyError, IndexError) as err:
            found.append((steps[0].m, f"could not be read: {type(err).__name__}: {err}"))
    return found


def _analysis(bindings):
    """Slice templates of every binding, made in binding order (each reads its operands'
    memoized ones: no recursion through a long unrolled loop)."""
    an = Analysis(bindings)
    for b in bindings:
        if isinstance(b, relax.VarBinding):
            an.template(b.var)
    return an


def _match(reader, steps, an):
    for step in steps:
        reader.couple(step)
    for prev, step in zip(steps, steps[1:]):
        if not step.prev_den.same_as(prev.den) or (step.num is not None) != (prev.num is not None) or \
                (step.num is not None and not step.prev_num.same_as(prev.num)):
            raise NotStabilized(f"steps {prev.m.name} -> {step.m.name}: the states do not chain")
    for step in steps:
        reader.readout(step)
    if len({s.before for s in steps}) != 1:
        raise NotStabilized("some readouts read the state before the update, some after")
    if steps[0].before:
        extra = _last_readout(reader, an, steps[-1])
        if extra is not None:       # the last step's update is dead (exported away): its readout
            steps = steps + [extra]
    idx = [an.template(s.k).index for s in steps]
    if any(not isinstance(i, int) for i in idx):
        raise NotStabilized("the keys are not per-step slices of one tensor")
    deltas = {b - a for a, b in zip(idx, idx[1:])}
    if deltas not in ({1}, {-1}):
        raise NotStabilized(f"the keys' time indices are not consecutive: {idx[:6]}")
    reverse = deltas == {-1}
    output, out_axis, inside = reader.gathered(steps, reverse)
    for s in steps:
        s.inside |= inside
    region = set().union(*(s.inside for s in steps)) | {s.m for s in steps if s.m is not None}
    last = steps[-1]
    last_states = [x for x in (last.num, last.den, last.m) if x is not None]   # (none: dead)
    last_used = any(u == "return" or u not in region for x in last_states for u in reader.users.get(x, []))
    match = StabilizedMatch(steps, reverse, output, out_axis, output, last_used, an,
                            (min(idx), len(steps)), has_bonus=steps[0].before,
                            has_values=steps[0].num is not None,
                            channel_w=all(_invariant(an, s.w, steps[0].w) for s in steps),
                            channel_u=all((s.u is None and steps[0].u is None) or
                                          (s.u is not None and steps[0].u is not None and _invariant(an, s.u, steps[0].u))
                                          for s in steps),
                            bindings=tuple(sorted((v.name for v in region if v is not None),
                                                  key=lambda n: (len(n), n))))
    if tensor_dtype(steps[0].k) not in SUPPORTED_DTYPES:
        raise NotStabilized(f"dtype {tensor_dtype(steps[0].k)}: scans take {'/'.join(SUPPORTED_DTYPES)}")
    if len(tensor_shape(steps[0].m) or ()) != 2:
        raise NotStabilized(f"the state has shape {tensor_shape(steps[0].m)}; the scan takes (batch, channels)")
    _check_numbers(reader, match)
    return match


def _invariant(an, x, first):
    """``x`` is ``first``, or computed alike from the same values with no per-step slice (a
    bf16 model casts its decay to float32 in every step: one cast per step, the same value)."""
    if x.same_as(first):
        return True
    tx, tf = an.template(x), an.template(first)
    return tx.index is None and tf.index is None and tx.key == tf.key


def emit_stabilized(bb, match, visit):
    """Emit ``match``'s scan with ``bb``; ``visit`` maps an original expression to the new
    function's.  Returns ``[(old var, new expr)]``: the stacked output and, where read, the
    final states."""
    emit = bb.emit
    first = match.steps[0]
    lifter = Lifter(match.analysis, match.window, emit, visit)
    batch, channels = tensor_shape(first.m)
    dtype = tensor_dtype(first.k)

    def seq(expr, what):
        """A per-step operand as (B, L, C) in ``dtype``, forward order of the slices."""
        e, tax = lifter.lift(expr)
        if tax is None:
            raise NotStabilized(f"{what} does not vary over time")
        shape = tensor_shape(e)
        e = emit(relax.op.permute_dims(e, [i for i in range(len(shape)) if i != tax][:1] + [tax] +
                                       [i for i in range(len(shape)) if i != tax][1:])) if tax != 1 else e
        e = emit(relax.op.reshape(e, (batch, match.length, channels))) if tensor_shape(e) != (batch, match.length, channels) else e
        return e if tensor_dtype(e) == dtype else emit(relax.op.astype(e, dtype))

    def per_channel(expr, what):
        e = visit(expr)
        shape = tensor_shape(e)
        if shape is None or int(np.prod(shape)) != channels or (shape and shape[-1] != channels):
            raise NotStabilized(f"{what} has shape {shape}, not one value per channel")
        e = emit(relax.op.reshape(e, (channels,))) if shape != (channels,) else e
        return e if tensor_dtype(e) == "float32" else emit(relax.op.astype(e, "float32"))

    def state(expr):
        e = visit(expr)
        if tensor_shape(e) != (batch, channels):
            e = emit(relax.op.broadcast_to(e, (batch, channels)))
        return e if tensor_dtype(e) == "float32" else emit(relax.op.astype(e, "float32"))

    k = seq(first.k, "the key")
    v = seq(first.v, "the value") if match.has_values else None
    w = per_channel(first.w, "the decay") if match.channel_w else seq(first.w, "the decay")
    u = None
    if match.has_bonus:
        if not match.channel_u:
            raise NotStabilized("the bonus changes over time")
        u = per_channel(first.u, "the bonus") if first.u is not None else \
            relax.const(np.zeros(channels, np.float32), "float32")
    h0 = ([state(first.prev_num)] if match.has_values else []) + [state(first.prev_den), state(first.prev_m)]
    got = emit_stabilized_scan(emit, k, v, w, u, h0, match.reverse, match.last_used, "time_major")
    out, parts = (got[0], got[1:]) if match.last_used else (got, [])
    target = tensor_shape(match.output)
    if match.out_axis != 1 or tuple(target) != (batch, match.length, channels):
        out = emit(relax.op.reshape(out, (batch, match.length, channels)))
        rank = len(target)
        if match.out_axis != 1:
            out = emit(relax.op.permute_dims(out, [0, 2, 1] if rank == 3 and match.out_axis == 2 else [0, 1, 2]))
        out = emit(relax.op.reshape(out, target))
    if tensor_dtype(out) != tensor_dtype(match.output):
        out = emit(relax.op.astype(out, tensor_dtype(match.output)))
    replaced = [(match.output, out)]
    last = match.steps[-1]
    for old, new in zip([x for x in (last.num, last.den, last.m) if x is not None], parts):
        if tensor_dtype(old) != "float32":
            new = emit(relax.op.astype(new, tensor_dtype(old)))
        replaced.append((old, new))
    return replaced


def find_stabilized_scans(mod):
    """The stabilized loops of every Relax function in ``mod`` as ``chains.Recurrence``s of
    form ``"stabilized"``: accepted ones carry their match (``rec.stabilized``), near misses
    the reason (what ``FuseAffineRecurrences`` reports and rewrites, like its other forms)."""
    from ...chains import Recurrence  # pylint: disable=import-outside-toplevel

    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for var, match in find_stabilized(func, value, _users(func)):
            if isinstance(match, StabilizedMatch):
                first = match.steps[0]
                found.append(Recurrence(gvar.name_hint, "stabilized", match.length, match.out_axis,
                                        match.reverse, tensor_shape(first.prev_den), tensor_dtype(first.k),
                                        match.bindings, stabilized=match))
            else:
                found.append(Recurrence(gvar.name_hint, "stabilized", 0, 0, False, tensor_shape(var) or (),
                                        tensor_dtype(var), (var.name,), rejected=True,
                                        reason=f"a max-stabilized loop from {var.name} is not a "
                                               f"stabilized scan: {match}"))
    return found


_users = users_of      # (mlstm.py and delta.py read it from here)


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans            # emit_at var -> StabilizedMatch
        self.replaced = []

    def visit_var_binding_(self, binding):
        match = self.plans.get(binding.var)
        if match is not None:
            for old, new in emit_stabilized(self.builder_, match, self.visit_expr):
                if not isinstance(old, relax.DataflowVar) and self.builder_.current_block_is_dataflow():
                    new = self.builder_.emit_output(new)
                self.set_var_remap(old, new)
                self.replaced.append((old, new))
            return
        super().visit_var_binding_(binding)


def fuse_stabilized(mod):
    """``(new module, [(function name, var, match or reason, validated seconds)])``: every
    stabilized loop of ``mod``'s Relax functions rewritten into one scan and validated
    (``validate.py``); one that fails validation is left as it was, with the reason."""
    import tvm  # pylint: disable=import-outside-toplevel

    from ...validate import validate  # pylint: disable=import-outside-toplevel

    mod = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)   # the caller's stays as it is
    report = []
    for gvar, func in list(mod.functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for var, match in find_stabilized(func, value, _users(func)):
            if isinstance(match, str):
                report.append((gvar.name_hint, var, match, None))
                continue
            rewriter = _Rewriter(mod, {match.emit_at: match})
            try:
                new_func = prune_dead_bindings(rewriter.visit_expr(mod[gvar]))
            except (NotStabilized, ValueError, TypeError, RuntimeError) as err:
                report.append((gvar.name_hint, var, f"could not be emitted: {err}", None))
                continue
            ok, why, seconds = validate(mod[gvar], new_func, rewriter.replaced)
            if not ok:
                report.append((gvar.name_hint, var, f"validation failed: {why}", seconds))
                continue
            mod[gvar] = new_func
            func = new_func
            report.append((gvar.name_hint, var, match, seconds))
    return mod, report


def FuseStabilizedScans():  # noqa: N802 (TVM pass naming)
    """The module pass of ``fuse_stabilized`` (until ``FuseAffineRecurrences`` calls it)."""
    import tvm  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.FuseStabilizedScans")
    def _pass(mod, _ctx):
        return fuse_stabilized(mod)[0]

    return _pass
