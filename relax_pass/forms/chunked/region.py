"""A chunked region's frame, shared by the chunked forms (``chunked.py``, ``mlstm_chunked.py``,
``delta_chunked.py``): the reshapes that split time into blocks (``Entry``) and merge them back
(``Exit``), one function's binding facts (``_Facts``), the bindings between them (``_region``),
a probe run of a region on chosen inputs (``_Probe``), and what only dead code reads (``_dead``)."""
from dataclasses import dataclass

import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name, tensor_shape

from ...interpret import Interpreter, read_vars, slice_span


@dataclass(frozen=True)
class Entry:
    """A view of one block of time: a reshape that splits time (dim ``axis`` of its input)
    into ``(chunks, chunk)``, or a slice ``[start, stop)`` of it (``span``; a block loop)."""
    var: relax.Var
    source: relax.Var       # the tensor it views, below its zero padding on that axis
    axis: int
    blocks: tuple           # (chunks, chunk); None for a slice
    span: tuple = None      # (start, stop) of a slice

    @property
    def key(self):
        """What exits it may feed: merges of the same blocks, or concats of its source's length."""
        return self.blocks if self.span is None else ("slices", tensor_shape(self.source)[self.axis])


@dataclass(frozen=True)
class Exit:
    """Where blocks are merged back: a reshape of ``blocks``, or a concat along ``axis``."""
    var: relax.Var
    axis: int
    blocks: tuple           # (chunks, chunk); None for a concat
    length: int             # its extent on ``axis``

    @property
    def key(self):
        return self.blocks if self.blocks is not None else ("slices", self.length)


def _split_axis(shape_in, shape_out):
    """``axis`` when ``shape_out`` is ``shape_in`` with dim ``axis`` split in two (the
    second of at least 2), else None."""
    if shape_in is None or shape_out is None or len(shape_out) != len(shape_in) + 1:
        return None
    for i in range(len(shape_in)):
        if (shape_out[:i] == shape_in[:i] and shape_out[i + 2:] == shape_in[i + 1:]
                and shape_out[i] * shape_out[i + 1] == shape_in[i] and shape_out[i + 1] >= 2):
            return i
    return None


def _unpadded(value_of, x, axis):
    """``x`` below zero padding at the end of ``axis`` (``F.pad``), and its length there."""
    while True:
        val = value_of.get(x)
        if op_name(val) != "relax.nn.pad" or float(val.attrs.pad_value) != 0.0:
            break
        width = [int(w) for w in val.attrs.pad_width]
        if any(w for d, w in enumerate(width) if d not in (2 * axis + 1,)):
            break
        x = val.args[0]
    return x


def entries_and_exits(bindings, value_of):
    """The function's block views (``Entry``: time-splitting reshapes, slices) and block
    merges (``Exit``: reshapes, concats along one axis)."""
    entries, exits = [], []
    for b in bindings:
        val = b.value
        name = op_name(val)
        if name == "relax.strided_slice" and isinstance(val.args[0], relax.Var):
            span = slice_span(val)
            if span is not None:
                entries.append(Entry(b.var, val.args[0], span[0], None, span[1:]))
            continue
        if name == "relax.concat" and isinstance(val.args[0], relax.Tuple) and len(val.args[0].fields) >= 2:
            shape = tensor_shape(b.var)
            if shape is not None and val.attrs.axis is not None:
                axis = int(val.attrs.axis) % len(shape)
                exits.append(Exit(b.var, axis, None, shape[axis]))
            continue
        if name != "relax.reshape" or not isinstance(val.args[0], relax.Var):
            continue
        src, out = tensor_shape(val.args[0]), tensor_shape(b.var)
        axis = _split_axis(src, out)
        if axis is not None:
            entries.append(Entry(b.var, _unpadded(value_of, val.args[0], axis), axis,
                                 (out[axis], out[axis + 1])))
            continue
        axis = _split_axis(out, src)
        if axis is not None:
            exits.append(Exit(b.var, axis, (src[axis], src[axis + 1]), src[axis] * src[axis + 1]))
    return entries, exits


class _Facts:
    """One function's bindings: values, readers, order, what the entries taint, what is
    computed from constants alone."""

    def __init__(self, func):
        self.bindings = [b for blk in func.body.blocks for b in blk.bindings]
        self.value = VarMap((b.var, b.value) for b in self.bindings)
        self.order = VarMap((b.var, i) for i, b in enumerate(self.bindings))
        self.reads = VarMap((b.var, read_vars(b.value)) for b in self.bindings)
        self.users = VarMap()
        for b in self.bindings:
            for v in self.reads[b.var]:
                self.users.setdefault(v, []).append(b.var)
        for v in relax.analysis.free_vars(func.body.body):
            self.users.setdefault(v, []).append("return")
        self._constant = VarMap()

    def tainted(self, entries):
        """The bindings computed from an entry (the entries included)."""
        seeds = VarMap((e.var, True) for e in entries)
        out = VarMap(seeds.items())                 # (an entry may be a parameter)
        for b in self.bindings:
            if b.var in seeds or any(v in out for v in self.reads[b.var]):
                out[b.var] = True
        return out

    def constant(self, var):
        """Whether ``var`` is computed from constants alone (masks, aranges)."""
        stack = [var]
        while stack:
            v = stack[-1]
            if v in self._constant:
                stack.pop()
                continue
            if v not in self.value:                # a parameter
                self._constant[v] = False
                stack.pop()
                continue
            pending = [r for r in self.reads[v] if r not in self._constant]
            if pending:
                stack.extend(pending)
                continue
            self._constant[v] = all(self._constant[r] for r in self.reads[v])
            stack.pop()
        return self._constant[var]


def _region(facts, exit_var, tainted, entries):
    """The bindings the exit is computed from that are computed from the entries (the exit
    and those entries included): walked back from the exit through tainted bindings, not
    past an entry."""
    is_entry = VarMap((e.var, True) for e in entries)
    seen, stack = VarMap(), [exit_var]
    while stack:
        v = stack.pop()
        if v in seen or v not in tainted:
            continue
        seen[v] = True
        if v not in is_entry:
            stack.extend(facts.reads[v])
    region = VarMap()
    for v in sorted(seen.keys(), key=lambda x: facts.order.get(x, -1)):
        if v in is_entry or any(r in region for r in facts.reads[v]):
            region[v] = True
    return region


class _Probe:
    """Evaluate the region's outputs from values of its inputs (constants computed once)."""

    def __init__(self, facts, region, inputs):
        self.facts, self.inputs = facts, inputs
        self.base = VarMap()
        self.region = region

    def evaluator(self, env):
        """An interpreter of the function from ``env`` (what it computes is kept)."""
        interp = Interpreter(self.facts.value)
        for v, x in self.base.items():
            interp.memo[v] = x
        for v, x in env.items():
            interp.memo[v] = x
        return interp

    def __call__(self, env, targets):
        interp = self.evaluator(env)
        out = [np.asarray(interp(t), dtype=np.float64) for t in targets]
        for v, x in interp.memo.items():         # keep what reads only constants
            if v not in env and v not in self.region and v not in self.base and self.facts.constant(v):
                self.base[v] = x
        return out


def _dead(facts, var, budget=16):
    """Nothing reads ``var`` (or only bindings nothing reads: an in-place write's export takes
    the old slice and drops it)."""
    users = facts.users.get(var, [])
    if budget == 0 or "return" in users:
        return not users
    return all(_dead(facts, u, budget - 1) for u in users)
