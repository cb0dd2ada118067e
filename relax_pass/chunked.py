"""Matrix-state scans written in their chunked (parallel) form: Mamba-2's SSD, chunk-wise GLA.

Models shipped since 2024 compute ``S_t = g_t S_{t-1} + k_t v_t^T, o_t = q_t^T S_t`` with no
loop over time: the sequence is zero-padded to a multiple of a chunk length and reshaped into
(chunks, chunk) blocks; a cumsum of the log-decay, masked pairwise differences, contractions
within each chunk and a state passed from chunk to chunk (a loop over chunks or a masked
contraction over them) make the output, reshaped back.  Found by what it computes:

1. the *region*: the bindings between the reshapes that split time into blocks (its entries)
   and one that merges blocks back (its exit), holding a ``cumsum``;
2. its *operands*: the tensors the entries reshape (seen through their zero padding), and any
   other data it reads (an initial state);
3. their roles and layouts: the operand its cumsums sum is the log-decay, the others are q, k
   and v (v has the output's extents; else probe runs tell); each tensor's dims
   get batch/head/feature labels consistent with their extents; the first assignment whose
   output equals ``reference.matrix_scan`` (and whose other outputs equal its final state) is
   the match.  The rewrite is then validated like every other (``validate.py``).
"""
import itertools
from dataclasses import dataclass

import numpy as np
from tvm import relax

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, call_args, error_line, op_name, tensor_dtype, tensor_shape
from scanweaver_core.spec import SUPPORTED_DTYPES, MatrixScanSpec

from .interpret import Interpreter, Unsupported, const_ints
from .narrow import narrowed

MAX_CANDIDATES = 96     # role/layout assignments checked against the oracle per region
RTOL = 1e-6


class NotChunked(Exception):
    """The region is not a chunked matrix scan (the message says why)."""


@dataclass(frozen=True)
class Operand:
    """A tensor of the graph read as a scan operand: ``labels[d]`` names what dim ``d`` runs
    along (``"B"``, ``"H"``, ``"L"``, ``"K"``, ``"V"``; None for a unit dim).  ``expr``, when
    given, is what to emit instead: ``var`` below the broadcast that repeats it over heads
    (``narrow.narrowed``: Mamba-2's B and C with one group), unbound."""
    var: relax.Var
    labels: tuple
    expr: object = None

    def source(self):
        return self.var if self.expr is None else self.expr


@dataclass(frozen=True)
class Entry:
    """A reshape that splits time (dim ``axis`` of its input) into ``(chunks, chunk)``."""
    var: relax.Var
    source: relax.Var       # the tensor it reshapes, below its zero padding on that axis
    axis: int
    blocks: tuple           # (chunks, chunk)


@dataclass
class ChunkedMatch:
    """What the rewrite emits for one region."""
    spec: MatrixScanSpec
    q: Operand
    k: Operand
    v: Operand
    log_decay: Operand       # or None (no decay)
    h0: Operand              # or None
    output: relax.Var        # the exit: the blocks merged back (time padded to ``padded``)
    out_labels: tuple
    padded: int
    final: tuple             # ((var, labels), ...): other uses that are the final state
    emit_at: relax.Var       # the first of output / final vars in binding order
    region: frozenset        # the region's bindings (replaced)

    def inputs(self):
        """The tensors the region is computed from (all but constants)."""
        found = []
        for op in (self.q, self.k, self.v, self.log_decay, self.h0):
            if op is not None:
                found.extend(v for v in relax.analysis.free_vars(op.source()) if v not in found) \
                    if op.expr is not None else found.append(op.var)
        return found


# ---------------------------------------------------------------- the region

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
    """The function's time-splitting reshapes (``Entry``) and block-merging ones (``(var,
    axis, blocks)``)."""
    entries, exits = [], []
    for b in bindings:
        val = b.value
        if op_name(val) != "relax.reshape" or not isinstance(val.args[0], relax.Var):
            continue
        src, out = tensor_shape(val.args[0]), tensor_shape(b.var)
        axis = _split_axis(src, out)
        if axis is not None:
            entries.append(Entry(b.var, _unpadded(value_of, val.args[0], axis), axis,
                                 (out[axis], out[axis + 1])))
            continue
        axis = _split_axis(out, src)
        if axis is not None:
            exits.append((b.var, axis, (src[axis], src[axis + 1])))
    return entries, exits


