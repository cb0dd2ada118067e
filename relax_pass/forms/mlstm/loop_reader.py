"""Reading an unrolled loop of max-rescaled matrix states, shared by the mLSTM and delta readers.

``mlstm.py`` and ``delta.py`` read their loops with the same tools: ``_MReader`` (the
stabilized reader's max chain, plus each step's rescalings and the states they make),
``_Probe`` (one step evaluated in float64 from chosen previous states), ``_closure`` (the vars
a value reads) and ``_step_window`` (the time window the per-step operands slice).  They live
here, apart from the mLSTM's own checks and emitter, so that the delta reader does not import
them from another form's matcher.
"""
import numpy as np
import tvm_ffi
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name

from ...interpret import Interpreter
from ..stabilized.reader import _Reader


VIEWS = ("relax.expand_dims", "relax.reshape", "relax.broadcast_to", "relax.squeeze")


class NotMLSTM(Exception):
    """The loop is not an mLSTM scan (the message says why)."""


def _args(value):
    return list(value.args) if isinstance(value, relax.Call) else []


class _MReader(_Reader):
    """``_Reader`` (the max chain, the writes) with the mLSTM's states and operands."""

    def through_views(self, x):
        """``x`` and every var that is a view of it (users through view ops)."""
        out, frontier = [x], [x]
        while frontier:
            nxt = []
            for v in frontier:
                for u in self.users.get(v, []):
                    if u != "return" and op_name(self.val(u)) in VIEWS and u not in out:
                        nxt.append(u)
            out += nxt
            frontier = nxt
        return out

    def same(self, a, b):
        """``a`` and ``b`` are the same value: one var, or two bindings of one expression
        (export repeats ``i[:, :, t]`` where the code writes it twice)."""
        if a.same_as(b):
            return True
        va, vb = self.val(a), self.val(b)
        return va is not None and vb is not None and tvm_ffi.structural_equal(va, vb)

    def rescalings(self, step):
        """``(e_f, e_i)``: ``exp(f + m_{t-1} - m_t)`` and ``exp(i - m_t)`` of this step."""
        e_f = e_i = None
        for e, x in self._exps_of(step.m).items():
            if self.same(x, step.i):
                e_i = e
            elif op_name(self.val(x)) == "relax.add":
                pair = _args(self.val(x))
                if any(self.same(a, step.f) for a in pair) and any(a.same_as(step.prev_m) for a in pair):
                    e_f = e
        if e_f is None or e_i is None:
            raise NotMLSTM(f"step {step.m.name}: no exp(f + m - m_t) and exp(i - m_t) rescaling")
        for e in (e_f, e_i):        # the subtract under each exp, and f + m_{t-1}
            sub = _args(self.val(e))[0]
            step.inside.add(sub)
            x = _args(self.val(sub))[0]
            if isinstance(x, relax.Var) and op_name(self.val(x)) == "relax.add":
                step.inside.add(x)
        return e_f, e_i

    def states(self, step):
        """``[(S_t, S_prev, Y_t, inside)]``: the states this step's rescalings make."""
        e_f, e_i = self.rescalings(step)
        inputs = VarMap((x, True) for x in self.through_views(e_i))
        found = []
        for ef in self.through_views(e_f):
            for mul in self.users.get(ef, []):
                if mul == "return" or op_name(self.val(mul)) != "relax.multiply":
                    continue
                a, b = _args(self.val(mul))
                prev = b if a.same_as(ef) else a
                for add in self.users.get(mul, []):
                    if add == "return" or op_name(self.val(add)) != "relax.add":
                        continue
                    p, q = _args(self.val(add))
                    other = q if p.same_as(mul) else p
                    if op_name(self.val(other)) != "relax.multiply":
                        continue
                    x, y = _args(self.val(other))
                    if x in inputs:
                        found.append((add, prev, y, {add, mul, other, ef}))
                    elif y in inputs:
                        found.append((add, prev, x, {add, mul, other, ef}))
        step.inside |= {e_f, e_i} | set(self.through_views(e_f)) | set(self.through_views(e_i))
        return found


def _step_window(an, steps, names, read, error, others):
    """``(reverse, (start, length))``: the time window every operand ``names`` (``read(step,
    name)``) reads, each step one slice of one tensor at consecutive time indices, all running
    together; else ``error`` naming the operand (``others``: what the later operands run with,
    for the message).  Only the first, second and last steps are read."""
    window = reverse = None
    for name in names:
        idx = [an.template(read(steps[i], name)).index for i in (0, 1, -1)]
        if any(not isinstance(x, int) for x in idx):
            raise error(f"the {name} operands are not per-step slices of one tensor")
        delta = idx[1] - idx[0]
        if delta not in (1, -1) or idx[2] != idx[0] + delta * (len(steps) - 1):
            raise error(f"the {name} operands' time indices are not consecutive: {idx}")
        here = (delta == -1, (min(idx[0], idx[2]), len(steps)))
        if (reverse, window) != (None, None) and here != (reverse, window):
            raise error(f"the {name} operands do not run with {others}")
        reverse, window = here
    return reverse, window


def _closure(reader, roots, stop, depth=12):
    """Vars that ``roots`` read (backwards, ``depth`` levels), not crossing ``stop``."""
    seen, frontier = VarMap(), list(roots)
    for _ in range(depth):
        nxt = []
        for x in frontier:
            for a in _args(reader.val(x)):
                if isinstance(a, relax.Var) and a not in seen and a not in stop:
                    seen[a] = True
                    nxt.append(a)
        frontier = nxt
    return list(seen.keys())


class _Probe:
    """Evaluate one step with chosen previous states (float64); everything else is computed
    from the probe inputs (``leaf``), so no value of another evaluation leaks in, and a value
    the interpreter cannot compute (an op upstream it has no meaning for) is a probe input too:
    the step is checked against its own operands, whatever made them."""

    def __init__(self, reader, given, leaf):
        self.given = given
        self.side = Interpreter(reader.vmap, missing=leaf, opaque=reader.vmap,
                                shared=lambda v: given[v] if v in given else None)

    def __call__(self, x):
        return np.asarray(self.side(x), dtype=np.float64)
