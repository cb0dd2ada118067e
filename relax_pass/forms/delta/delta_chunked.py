"""The gated delta rule in its chunked (WY / UT) form, read as one delta-rule scan.

transformers' ``torch_chunk_gated_delta_rule`` (what Qwen3-Next and its kin run for a prompt)
pads the sequence to a chunk multiple, forms ``k * beta`` and ``v * beta``, views q, k, k beta,
v beta and the log-decay as (chunks, chunk) blocks, sums the decay within each chunk, solves the
chunk's unit-triangular UT system (under export: a forward substitution, one row a step),
and carries the state from chunk to chunk in a loop.  It computes exactly ``DeltaScanSpec``'s
recurrence with ``D_t = exp(g_t)`` (padded steps have beta = 0 and g = 0: they change nothing).

Found by what it computes, as ``chunked.py`` finds Mamba-2's SSD:

1. the *region*: the bindings from the time-splitting reshapes to the reshape that merges the
   blocks back (``chunked.entries_and_exits`` / ``chunked._region``), holding a ``cumsum``; it
   reads five blocked tensors: a log-decay (what its cumsums sum) and four of one more dim;
2. *roles*: two of the four are products of the other two data tensors' kin with one
   per-step ``beta`` (``k beta`` = k times beta, ``v beta`` = v times beta, read below the
   blocks); k is the factor ``k beta`` shares with a blocked tensor, q the remaining one, v the
   other factor of ``v beta``;
3. *numbers*: the region evaluated on random q, k, v, beta and g (``k beta`` and ``v beta``
   formed from them as the graph does) must equal ``reference.delta_scan``, with a random
   initial state when it reads one, and the region's other uses its final state.

The rewrite is then validated like every other, locally (both sides from the same operands).
"""
from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.ir.expr import GenericConst

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, error_line, op_name, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_spec_scan
from scanweaver_core.spec import SUPPORTED_DTYPES, DeltaScanSpec

from ...interpret import EVAL_ERRORS
from ..chunked.region import _dead, _Probe
from ..mlstm.mlstm_chunked import _close, _reads_from, region_attempts

__all__ = ["ChunkedDeltaMatch", "NotChunkedDelta", "find_chunked_delta", "emit_chunked_delta"]

CHECK_RTOL = 1e-6      # the region against the oracle on fresh inputs
VIEWS = {f"relax.{n}" for n in ("reshape", "squeeze", "expand_dims", "broadcast_to", "astype", "nn.pad")}
QUIET = ("no cumsum in it", "five blocked tensors", "no delta products")   # whole reasons: no delta rule in sight


class NotChunkedDelta(Exception):
    """The region is not a chunked delta rule (the message says why)."""


@dataclass
class ChunkedDeltaMatch:
    """What ``emit_chunked_delta`` needs for one region."""
    spec: DeltaScanSpec
    q: relax.Var               # (B, H, L, K) sources, as the region reads them
    k: relax.Var
    v: relax.Var               # (B, H, L, V): the factor of v beta
    beta: relax.Var            # a view of (B, H, L)
    g: relax.Var               # (B, H, L) log-decay
    h0: object                 # the initial state var, or None
    output: relax.Var          # the merged blocks (replaced by the scan's o)
    final: tuple               # vars that are the final state
    emit_at: relax.Var
    region: frozenset
    inputs: tuple              # what validation draws at random


def _below_views(facts, var):
    """``var`` below its views and zero paddings (the operand it shows)."""
    while op_name(facts.value.get(var)) in VIEWS:
        var = facts.value[var].args[0]
        if not isinstance(var, relax.Var):
            return None
    return var


def _factors(facts, var):
    """``[a, b]`` when ``var`` is ``multiply(a, b)`` (each seen below its views), else None."""
    value = facts.value.get(_below_views(facts, var))
    if op_name(value) != "relax.multiply" or not all(isinstance(a, relax.Var) for a in value.args):
        return None
    return [_view_base(facts, a) for a in value.args]


class _Region:
    def __init__(self, facts, ex, entries, tainted):
        from ..chunked.region import _region  # pylint: disable=import-outside-toplevel
        self.facts, self.exit = facts, ex.var
        self.region = _region(facts, ex.var, tainted, entries)
        mine = [e for e in entries if e.var in self.region]
        self.entry_of = VarMap((e.var, e) for e in mine)
        self.sources = VarMap()
        for e in mine:
            self.sources.setdefault(e.source, e.axis)
        if "relax.cumsum" not in {op_name(facts.value.get(v)) for v in self.region}:
            raise NotChunkedDelta("no cumsum in it")
        side = []
        for v in self.region:
            for r in facts.reads[v]:
                if r in self.region or r in self.sources or facts.constant(r) or r in side:
                    continue
                side.append(r)
        self.side = side


