"""xLSTM's mLSTM written in its chunkwise (parallel) form, read as one mLSTM scan.

HF ``xLSTMForCausalLM`` runs ``mlstm_chunkwise_native_autograd`` on the whole chunks of a
sequence: the gates are viewed as (chunks, chunk) blocks, the log forget gate is summed within
each chunk (``cumsum``), a loop over the chunks carries ``C``, ``n`` and the max ``m`` from chunk
to chunk, and each chunk's outputs are formed in parallel from masked pairwise differences and
the state before it, then merged back.  It computes exactly ``MLSTMScanSpec``'s recurrence
(the combined max within a chunk is the recurrent ``m_t``), so it is the same scan.

Found by what it computes, as ``chunked.py`` finds matrix scans:

1. the *region*: the bindings from the time-splitting reshapes to the reshape that merges the
   blocks back (``chunked.entries_and_exits`` / ``chunked._region``), holding a ``cumsum`` and
   a ``maximum``; it reads five blocked tensors (two gates and three of one more dim) and, maybe,
   slices of them (the loop over chunks) and initial states;
2. *roles*: the forget gate is the gate the cumsums reach, and the scan's ``f`` is what they sum
   (``logsigmoid`` of it, computed by the region's own bindings); ``i`` is the other gate;
   ``v`` has the output's last extent; q and k are told apart by the oracle;
3. *numbers*: the scale on ``q`` and ``eps`` are read off the output where the normalizer is
   ``exp(-m)`` (keys scaled down: ``y (exp(-m) + eps) = s q^T C``, least squares), then the
   assignment must equal ``reference.mlstm_scan`` on fresh inputs (initial states included),
   and the region's other uses its final state.

The rewrite is then validated like every other, locally (both sides from the same operands).
"""
from dataclasses import dataclass
from itertools import permutations

import numpy as np
from tvm import relax

from scanweaver_core import reference
from scanweaver_core.exprs import VarMap, error_line, op_name, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_spec_scan
from scanweaver_core.spec import SUPPORTED_DTYPES, MLSTMScanSpec

from ...interpret import EVAL_ERRORS
from ..chunked.region import _dead, _Facts, _Probe, _region, entries_and_exits

__all__ = ["ChunkedMLSTMMatch", "NotChunkedMLSTM", "find_chunked_mlstm", "emit_chunked_mlstm"]

FIT_RTOL = 1e-7        # the fitted output against the oracle's, relative to its magnitude
CHECK_RTOL = 1e-6      # an assignment against the oracle on fresh inputs


STATE_VIEWS = {f"relax.{n}" for n in ("reshape", "squeeze", "expand_dims", "broadcast_to", "astype",
                                       "permute_dims", "strided_slice", "slice_scatter", "where")}


class NotChunkedMLSTM(Exception):
    """The region is not a chunkwise mLSTM (the message says why)."""


@dataclass
class ChunkedMLSTMMatch:
    """What ``emit_chunked_mlstm`` needs for one region."""
    spec: MLSTMScanSpec
    q: relax.Var               # (B, H, L, K) as the region reads it; times ``scale``
    k: relax.Var
    v: relax.Var
    i: relax.Var               # (B, H, L)
    f: relax.Var               # the blocked log forget gate the cumsums sum (B, H, chunks, chunk)
    scale: float
    h0: tuple                  # (C0, n0, m0) vars (n0 absent unnormalized), or ()
    output: relax.Var          # the merged blocks (replaced by the scan's h)
    final: tuple               # ((var, state part name), ...): uses that are the final state
    emit_at: relax.Var
    region: frozenset
    inputs: tuple              # what validation draws at random: the operands and states


def _reads_from(facts, start, targets, region):
    """The ``targets`` that ``start`` is computed from, walking back through ``region``."""
    seen, stack, hit = VarMap(), [start], []
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen[v] = True
        if v in targets:
            hit.append(v)
        elif v in region:
            stack.extend(facts.reads.get(v, ()))
    return hit