def _free_vars(value):
    """The vars ``value`` reads (the cheap walk: calls, tuples, tuple items)."""
    found, stack = [], [value]
    while stack:
        x = stack.pop()
        if isinstance(x, relax.Var):
            found.append(x)
        elif isinstance(x, relax.Tuple):
            stack.extend(x.fields)
        elif isinstance(x, relax.TupleGetItem):
            stack.append(x.tuple_value)
        elif isinstance(x, relax.Call):
            stack.extend(call_args(x))
    return found


class _Facts:
    """One function's bindings: values, readers, order, what the entries taint, what is
    computed from constants alone."""

    def __init__(self, func):
        self.bindings = [b for blk in func.body.blocks for b in blk.bindings]
        self.value = VarMap((b.var, b.value) for b in self.bindings)
        self.order = VarMap((b.var, i) for i, b in enumerate(self.bindings))
        self.reads = VarMap((b.var, _free_vars(b.value)) for b in self.bindings)
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
        out = VarMap()
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
    for v in sorted(seen.keys(), key=lambda x: facts.order[x]):
        if v in is_entry or any(r in region for r in facts.reads[v]):
            region[v] = True
    return region


# ---------------------------------------------------------------- evaluation

class _Probe:
    """Evaluate the region's outputs from values of its inputs (constants computed once)."""

    def __init__(self, facts, region, inputs):
        self.facts, self.inputs = facts, inputs
        self.base = VarMap()
        self.region = region

    def __call__(self, env, targets):
        interp = Interpreter(self.facts.value)
        for v, x in self.base.items():
            interp.memo[v] = x
        for v, x in env.items():
            interp.memo[v] = x
        out = [np.asarray(interp(t), dtype=np.float64) for t in targets]
        for v, x in interp.memo.items():         # keep what reads only constants
            if v not in env and v not in self.region and v not in self.base and self.facts.constant(v):
                self.base[v] = x
        return out


def _labelings(shape, time_axis, allowed, required=()):
    """Each way to name the dims of ``shape``: ``time_axis`` is ``"L"`` (None: no time), unit
    dims are None, the others distinct labels of ``allowed`` (``required`` ones present);
    those keeping ``allowed``'s order first."""
    dims = [d for d, n in enumerate(shape) if d != time_axis and n != 1]
    out = []
    for names in itertools.permutations(allowed, len(dims)):
        if not set(required) <= set(names):
            continue
        labels = [None] * len(shape)
        if time_axis is not None:
            labels[time_axis] = "L"
        for d, name in zip(dims, names):
            labels[d] = name
        inversions = sum(allowed.index(a) > allowed.index(b) for a, b in itertools.combinations(names, 2))
        batch_only = "B" in names and "H" not in names      # (a unit batch is likelier)
        out.append(((inversions, batch_only), tuple(labels)))
    return [labels for _, labels in sorted(out, key=lambda p: p[0])]


def _extents(shape, labels, known):
    """``known`` extended by this tensor's labelled extents, or None when one disagrees."""
    known = dict(known)
    for n, label in zip(shape, labels):
        if label is None or label == "L":
            continue
        if known.setdefault(label, n) != n:
            return None
    return known


def to_canonical(x, labels, inner):
    """A numpy array in the scan's (B, H, L, inner) layout (1 where a label is absent)."""
    order = [labels.index(r) for r in ("B", "H", "L", inner) if r in labels]
    y = np.transpose(x, order + [d for d in range(x.ndim) if d not in order])
    kept = [r for r in ("B", "H", "L", inner) if r in labels]
    shape = [y.shape[kept.index(r)] if r in kept else 1 for r in ("B", "H", "L", inner)]
    return y.reshape(shape)


def from_canonical(o, labels, shape, roles=("B", "H", "L", "V")):
    """The inverse: ``o`` in ``roles`` order to a tensor of ``shape`` named by ``labels``."""
    kept = [r for r in labels if r is not None]
    o = o.reshape([o.shape[roles.index(r)] if r in kept else 1 for r in roles])
    o = np.squeeze(o, axis=tuple(i for i, r in enumerate(roles) if r not in kept))
    remaining = [r for r in roles if r in kept]
    return np.transpose(o, [remaining.index(r) for r in kept]).reshape(shape)


# ---------------------------------------------------------------- matching