def _roles(facts, reg):
    """``(q, k, v, beta, g, k_beta, v_beta)``: the sources' roles, read off their products."""
    seq = list(reg.sources.keys())
    if len(seq) != 5:
        raise NotChunkedDelta("five blocked tensors")     # (not a delta rule in sight: quiet)
    cumsums = [c for c in reg.region if op_name(facts.value.get(c)) == "relax.cumsum"
               and tensor_dtype(c).startswith(("float", "bfloat"))]      # (not positions' int cumsums)
    summed = []
    for x in seq:
        entries = VarMap((e.var, True) for e in reg.entry_of.values() if e.source.same_as(x))
        if any(_reads_from(facts, facts.value[c].args[0], entries, reg.region) for c in cumsums):
            summed.append(x)
    if not summed:
        raise NotChunkedDelta("no cumsum in it")         # (of its blocks: quiet)
    if len(summed) != 1:
        raise NotChunkedDelta(f"its cumsums sum {len(summed)} of its blocked tensors (a chunked delta "
                              "rule sums its log-decay alone)")
    g = summed[0]
    data = [x for x in seq if not x.same_as(g)]
    if len({len(tensor_shape(x)) for x in data}) != 1 or len(tensor_shape(g)) > len(tensor_shape(data[0])):
        raise NotChunkedDelta("no delta products")       # (not q, k, k beta, v beta of one rank: quiet)
    products = {}
    for x in data:
        f = _factors(facts, x)
        if f is not None:
            products[x] = f
    for kb in products:
        for vb in products:
            if kb.same_as(vb):
                continue
            for beta in products[kb]:
                k = next((a for a in products[kb] if not a.same_as(beta)), None)
                if k is None or not any(k.same_as(d) for d in data) or \
                        not any(_same_beta(facts, beta, b2) for b2 in products[vb]):
                    continue
                v = next((a for a in products[vb] if not _same_beta(facts, beta, a)), None)
                q = [d for d in data if not any(d.same_as(x) for x in (k, kb, vb))]
                if v is not None and len(q) == 1:
                    return q[0], k, v, beta, g, kb, vb
    raise NotChunkedDelta("no delta products")   # (no k beta and v beta of one beta: quiet, chunked.py's)


def _view_base(facts, a):
    base = _below_views(facts, a)
    return a if base is None else base


def _same_beta(facts, a, b):
    return a.same_as(b) or _view_base(facts, a).same_as(_view_base(facts, b))


def match_region(facts, ex, entries, tainted):
    """A ``ChunkedDeltaMatch`` for the region ending at exit ``ex``; raises ``NotChunkedDelta``
    (with the region, when it got that far, as ``.region``)."""
    reg = _Region(facts, ex, entries, tainted)
    try:
        return _match(facts, ex, reg)
    except NotChunkedDelta as why:
        why.region = reg.region
        raise