class _Region:
    """The bindings of one candidate region and what it reads."""

    def __init__(self, facts, ex, entries, tainted):
        self.facts, self.exit = facts, ex.var
        self.region = _region(facts, ex.var, tainted, entries)
        mine = [e for e in entries if e.var in self.region]
        self.entry_of = VarMap((e.var, e) for e in mine)
        sources = VarMap()
        for e in mine:
            sources.setdefault(e.source, e.axis)
        self.sources = sources
        ops = {op_name(facts.value.get(v)) for v in self.region}
        if not {"relax.cumsum", "relax.maximum", "relax.exp"} <= ops:
            raise NotChunkedMLSTM("no cumsum, maximum and exp in it")       # (quiet: not in sight)
        side = []
        for v in self.region:
            for r in facts.reads[v]:
                if r in self.region or r in sources or self._of_sources(r):
                    continue
                side.extend(x for x in self._leaves(r) if x not in side)
        self.side = side

    def _leaves(self, var):
        """What ``var`` is computed from, through layout ops and writes into constant buffers
        (HF stores the initial state in the chunk-states buffer): its initial states."""
        facts, out, stack, seen = self.facts, [], [var], VarMap()
        while stack:
            v = stack.pop()
            if v in seen or facts.constant(v):
                continue
            seen[v] = True
            if op_name(facts.value.get(v)) in STATE_VIEWS:
                stack.extend(facts.reads[v])
            else:
                out.append(v)
        return out

    def _of_sources(self, var, budget=8):
        """``var`` is computed from the sources and constants alone (the chunk loop's slices
        of k and v, and their layout ops)."""
        facts = self.facts
        if var in self.sources or facts.constant(var):
            return True
        if budget == 0 or var not in facts.value:
            return False
        return all(self._of_sources(r, budget - 1) for r in facts.reads[var])

    def external_uses(self):
        """Bindings outside the region reading its values (not its sources or the exit)."""
        out = []
        for v in self.region:
            if v.same_as(self.exit) or v in self.entry_of:
                continue
            for u in self.facts.users.get(v, []):
                if u == "return":
                    raise NotChunkedMLSTM(f"its intermediate {v.name} is returned")
                if u not in self.region and u not in out and not _dead(self.facts, u):
                    out.append(u)
        return sorted(out, key=lambda u: self.facts.order[u])


def _roles(facts, reg):
    """``(i, f, f_blocked, [(q, k, v), ...])``: the gates, and the data assignments to try."""
    seq = list(reg.sources.keys())
    ranks = {len(tensor_shape(v)) for v in seq}
    gates = [v for v in seq if len(tensor_shape(v)) == min(ranks)]
    data = [v for v in seq if len(tensor_shape(v)) == max(ranks)]
    if len(seq) != 5 or len(ranks) != 2 or len(gates) != 2 or len(data) != 3:
        raise NotChunkedMLSTM(f"it reads {len(seq)} blocked tensors; an mLSTM reads two gates "
                              "and q, k, v of one more dim")
    cumsums = [v for v in reg.region if op_name(facts.value.get(v)) == "relax.cumsum"]
    summed = VarMap()
    for c in cumsums:
        x = facts.value[c].args[0]
        for g in _reads_from(facts, x, VarMap((e.var, True) for e in reg.entry_of.values()
                                             if e.source in gates), reg.region):
            summed[reg.entry_of[g].source] = x
    if len(summed) != 1:
        raise NotChunkedMLSTM(f"its cumsums read {len(summed)} of its gates (an mLSTM sums the "
                              "log forget gate alone)")
    f_src, f_blocked = next(iter(summed.items()))
    i_src = next(g for g in gates if not g.same_as(f_src))
    out_last = tensor_shape(reg.exit)[-1]
    trials = [p for p in permutations(data) if tensor_shape(p[2])[-1] == out_last
              and tensor_shape(p[0]) == tensor_shape(p[1])]
    return i_src, f_src, f_blocked, trials