def match_region(facts, exit_var, exit_axis, blocks, entries, tainted):
    """A ``ChunkedMatch`` for the region ending at ``exit_var``; raises ``NotChunked``."""
    region = _region(facts, exit_var, tainted, entries)
    mine = [e for e in entries if e.var in region]
    if not any(op_name(facts.value[v]) == "relax.cumsum"
               and (tensor_shape(v) or (0,))[int(facts.value[v].attrs.axis)] == blocks[1] for v in region):
        raise NotChunked("no cumsum over a block in it")
    sources = VarMap()
    for e in mine:
        sources.setdefault(e.source, e.axis)
    seq = list(sources.keys())
    shapes = {v: tensor_shape(v) for v in seq}
    padded = blocks[0] * blocks[1]
    if None in shapes.values():
        raise NotChunked("its inputs' shapes are not static")
    lengths = {shapes[v][sources[v]] for v in seq}
    length = min(lengths)
    if not lengths <= {length, padded}:       # (an input padded before it was scaled: its tail is
        raise NotChunked("its inputs do not share one length")   # never read by earlier steps)
    if length < 2:
        raise NotChunked("one step")            # (no scan; not reported, as for chains)
    if padded - length >= blocks[1]:
        raise NotChunked(f"its inputs' length {length} does not fill {blocks[0]} blocks of {blocks[1]}")
    side = []
    for v in region:
        for r in facts.reads[v]:
            if r not in region and r not in sources and not _pad_of(facts, r, sources) \
                    and not facts.constant(r) and r not in side:
                side.append(r)
    if len(seq) not in (3, 4) or len(side) > 1:
        raise NotChunked(f"it reads {len(seq)} blocked tensors and {len(side)} other ones "
                         "(a chunked matrix scan reads q, k, v and a log-decay, maybe an initial state)")
    external = []
    for v in region:
        for u in facts.users.get(v, []):
            if (u != "return" and u not in region and v != exit_var and u not in external
                    and not _dead(facts, u)):
                external.append(u)
            if u == "return" and v != exit_var:
                raise NotChunked(f"its intermediate {v.name} is returned")
    out_var, out_padded = exit_var, padded
    cut = _prefix_cut(facts, exit_var, exit_axis)
    if cut == length:                     # the exit's one use drops the padding: replace that
        out_var, out_padded = facts.users[exit_var][0], length
    dtype = tensor_dtype(exit_var)
    if dtype not in SUPPORTED_DTYPES or any(tensor_dtype(v) != dtype for v in seq):
        raise NotChunked(f"dtypes {sorted({tensor_dtype(v) for v in seq} | {dtype})}: one of "
                         f"{'/'.join(SUPPORTED_DTYPES)} is needed throughout")

    log_decay = _log_decay(facts, region, blocks, sources)
    linear = [v for v in seq if log_decay is None or not v.same_as(log_decay)]
    if len(linear) != 3:
        raise NotChunked(f"of its {len(seq)} blocked inputs {len(seq) - len(linear)} reach its "
                         "cumsums (a chunked matrix scan has one log-decay besides q, k and v)")
    probe = _Probe(facts, region, seq + side)
    rng = np.random.default_rng(11)
    env = VarMap((v, rng.uniform(-0.5, 0.5, shapes[v])) for v in seq)
    for s in side:        # zero for the probes of roles (an initial state adds an offset)
        env[s] = np.zeros(tensor_shape(s))
    try:
        orders = _role_orders(probe, out_var, linear, env, exit_axis, sources, length)
    except (Unsupported, ValueError, TypeError, IndexError, KeyError, ArithmeticError) as err:
        raise NotChunked(f"it cannot be evaluated: {error_line(err)}") from None
    for s in side:
        env[s] = rng.uniform(-1.0, 1.0, tensor_shape(s))
    # the oracle's inputs: decays below 1, the others as before
    if log_decay is not None:
        env[log_decay] = rng.uniform(-0.6, 0.0, shapes[log_decay])
    outs = probe(env, [out_var] + external)
    y, ext_values = outs[0], outs[1:]
    match = _assign(orders, env, y, ext_values, out_var, exit_axis, log_decay, side,
                    external, sources, length, out_padded)
    emit_at = min([out_var] + [f for f, _ in match["final"]], key=lambda v: facts.order[v])
    last_input = max((facts.order[v] for v in seq + side if v in facts.order), default=-1)
    if last_input > facts.order[emit_at]:
        raise NotChunked("an input is bound after the first of its outputs")
    for role in ("q", "k"):
        match[role] = _shared(facts, match[role])
    spec = match["spec"]
    match["spec"] = MatrixScanSpec.create(
        spec.batch, spec.heads, spec.length, spec.key, spec.value,
        q_shape=_logical(match["q"].labels, spec, "K"), k_shape=_logical(match["k"].labels, spec, "K"),
        v_shape=spec.v_shape, decay=spec.decay, g_shape=spec.g_shape if spec.decay != "none" else None,
        has_h0=spec.has_h0, dtype=spec.dtype, return_last_state=spec.return_last_state)
    return ChunkedMatch(output=out_var, padded=out_padded, emit_at=emit_at, region=frozenset(region.keys()),
                        **match)