def _match(facts, ex, reg):
    q, k, v, beta, g, kb, vb = _roles(facts, reg)      # (quiet when no delta rule is in sight)
    if len(tensor_shape(ex.var) or ()) != 4:
        raise NotChunkedDelta(f"its output {tensor_shape(ex.var)} is not (B, H, L, value)")
    b, h, length = tensor_shape(g)[:3]
    key, value = tensor_shape(q)[-1], tensor_shape(v)[-1]
    decay = "key" if len(tensor_shape(g)) == 4 and tensor_shape(g)[3] != 1 else "head"   # ((B, H, L, 1): per head)
    if decay == "key" and tensor_shape(g)[3] != key:
        raise NotChunkedDelta(f"its log-decay {tensor_shape(g)} is neither per head nor per key")
    q_origin = _unpadded_origin(facts, q, length)
    if q_origin is None:
        raise NotChunkedDelta(f"q {q.name} is read padded, and not as a scaled padding of a tensor of L = {length}")
    padded = tensor_shape(ex.var)[2]                   # (blocks of a zero-padded sequence)
    for x in reg.sources:
        if reg.sources[x] != 2 or tuple(tensor_shape(x)[:2]) != (b, h) or \
                tensor_shape(x)[2] not in (length, padded):
            raise NotChunkedDelta(f"{x.name}: layout {tensor_shape(x)} split on axis {reg.sources[x]}; "
                                  "the scan reads (B, H, L, .) split on L")
    if tuple(tensor_shape(ex.var)) != (b, h, padded, value) or tuple(tensor_shape(v)[:3]) != (b, h, length) \
            or int(np.prod(tensor_shape(beta))) != b * h * length or padded < length:
        raise NotChunkedDelta(f"its output {tensor_shape(ex.var)} or operands are not (B, H, L, .) "
                              f"of L = {length}")
    dtype = tensor_dtype(ex.var)
    if dtype not in SUPPORTED_DTYPES or any(tensor_dtype(x) != dtype for x in reg.sources):
        raise NotChunkedDelta(f"dtype {dtype}: one of {'/'.join(SUPPORTED_DTYPES)} is needed throughout")
    operands = [q, k, v, beta, g, kb, vb]
    side = []                    # what else it reads, below views (an initial state, broadcast)
    for base in (_view_base(facts, s) for s in reg.side):
        if not any(base.same_as(x) for x in operands + side):
            side.append(base)
    states = [s for s in side if tuple(tensor_shape(s) or ()) == (b, h, key, value)]
    if len(states) != len(side) or len(states) > 1:
        raise NotChunkedDelta(f"it reads {[s.name for s in side]}: no initial state of a delta rule")
    h0 = states[0] if states else None
    probe = _Probe(facts, reg.region, list(reg.sources) + side)
    rng = np.random.default_rng(11)
    kv = rng.standard_normal((b, h, length, key))
    env = VarMap()
    qv = rng.standard_normal((b, h, length, key))
    env[q], env[k] = _zero_padded(qv, tensor_shape(q)[2]), kv / np.linalg.norm(kv, axis=-1, keepdims=True)
    vv, bb = rng.standard_normal((b, h, length, value)), rng.uniform(0.05, 1.0, (b, h, length))
    env[g] = -rng.uniform(0.0, 1.0, tuple(tensor_shape(g)))
    g_scan = env[g].reshape(b, h, length) if decay == "head" else env[g]
    env[kb], env[vb] = (_zero_padded(x * bb[..., None], tensor_shape(y)[2]) for x, y in ((env[k], kb), (vv, vb)))
    s0 = rng.standard_normal((b, h, key, value)) if h0 is not None else None
    if h0 is not None:
        env[h0] = s0
    interp = probe.evaluator(env)
    try:
        got = [np.asarray(interp(ex.var), dtype=np.float64)]
    except EVAL_ERRORS as err:
        raise NotChunkedDelta(f"it cannot be evaluated: {error_line(err)}") from None
    want, last = reference.delta_scan(qv, env[k], vv, bb, g_scan, h0=s0, return_last_state=True)
    want = _zero_padded(want, padded)               # (padded steps: q = 0, beta = 0, g = 0)
    if not _close(got[0], want, CHECK_RTOL):
        raise NotChunkedDelta(f"q = {q.name}, k = {k.name}, v = {v.name}: not equal to the gated "
                              "delta rule's oracle on random inputs")
    try:
        final = _final_state_uses(facts, reg, ex.var, lambda x: np.asarray(interp(x), dtype=np.float64), last)
    except EVAL_ERRORS as err:
        raise NotChunkedDelta(f"its final state cannot be evaluated: {error_line(err)}") from None
    spec = DeltaScanSpec(b, h, length, key, value, decay, h, 1.0, False, False, False, h0 is not None,
                         bool(final), dtype)
    emit_at = min([ex.var] + final, key=lambda x: facts.order[x])
    return ChunkedDeltaMatch(spec, q, k, v, beta, g, h0, ex.var, tuple(final), emit_at,
                             frozenset(reg.region.keys()), tuple([q_origin, k, v, beta, g] + side))


def _final_state_uses(facts, reg, exit_var, value_of, last, budget=64):
    """The bindings outside the region that read its intermediates, each the final state:
    followed forward from those reads until a value equals ``last`` (a loop over blocks that
    returns its final state computes it after the last block, which no output reads)."""
    frontier, seen, uses = [], VarMap(), []
    for x in reg.region:
        if x.same_as(exit_var) or x in reg.entry_of:
            continue
        for u in facts.users.get(x, []):
            target = x if u == "return" else u
            if (u == "return" or (u not in reg.region and not _dead(facts, u))) and target not in seen:
                seen[target] = True
                frontier.append(target)
    while frontier:
        v = frontier.pop(0)
        if _close(value_of(v), last, CHECK_RTOL):
            uses.append(v)
            continue
        users = [u for u in facts.users.get(v, []) if u == "return" or not _dead(facts, u)]
        if v not in reg.region and users and len(seen) <= len(reg.region) + budget and not any(
                u == "return" or isinstance(facts.value.get(u), relax.Tuple) for u in users):
            nxt = [u for u in users if u not in seen]
            for u in nxt:
                seen[u] = True
            frontier += nxt
            continue
        raise NotChunkedDelta(f"{v.name} reads its intermediates and is not its final state")
    return sorted(uses, key=lambda u: facts.order.get(u, -1))