def _layout_ok(reg, i_src):
    """The sources are (B, H, L[, .]), split on axis 2, one length, no padding read."""
    b, h, length = tensor_shape(i_src)
    for v in reg.sources:
        shape = tensor_shape(v)
        if reg.sources[v] != 2 or tuple(shape[:3]) != (b, h, length):
            raise NotChunkedMLSTM(f"{v.name}: layout {shape} split on axis {reg.sources[v]}; "
                                  "the scan reads (B, H, L, .) split on L")
    if tensor_shape(reg.exit)[:3] != (b, h, length):
        raise NotChunkedMLSTM(f"its output {reg.exit.name} {tensor_shape(reg.exit)} is not "
                              f"(B, H, L, V) of L = {length} (padded?)")
    return b, h, length


def _state_roles(side, b, h, key, value):
    """Initial states by their shapes: ``{"C": var, "n": var, "m": var}``."""
    roles = {}
    for s in side:
        shape = tuple(tensor_shape(s) or ())
        size = int(np.prod(shape)) if shape else 0
        name = "C" if shape == (b, h, key, value) else "n" if shape == (b, h, key) else \
            "m" if size == b * h else None
        if name is None or name in roles:
            raise NotChunkedMLSTM(f"it reads {s.name} {shape}, which is no initial state of an mLSTM")
        roles[name] = s
    if roles and set(roles) not in ({"C", "n", "m"}, {"C", "m"}):
        raise NotChunkedMLSTM(f"its initial states are {sorted(roles)}: C, n and m are needed")
    return roles


def _m_chain(i, f, m0):
    """The recurrent max ``m_t = max(f_t + m_{t-1}, i_t)`` (B, H, L), float64."""
    m, out = m0, np.empty(i.shape)
    for t in range(i.shape[-1]):
        m = np.maximum(f[..., t] + m, i[..., t])
        out[..., t] = m
    return out


def _fit(y, num, m, normalized):
    """``(scale, eps)`` of ``y = s num / (exp(-m) + eps)`` (normalized) or ``y = s num``, by
    least squares; None when it does not fit."""
    if normalized:
        d = np.exp(-m)[..., None]
        a = np.stack([num.ravel(), -y.ravel()], axis=1)
        rhs = (y * d).ravel()
    else:
        a, rhs = num.reshape(-1, 1), y.ravel()
    sol, *_ = np.linalg.lstsq(a, rhs, rcond=None)
    fitted = a @ sol
    if not np.max(np.abs(fitted - rhs), initial=0.0) <= FIT_RTOL * max(np.max(np.abs(rhs), initial=0.0), 1e-30):
        return None
    scale, eps = float(sol[0]), float(sol[1]) if normalized else 0.0
    if not scale > 0 or eps < -1e-12:
        return None
    return scale, max(eps, 0.0)


def _close(got, want, rtol):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return got.size == want.size and np.all(np.isfinite(got)) and \
        np.max(np.abs(got.ravel() - want.ravel()), initial=0.0) <= rtol * max(1.0, np.max(np.abs(want), initial=0.0))