def _shared(facts, op):
    """``op`` read below a broadcast over its batch or head dims, when it is one (a tensor
    shared by every head is read once by the kernel, not repeated)."""
    expr, shape = narrowed(facts.value, op.var)
    if expr.same_as(op.var) or len(shape) != len(op.labels):
        return op
    full = tensor_shape(op.var)
    labels = list(op.labels)
    for d, (n, m) in enumerate(zip(full, shape)):
        if n != m:
            if m != 1 or labels[d] not in ("B", "H"):
                return op
            labels[d] = None
    return Operand(op.var, tuple(labels), expr)


def _logical(labels, spec, inner):
    return (spec.batch if "B" in labels else 1, spec.heads if "H" in labels else 1, spec.length,
            spec.key if inner == "K" else spec.value)


def _dead(facts, var, budget=16):
    """Nothing reads ``var`` (or only bindings nothing reads: an in-place write's export takes
    the old slice and drops it)."""
    users = facts.users.get(var, [])
    if budget == 0 or "return" in users:
        return not users
    return all(_dead(facts, u, budget - 1) for u in users)


def _prefix_cut(facts, var, axis):
    """``n`` when the one use of ``var`` is ``var[..., :n, ...]`` along ``axis``, else None."""
    users = facts.users.get(var, [])
    if len(users) != 1 or users[0] == "return":
        return None
    val = facts.value[users[0]]
    if op_name(val) != "relax.strided_slice":
        return None
    shape = tensor_shape(var)
    try:
        axes, begin, end = (const_ints(a) for a in val.args[1:4])
        strides = const_ints(val.args[4]) if len(val.args) > 4 else [1]
    except (TypeError, ValueError, AttributeError):
        return None
    if [a % len(shape) for a in axes] != [axis] or begin != [0] or strides != [1]:
        return None
    return min(end[0] if end[0] >= 0 else end[0] + shape[axis], shape[axis])


def _pad_of(facts, r, sources):
    """``r`` pads one of the sources (read by an entry)."""
    val = facts.value.get(r)
    while op_name(val) == "relax.nn.pad":
        if val.args[0] in sources:
            return True
        val = facts.value.get(val.args[0])
    return False


def _assign(orders, env, y, ext_values, exit_var, exit_axis, log_decay, side, external,
            sources, length, padded):
    """The first role/layout assignment under which the oracle gives ``y`` (and the external
    uses are its final state)."""
    y_shape = tensor_shape(exit_var)
    checked = 0
    for q, k, v in orders:
        for out_labels in _labelings(y_shape, exit_axis, ("B", "H", "V"), ("V",)):
            # (the output is full on batch and heads: a lane it lacks has extent 1 everywhere)
            known0 = _extents(y_shape, out_labels, {r: 1 for r in ("B", "H") if r not in out_labels})
            for v_labels in _labelings(tensor_shape(v), sources[v], ("B", "H", "V"), ("V",)):
                known1 = _extents(tensor_shape(v), v_labels, known0)
                if known1 is None:
                    continue
                for k_labels, q_labels in _key_labelings(q, k, sources, known1):
                    known2 = _extents(tensor_shape(q), q_labels,
                                      _extents(tensor_shape(k), k_labels, known1))
                    for g_labels in _decay_labelings(log_decay, sources, known2):
                        for h0_labels in _state_labelings(side, known2):
                            checked += 1
                            if checked > MAX_CANDIDATES:
                                raise NotChunked(f"no assignment of q, k, v and their dims among the "
                                                 f"first {MAX_CANDIDATES} gives the matrix scan")
                            got = _oracle(env, y, (q, q_labels), (k, k_labels), (v, v_labels),
                                          log_decay, g_labels, side, h0_labels, y_shape, out_labels,
                                          known2, length, padded)
                            if got is None:
                                continue
                            final = _finals(external, ext_values, got[1], known2)
                            if final is None:
                                continue
                            spec = _spec(known2, length, (q, q_labels), (k, k_labels), (v, v_labels),
                                         log_decay, g_labels, bool(side), bool(final),
                                         tensor_dtype(exit_var))
                            return dict(spec=spec, q=Operand(q, q_labels), k=Operand(k, k_labels),
                                        v=Operand(v, v_labels),
                                        log_decay=None if log_decay is None else Operand(log_decay, g_labels),
                                        h0=Operand(side[0], h0_labels) if side else None,
                                        out_labels=out_labels, final=tuple(final))
    if external:
        raise NotChunked(f"no assignment gives the matrix scan with "
                         f"{', '.join(u.name for u in external)} as its final state")
    raise NotChunked("no assignment of q, k, v and their dims gives the matrix scan")


