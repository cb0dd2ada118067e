"""Reading an unrolled loop of max-stabilized steps (``stabilized.py``'s steps 1-3; the mLSTM
and delta-rule readers of ``mlstm.py`` and ``delta.py`` build on it): the max chain, each
step's coupled states and readout, and where the stacked output goes.  What the steps
compute is checked by the form that reads them."""
from dataclasses import dataclass, field

from tvm import relax
from tvm.ir.expr import GenericConst

from scanweaver_core.exprs import VarMap, op_name, tensor_shape

from ...steps import Analysis

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


def _analysis(bindings):
    """Slice templates of every binding, made in binding order (each reads its operands'
    memoized ones: no recursion through a long unrolled loop)."""
    an = Analysis(bindings)
    for b in bindings:
        if isinstance(b, relax.VarBinding):
            an.template(b.var)
    return an