def match_region(facts, ex, entries, tainted):
    """A ``ChunkedMLSTMMatch`` for the region ending at exit ``ex``; raises ``NotChunkedMLSTM``."""
    reg = _Region(facts, ex, entries, tainted)
    i_src, f_src, f_blocked, trials = _roles(facts, reg)
    if not trials:
        raise NotChunkedMLSTM("none of its data tensors has the output's last extent (v)")
    b, h, length = _layout_ok(reg, i_src)
    dtype = tensor_dtype(reg.exit)
    if dtype not in SUPPORTED_DTYPES or any(tensor_dtype(v) != dtype for v in reg.sources):
        raise NotChunkedMLSTM(f"dtype {dtype}: one of {'/'.join(SUPPORTED_DTYPES)} is needed throughout")
    external = reg.external_uses()
    probe = _Probe(facts, reg.region, list(reg.sources) + reg.side)
    rng = np.random.default_rng(7)
    last_err = "no assignment of q, k, v equals the oracle"
    for q, k, v in trials:
        key, value = tensor_shape(q)[-1], tensor_shape(v)[-1]
        states = _state_roles(reg.side, b, h, key, value)
        env = VarMap((s, np.zeros(tensor_shape(s))) for s in reg.side)
        for x in (q, k, v):
            env[x] = rng.standard_normal(tensor_shape(x))
        env[i_src] = rng.uniform(-1.0, 1.0, (b, h, length))
        env[f_src] = rng.uniform(-1.0, 3.0, (b, h, length))
        env[k] = env[k] * 1e-6                     # |q . n| far below exp(-m): the readout is linear
        try:
            y, f_log = probe(env, [reg.exit, f_blocked])
        except EVAL_ERRORS as err:
            raise NotChunkedMLSTM(f"it cannot be evaluated: {error_line(err)}") from None
        f_log = f_log.reshape(b, h, length)
        num = reference.mlstm_scan(env[q], env[k], env[v], env[i_src], f_log, normalized=False)
        m = _m_chain(env[i_src], f_log, np.zeros((b, h)))
        fits = [(n, _fit(y, num, m, n)) for n in (True, False)]
        fits = [(n, fit) for n, fit in fits if fit is not None]
        if not fits:
            last_err = f"its output is no scaled mLSTM readout with q = {q.name}, k = {k.name}"
            continue
        normalized, (scale, eps) = fits[0]
        if not normalized and "n" in states:
            raise NotChunkedMLSTM("it reads a normalizer state but its readout is not normalized")
        # fresh inputs at full scale, random initial states
        for x in (q, k, v):
            env[x] = rng.standard_normal(tensor_shape(x))
        env[i_src] = rng.uniform(-1.0, 1.0, (b, h, length))
        env[f_src] = rng.uniform(-1.0, 3.0, (b, h, length))
        h0 = None
        if states:
            env[states["C"]] = rng.standard_normal(tensor_shape(states["C"]))
            if "n" in states:
                env[states["n"]] = rng.standard_normal(tensor_shape(states["n"]))
            env[states["m"]] = rng.uniform(-1.0, 1.0, tensor_shape(states["m"]))
            h0 = [env[states[n]].reshape(shape) for n, shape in
                  MLSTMScanSpec(b, h, length, key, value, normalized).state_shapes().items()]
        got = probe(env, [reg.exit, f_blocked] + external)
        y, f_log, uses = got[0], got[1].reshape(b, h, length), got[2:]
        want, last = reference.mlstm_scan(env[q] * scale, env[k], env[v], env[i_src], f_log, h0,
                                          normalized, eps, return_last_state=True)
        if not _close(y, want, CHECK_RTOL):
            last_err = f"q = {q.name}, k = {k.name}: not equal to the oracle on fresh inputs"
            continue
        names = ["C", "n", "m"] if normalized else ["C", "m"]
        final = []
        for u, got_u in zip(external, uses):
            part = next((n for n, x in zip(names, last) if _close(got_u, x, CHECK_RTOL)), None)
            if part is None:
                raise NotChunkedMLSTM(f"{u.name} reads its intermediates and is not its final state")
            final.append((u, part))
        spec = MLSTMScanSpec(b, h, length, key, value, normalized, eps, False, bool(states),
                             bool(final), dtype)
        emit_at = min([reg.exit] + [u for u, _ in final], key=lambda x: facts.order[x])
        inputs = [q, k, v, i_src, f_src] + list(reg.side)
        return ChunkedMLSTMMatch(spec, q, k, v, i_src, f_blocked, scale,
                                 tuple(states[n] for n in spec.state_names()) if states else (),
                                 reg.exit, tuple(final), emit_at, frozenset(reg.region.keys()),
                                 tuple(inputs))
    raise NotChunkedMLSTM(last_err)


def _walk_set(facts, entries):
    """What the region walk may pass: the bindings computed from ``entries``, less their
    operands (a later layer's k, computed from an earlier layer's blocks: its slices in the
    chunk loop read it, and the region stops there)."""
    operands = VarMap((e.source, True) for e in entries)
    return VarMap((v, True) for v in facts.tainted(entries).keys() if v not in operands)