def _dim_sizes(x, time_axis):
    """The extents of ``x``'s dims other than time and unit ones, sorted."""
    return sorted(n for d, n in enumerate(tensor_shape(x)) if d != time_axis and n != 1)


def _role_orders(probe, exit_var, linear, env, exit_axis, sources, length):
    """(q, k, v) orders of the three linear inputs, likeliest first: v has the output's
    extents; when the extents do not tell (v's are q's or k's), one element changed at a step
    changes the output at that step only through q, at every later step through k and v, and
    at one feature only through v (a probe run per input)."""
    orders = list(itertools.permutations(linear))
    out_extents = _dim_sizes(exit_var, exit_axis)
    fits = [o for o in orders if _dim_sizes(o[2], sources[o[2]]) == out_extents]
    if 1 <= len(fits) <= 2:      # v known: the oracle tells q from k cheaper than a probe
        return fits + [o for o in orders if o not in fits]
    probed = linear
    y = probe(env, [exit_var])[0]
    t0 = length // 2
    reach = {x: (False, 0) for x in linear}
    for x in probed:
        env2 = VarMap(env.items())
        bumped = np.array(env[x])
        idx = [0] * bumped.ndim
        idx[sources[x]] = t0
        bumped[tuple(idx)] += 1.0
        env2[x] = bumped
        changed = np.abs(probe(env2, [exit_var])[0] - y) > 1e-12 * max(1.0, float(np.max(np.abs(y))))
        per_step = np.moveaxis(changed, exit_axis, 0).reshape(changed.shape[exit_axis], -1)
        reach[x] = (list(np.nonzero(per_step.any(1))[0]) == [t0], int(changed.sum()))

    def unlikely(order):
        q, k, v = order
        return (order not in fits, not reach[q][0], reach[k][1] < reach[v][1])
    return sorted(orders, key=unlikely)


def _log_decay(facts, region, blocks, sources):
    """The blocked input the region's cumsums over a block are computed from (the log-decay;
    None when none is), or NotChunked when several are."""
    cumsums = [v for v in region if op_name(facts.value[v]) == "relax.cumsum"]
    reached = set()
    for c in cumsums:
        seen, stack = VarMap(), [c]
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen[v] = True
            if v in sources:
                reached.add(v)
            elif v in region or _pad_of(facts, v, sources):
                stack.extend(facts.reads[v])
            elif v in facts.value and op_name(facts.value[v]) == "relax.reshape":
                stack.extend(facts.reads[v])          # an entry's reshape
    if len(reached) > 1:
        raise NotChunked(f"its cumsums read {len(reached)} of its blocked inputs "
                         "(a chunked matrix scan sums one log-decay)")
    return next(iter(reached), None)


def _key_labelings(q, k, sources, known):
    for k_labels in _labelings(tensor_shape(k), sources[k], ("B", "H", "K"), ("K",)):
        known_k = _extents(tensor_shape(k), k_labels, known)
        if known_k is None:
            continue
        for q_labels in _labelings(tensor_shape(q), sources[q], ("B", "H", "K"), ("K",)):
            if _extents(tensor_shape(q), q_labels, known_k) is not None:
                yield k_labels, q_labels


def _decay_labelings(log_decay, sources, known):
    if log_decay is None:
        yield None
        return
    shape = tensor_shape(log_decay)
    for labels in _labelings(shape, sources[log_decay], ("B", "H", "K")):
        if _extents(shape, labels, known) is not None:
            yield labels


def _state_labelings(side, known):
    if not side:
        yield None
        return
    shape = tensor_shape(side[0])
    for labels in _labelings(shape, None, ("B", "H", "K", "V"), ("K", "V")):
        if _extents(shape, labels, known) is not None:
            yield labels


def _full(known, role):
    return known.get(role, 1)