def _unpadded_origin(facts, x, length, budget=6):
    """``x`` itself when its time extent is ``length``, else the tensor of that length it is a
    scaled zero padding of (``pad(q) * scale``: the operand validation draws), or None."""
    for _ in range(budget):
        if tensor_shape(x)[2] == length:
            return x
        value = facts.value.get(x)
        name = op_name(value)
        if name in ("relax.nn.pad", "relax.astype"):
            x = value.args[0]
        elif name in ("relax.multiply", "relax.divide"):
            tensors = [a for a in value.args if not isinstance(a, GenericConst)]
            if len(tensors) != 1 or not tensors[0].same_as(value.args[0]):
                return None
            x = tensors[0]
        else:
            return None
        if not isinstance(x, relax.Var):
            return None
    return None


def _zero_padded(x, length):
    """``x`` (B, H, L, .) with zero rows up to ``length``."""
    width = [(0, 0)] * x.ndim
    width[2] = (0, length - x.shape[2])
    return np.pad(x, width)


def find_chunked_delta(func):
    """``[(exit var, ChunkedDeltaMatch | reason)]`` for ``func``'s block-merging reshapes whose
    region is a chunked delta rule, or one in sight that is not (quiet refusals and the regions
    around a match are left out)."""
    facts, attempts = region_attempts(func, match_region, NotChunkedDelta)
    found = [(v, m) for v, m in attempts if isinstance(m, ChunkedDeltaMatch) or str(m) not in QUIET]
    covered = VarMap((v, True) for _, m in found if isinstance(m, ChunkedDeltaMatch) for v in m.region)
    found = [(v, m if isinstance(m, ChunkedDeltaMatch) else str(m)) for v, m in found   # (a region around
             if isinstance(m, ChunkedDeltaMatch) or not any(x in covered for x in getattr(m, "region", ()))]  # a match)
    return sorted(found, key=lambda p: facts.order[p[0]])


def emit_chunked_delta(bb, match, visit):
    """Emit ``match``'s scan; ``[(old var, new expr)]`` for its output and final-state uses."""
    spec, emit = match.spec, bb.emit
    b, h, length = spec.batch, spec.heads, spec.length

    def shaped(x, shape, dtype, visited=False):
        x = x if visited else visit(x)
        if tuple(tensor_shape(x)) != tuple(shape):
            x = emit(relax.op.reshape(x, shape))
        return x if tensor_dtype(x) == dtype else emit(relax.op.astype(x, dtype))

    q = visit(match.q)
    if tensor_shape(q)[2] != length:          # (scaled after its padding: the rows past L are 0)
        q = emit(relax.op.strided_slice(q, axes=[2], begin=[0], end=[length]))
    operands = [shaped(q, (b, h, length, spec.key), spec.dtype, visited=True),
                shaped(match.k, (b, h, length, spec.key), spec.dtype),
                shaped(match.v, (b, h, length, spec.value), spec.dtype),
                shaped(match.beta, (b, h, length), spec.dtype),
                shaped(match.g, (b, h, length) + ((spec.key,) if spec.decay == "key" else ()), spec.dtype)]
    if match.h0 is not None:
        operands.append(shaped(match.h0, (b, h, spec.key, spec.value), "float32"))
    got = emit_spec_scan(emit, spec, operands)
    out, parts = (got[0], got[1:]) if spec.return_last_state else (got, [])
    padded = tensor_shape(match.output)[2]
    if padded > length:             # the region's rows past L: zeros (q = 0 there)
        out = emit(relax.op.nn.pad(out, [0, 0, 0, 0, 0, padded - length, 0, 0]))
    if tensor_dtype(out) != tensor_dtype(match.output):
        out = emit(relax.op.astype(out, tensor_dtype(match.output)))
    replaced = [(match.output, out)]
    for var in match.final:
        x = parts[0]
        if tuple(tensor_shape(x)) != tuple(tensor_shape(var)):
            x = emit(relax.op.reshape(x, tensor_shape(var)))
        replaced.append((var, x if tensor_dtype(x) == tensor_dtype(var) else emit(relax.op.astype(x, tensor_dtype(var)))))
    return replaced