def _region_entries(facts, ex, entries):
    """``(entries, walk set)`` of the region ending at ``ex``: a view of a value the region
    computes from its own entries (the chunk states viewed as (chunks, K) when K equals the
    chunk) is inside it, not an entry."""
    first = _region(facts, ex.var, _walk_set(facts, entries), entries)
    own = [e for e in entries if e.var in first]
    inner = facts.tainted(own)
    kept = [e for e in entries if e.var not in first or e.source not in inner]
    return kept, (_walk_set(facts, kept) if len(kept) < len(entries) else None)


def region_attempts(func, match, refusal):
    """``(facts, [(exit var, match | refusal)])``: ``match(facts, exit, entries, walk set)`` tried at
    every block-merging reshape of ``func`` whose blocks its time-splitting reshapes make (the
    regions of the chunked finders; a ``refusal`` raised is kept as the attempt's result)."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return None, []
    facts = _Facts(func)
    entries, exits = entries_and_exits(facts.bindings, facts.value)
    out, walk_by_key = [], {}
    for ex in reversed(exits):
        if ex.blocks is None:
            continue
        mine = [e for e in entries if e.key == ex.key and e.span is None]
        if not mine:
            continue
        if ex.key not in walk_by_key:
            walk_by_key[ex.key] = _walk_set(facts, mine)
        if ex.var not in walk_by_key[ex.key]:
            continue
        kept, walk = _region_entries(facts, ex, mine)
        try:
            out.append((ex.var, match(facts, ex, kept, walk or walk_by_key[ex.key])))
        except refusal as why:
            out.append((ex.var, why))
    return facts, out


def find_chunked_mlstm(func):
    """``[(exit var, ChunkedMLSTMMatch | reason)]`` for ``func``'s block-merging reshapes whose
    region is a chunkwise mLSTM (a region without a max and five blocked tensors is not
    reported: it is ``chunked.py``'s)."""
    facts, attempts = region_attempts(func, match_region, NotChunkedMLSTM)
    found = [(v, m if isinstance(m, ChunkedMLSTMMatch) else str(m)) for v, m in attempts
             if isinstance(m, ChunkedMLSTMMatch) or ("no cumsum, maximum" not in str(m)
                                                     and "blocked tensors" not in str(m))]
    return sorted(found, key=lambda p: facts.order[p[0]])


def emit_chunked_mlstm(bb, match, visit):
    """Emit ``match``'s scan; ``[(old var, new expr)]`` for its output and final-state uses."""
    spec, emit = match.spec, bb.emit
    b, h, length = spec.batch, spec.heads, spec.length

    def cast(x, dtype):
        return x if tensor_dtype(x) == dtype else emit(relax.op.astype(x, dtype))

    def shaped(x, shape, dtype):
        x = visit(x)
        if tuple(tensor_shape(x)) != tuple(shape):
            x = emit(relax.op.reshape(x, shape))
        return cast(x, dtype)

    q = shaped(match.q, (b, h, length, spec.key), spec.dtype)
    if match.scale != 1.0:
        q = emit(relax.op.multiply(q, relax.const(match.scale, spec.dtype)))
    operands = [q, shaped(match.k, (b, h, length, spec.key), spec.dtype),
                shaped(match.v, (b, h, length, spec.value), spec.dtype),
                shaped(match.i, (b, h, length), spec.dtype), shaped(match.f, (b, h, length), spec.dtype)]
    shapes = spec.state_shapes()
    operands += [shaped(x, shapes[n], "float32") for x, n in zip(match.h0, spec.state_names())]
    got = emit_spec_scan(emit, spec, operands)
    out, parts = (got[0], got[1:]) if spec.return_last_state else (got, [])
    out = out if tuple(tensor_shape(out)) == tuple(tensor_shape(match.output)) else \
        emit(relax.op.reshape(out, tensor_shape(match.output)))
    replaced = [(match.output, cast(out, tensor_dtype(match.output)))]
    by_name = dict(zip(spec.state_names(), parts))
    for var, part in match.final:
        x = by_name[part]
        if tuple(tensor_shape(x)) != tuple(tensor_shape(var)):
            x = emit(relax.op.reshape(x, tensor_shape(var)))
        replaced.append((var, cast(x, tensor_dtype(var))))
    return replaced