def _oracle(env, y, q, k, v, log_decay, g_labels, side, h0_labels, y_shape, out_labels, known,
            length, padded):
    """``(o in the exit's layout, final state (B, H, K, V))`` of the matrix scan under this
    assignment when it equals the region's output, else None."""
    qa, ka, va = (to_canonical(env[x], labels, inner)[:, :, :length] for (x, labels), inner in
                  ((q, "K"), (k, "K"), (v, "V")))
    g, decay = None, "none"
    if log_decay is not None:
        decay = "key" if "K" in g_labels else "scalar"
        g = np.exp(to_canonical(env[log_decay], g_labels, "K")[:, :, :length])
    h0 = None
    if side:
        h0 = _state_canonical(env[side[0]], h0_labels, known)
    try:
        o, last = reference.matrix_scan(qa, ka, va, g, decay=decay, h0=h0, return_last_state=True)
    except ValueError:                              # shapes the spec refuses
        return None
    bh = (_full(known, "B"), _full(known, "H"))
    if o.shape[:2] != bh:
        return None
    pad = [(0, 0)] * 4
    pad[2] = (0, padded - length)
    o_shape = list(y_shape)
    try:
        got = from_canonical(np.pad(o, pad), out_labels, o_shape)
    except ValueError:
        return None
    return (got, last) if _close(got, y) else None


def _close(a, b):
    return a.shape == b.shape and float(np.max(np.abs(a - b), initial=0.0)) <= RTOL * max(
        1.0, float(np.max(np.abs(b), initial=0.0)))


def _state_canonical(x, labels, known):
    order = [labels.index(r) for r in ("B", "H", "K", "V") if r in labels]
    y = np.transpose(x, order + [d for d in range(x.ndim) if d not in order])
    kept = [r for r in ("B", "H", "K", "V") if r in labels]
    return y.reshape([y.shape[kept.index(r)] if r in kept else 1 for r in ("B", "H", "K", "V")]) \
        * np.ones((_full(known, "B"), _full(known, "H"), 1, 1))


def _finals(external, ext_values, last, known):
    """``[(var, labels)]``: every external use is the final state in some layout, else None."""
    found = []
    for u, value in zip(external, ext_values):
        shape = tensor_shape(u)
        for labels in _labelings(shape, None, ("B", "H", "K", "V"), ("K", "V")):
            if _extents(shape, labels, known) is None:
                continue
            try:
                got = from_canonical(last, labels, shape, roles=("B", "H", "K", "V"))
            except ValueError:
                continue
            if _close(got, value):
                found.append((u, labels))
                break
        else:
            return None
    return found


def _spec(known, length, q, k, v, log_decay, g_labels, has_h0, final, dtype):
    def shape(labels, inner):
        return tuple(_full(known, r) if r in labels else 1 for r in ("B", "H")) + (length, _full(known, inner))

    decay, g_shape = "none", None
    if log_decay is not None:
        decay = "key" if "K" in g_labels else "scalar"
        g_shape = tuple(_full(known, r) if r in g_labels else 1 for r in ("B", "H")) + (
            length, _full(known, "K") if decay == "key" else 1)
    return MatrixScanSpec.create(
        _full(known, "B"), _full(known, "H"), length, _full(known, "K"), _full(known, "V"),
        q_shape=shape(q[1], "K"), k_shape=shape(k[1], "K"), v_shape=shape(v[1], "V"),
        decay=decay, g_shape=g_shape, has_h0=has_h0, dtype=dtype, return_last_state=final)


# ---------------------------------------------------------------- the driver

def find_chunked(func):
    """``[(exit var, ChunkedMatch | reason)]`` for the chunked regions of ``func``: every
    block-merging reshape computed from time-splitting ones through a cumsum, latest first; an
    exit inside a region already matched is not looked at again."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    facts = _Facts(func)
    entries, exits = entries_and_exits(facts.bindings, facts.value)
    if not entries or not exits:
        return []
    by_blocks, found, covered = {}, [], VarMap()
    for var, axis, blocks in reversed(exits):
        mine = [e for e in entries if e.blocks == blocks]
        if not mine:
            continue
        if blocks not in by_blocks:
            by_blocks[blocks] = facts.tainted(mine)
        tainted = by_blocks[blocks]
        if var in covered or var not in tainted:
            continue
        try:
            match = match_region(facts, var, axis, blocks, mine, tainted)
        except NotChunked as why:
            if not any(quiet in str(why) for quiet in ("no cumsum", "blocked tensors", "one step")):
                found.append((var, str(why)))
            continue
        for v in match.region:
            covered[v] = True
        found.append((var, match))
    return found[::-1]
