"""xLSTM's mLSTM read from an unrolled loop, by what it computes (``MLSTMScanSpec``).

HF ``xLSTMForCausalLM`` (``mlstm_recurrent_sequence_native``, what it runs for a sequence
shorter than its chunk and for the remainder after the chunks) and hand-written mLSTM loops
carry three states: a max ``m_t = max(f_t + m_{t-1}, i_t)`` and a matrix ``C`` and a normalizer
``n`` both rescaled by it, ``S_t = exp(f_t + m_{t-1} - m_t) S_{t-1} + exp(i_t - m_t) Y_t``
(``Y`` = ``k_t v_t^T`` for ``C``, ``k_t`` for ``n``), read out as
``q_t^T C_t / (max(|q_t . n_t|, exp(-m_t)) + eps)`` (or ``q_t^T C_t`` without ``n``).  None
of it is affine in one state, and RWKV's reader (``stabilized.py``) wants a den state; it is
one mLSTM scan.

How a loop is read (``find_mlstm``, with ``loop_reader.py``'s reader and probe):

1. the max chain, as ``stabilized._Reader.chains`` finds it (``w`` = f_t, ``k`` = i_t);
2. per step, its two rescalings ``exp(f + m_{t-1} - m_t)`` and ``exp(i - m_t)`` and the states
   they make, ``add(multiply(view(e_f), S_prev), multiply(view(e_i), Y))`` in any order (a view
   is ``expand_dims``/``reshape``/``broadcast_to``): one of rank 4 (``C``), at most one of
   rank 3 (``n``), each step's previous states the last step's;
3. the operands: ``k`` and ``v`` are the per-step tensors whose outer product ``Y_C`` is
   (``Y_n`` must be that ``k``), ``q`` the state-free tensor of k's shape that the readout
   reads, the readout the value each step stacks (or writes) into the output; all found by
   evaluation, not by spelling;
4. the numbers: steps 0, 1 and the last are evaluated (float64) on random previous states and
   must equal the spec's step, ``eps`` read off the readout, to 1e-9.

The operands are lifted to the whole sequence (``lift.Lifter``); the initial states are passed
as they are.  The emitted scan replaces the stacked output and, where the rest of the graph
reads them, the final states; the rewrite is then validated like every other.
"""
from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_spec_scan
from scanweaver_core.spec import SUPPORTED_DTYPES, MLSTMScanSpec

from ...interpret import EVAL_ERRORS, Interpreter, random_input
from ...lift import Lifter, NotLiftable, as_stacked_output, as_value_of, head_major_sequence
from ..stabilized.reader import RTOL, NotStabilized, _analysis
from .loop_reader import NotMLSTM, _args, _closure, _MReader, _Probe, _step_window

__all__ = ["MLSTMMatch", "find_mlstm", "find_mlstm_scans", "emit_mlstm"]


@dataclass
class _Step:
    m: object
    prev_m: object
    f: object
    i: object
    C: object = None
    prev_C: object = None
    n: object = None
    prev_n: object = None
    Y: object = None           # C's input, k v^T
    n_input: object = None     # n's input, k
    k: object = None
    v: object = None
    q: object = None
    y: object = None           # the readout
    inside: set = field(default_factory=set)


@dataclass
class MLSTMMatch:
    """One loop read as an mLSTM scan; ``emit_mlstm`` builds it."""

    steps: list
    spec: MLSTMScanSpec
    output: object             # the stacked readouts (replaced by the scan)
    out_axis: int
    emit_at: object
    last_used: bool
    analysis: object = None
    window: tuple = ()
    bindings: tuple = ()

    @property
    def length(self):
        return len(self.steps)


def _outer_pair(probe, Y, cands_k, cands_v):
    """The (k, v) among the candidates whose outer product ``Y`` is (by value), or None."""
    y = np.asarray(probe(Y), dtype=np.float64)
    for kc in cands_k:
        kv = np.asarray(probe(kc), dtype=np.float64)
        for vc in cands_v:
            vv = np.asarray(probe(vc), dtype=np.float64)
            if kv.shape[:-1] != y.shape[:-2] or vv.shape[:-1] != y.shape[:-2] or \
                    kv.shape[-1:] + vv.shape[-1:] != y.shape[-2:]:
                continue
            want = kv[..., :, None] * vv[..., None, :]
            if want.shape == y.shape and _close(y, want):
                return kc, vc
    return None


def _close(got, want):
    want = np.asarray(want, dtype=np.float64)
    return float(np.max(np.abs(got - want), initial=0.0)) <= RTOL * max(1.0, float(np.max(np.abs(want), initial=0.0)))


def _readout_var(reader, step, states):
    """This step's readout: the var, reached from ``C_t`` without entering the next states,
    that is stacked into (or written to) the output."""
    frontier, seen = [step.C], VarMap()
    for _ in range(16):
        nxt = []
        for x in frontier:
            for u in reader.users.get(x, []):
                if u == "return" or u in seen or u in states:
                    continue
                seen[u] = True
                val = reader.val(u)
                if op_name(val) in ("relax.concat", "relax.where"):
                    return x
                if op_name(val) == "relax.expand_dims" and any(
                        w != "return" and op_name(reader.val(w)) == "relax.concat" for w in reader.users.get(u, [])):
                    return x
                nxt.append(u)
        frontier = nxt
    raise NotMLSTM(f"step {step.m.name}: no readout of {step.C.name} is stacked into an output")


def _read_step(reader, step, probe):
    """Fill ``step``'s operands (k, v, q) and readout, checked by value."""
    shape_k = tensor_shape(step.prev_C)[:-1]
    stop = VarMap((x, True) for x in (step.prev_C, step.prev_n, step.prev_m, step.C, step.n, step.m)
                  if x is not None)
    near = _closure(reader, [step.Y], stop, depth=8)
    cands_k = [x for x in near if tuple(tensor_shape(x) or ()) == tuple(shape_k)]
    cands_v = [x for x in near if len(tensor_shape(x) or ()) == len(shape_k)]
    pair = _outer_pair(probe, step.Y, cands_k, cands_v)
    if pair is None:
        raise NotMLSTM(f"step {step.m.name}: the input of {step.C.name} is not an outer product k v^T")
    step.k, step.v = pair
    if step.n is not None and not _close(probe(step.n_input), probe(step.k)):
        raise NotMLSTM(f"step {step.m.name}: the normalizer's input is not the key")


def _readout_ok(q, c, n, m, y, eps):
    num = np.einsum("...k,...kv->...v", q, c)
    if n is None:
        return _close(y, num.reshape(y.shape)), None
    base = np.maximum(np.abs(np.einsum("...k,...k->...", q, n)), np.exp(-m.reshape(q.shape[:-1])))
    if eps is None:                         # read it off: den = num / y
        with np.errstate(all="ignore"):
            den = num / y.reshape(num.shape)
        eps = float(np.nanmedian(den - base[..., None]))
    want = num / (base + eps)[..., None]
    return _close(y, want.reshape(y.shape)), eps


def _find_q(reader, step, probe, states):
    """The state-free per-step tensor the readout reads as q (with the readout checked)."""
    stop = VarMap((x, True) for x in states)
    shape = tuple(tensor_shape(step.k))
    cands = [x for x in _closure(reader, [step.y], stop, depth=16) if tuple(tensor_shape(x) or ()) == shape]
    c, m = probe(step.C), probe(step.m)
    n = probe(step.n) if step.n is not None else None
    y = probe(step.y)
    for cand in cands:
        ok, eps = _readout_ok(probe(cand), c, n, m, y, None)
        if ok:
            return cand, eps
    raise NotMLSTM(f"step {step.m.name}: its readout {step.y.name} is not q^T C"
                   + (" / (max(|q.n|, exp(-m)) + eps)" if step.n is not None else ""))


def _match(reader, steps, an, rng):
    for step in steps:
        found = reader.states(step)
        mats = [s for s in found if len(tensor_shape(s[0]) or ()) == 4]
        vecs = [s for s in found if len(tensor_shape(s[0]) or ()) == 3]
        if len(mats) != 1 or len(vecs) > 1:
            raise NotMLSTM(f"step {step.m.name}: {len(mats)} matrix states and {len(vecs)} normalizers "
                           "rescaled by it (an mLSTM has one of each, or no normalizer)")
        step.C, step.prev_C, step.Y, inside = mats[0]
        step.inside |= inside
        if vecs:
            step.n, step.prev_n, step.n_input, inside = vecs[0]
            step.inside |= inside
        step.inside |= {step.m} | {a for a in _args(reader.val(step.m)) if isinstance(a, relax.Var)
                                   and op_name(reader.val(a)) == "relax.add"}
    for prev, step in zip(steps, steps[1:]):
        if not step.prev_C.same_as(prev.C) or (step.n is None) != (prev.n is None) or \
                (step.n is not None and not step.prev_n.same_as(prev.n)):
            raise NotMLSTM(f"steps {prev.m.name} -> {step.m.name}: the states do not chain")
    states = VarMap((x, True) for s in steps for x in (s.C, s.n, s.m) if x is not None)
    leaves = VarMap()

    def leaf(var):
        if var not in leaves:
            leaves[var] = random_input(var.ty, rng, 1.0)
        return leaves[var]

    for step in steps:
        step.y = _readout_var(reader, step, states)
    eps = None
    for idx in sorted({0, 1, len(steps) - 1}):     # (the rewrite's validation sees every step)
        step = steps[idx]
        probe = _random_probe(reader, step, leaf, rng)
        _read_step(reader, step, probe)
        step.q, e = _find_q(reader, step, probe, states)
        _check_step(step, probe, idx)
        if eps is not None and step.n is not None and abs(e - eps) > 1e-9 * max(1.0, abs(eps)):
            raise NotMLSTM(f"step {idx}: its eps {e:.3g} is not step 0's {eps:.3g}")
        eps = e if eps is None else eps
    return eps


def _random_probe(reader, step, leaf, rng):
    shape_c = tensor_shape(step.prev_C)
    given = VarMap()
    probe0 = Interpreter(reader.vmap, missing=leaf)
    randoms = [(step.prev_C, rng.normal(size=shape_c)), (step.prev_m, rng.normal(size=tensor_shape(step.prev_m)))]
    if step.prev_n is not None:
        randoms.append((step.prev_n, rng.normal(size=tensor_shape(step.prev_n))))
    for x, r in randoms:      # a constant (a given initial state) keeps its value
        given[x] = r if isinstance(x, relax.Var) else np.broadcast_to(probe0(x), r.shape)
    return _Probe(reader, given, leaf)


def _check_step(step, probe, idx):
    """The step's states equal the spec's step of the operands read."""
    f, i = probe(step.f), probe(step.i)
    m_prev, c_prev = probe.given[step.prev_m], probe.given[step.prev_C]
    m = np.maximum(f + m_prev, i)
    a, e = np.exp(f + m_prev - m), np.exp(i - m)
    k, v = probe(step.k), probe(step.v)
    bh = c_prev.shape[:2]
    a4, e4 = a.reshape(bh + (1, 1)), e.reshape(bh + (1, 1))     # (m is (B, H) or (B, H, 1))
    checks = [("m", step.m, m), ("C", step.C, a4 * c_prev + e4 * k[..., :, None] * v[..., None, :])]
    if step.n is not None:
        checks.append(("n", step.n, a4[..., 0] * probe.given[step.prev_n] + e4[..., 0] * k))
    for name, var, want in checks:
        got = probe(var)
        if got.shape != want.shape or not _close(got, want):
            raise NotMLSTM(f"step {idx}: its {name} is not the mLSTM step's")


def find_mlstm(func, value, users):
    """``[(var, MLSTMMatch | reason str)]`` for the max chains of ``func`` that rescale a
    matrix state (a chain that rescales none is RWKV's or a plain max: not reported here)."""
    if not isinstance(func.body, relax.SeqExpr):
        return []
    reader = _MReader(func, value, users)
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    found, an = [], None
    for chain in reader.chains():
        steps = [_Step(s.m, s.prev_m, s.w, s.k) for s in chain]
        try:
            found_states = reader.states(steps[0])
        except NotMLSTM:
            continue
        if not any(len(tensor_shape(s[0]) or ()) == 4 for s in found_states):
            continue                 # no matrix state: not an mLSTM
        steps[0].inside = set()
        try:
            an = an or _analysis(bindings)
            found.append((steps[0].m, _build(reader, steps, an)))
        except (NotMLSTM, NotStabilized) as err:
            found.append((steps[0].m, str(err)))
        except EVAL_ERRORS + (NotLiftable,) as err:
            found.append((steps[0].m, f"could not be read: {type(err).__name__}: {err}"))
    return found


def _build(reader, steps, an):
    eps = _match(reader, steps, an, np.random.default_rng(0))
    reverse, window = _step_window(an, steps, ("i", "f", "k", "v", "q"), getattr, NotMLSTM, "the gates")
    output, out_axis, inside = reader.gathered(steps, reverse)
    if len(tensor_shape(output) or ()) == 3:
        out_axis = 2             # a bare concat of (B, H, V) readouts: (B, H, L*V) holds (B, H, L, V)
    first, last = steps[0], steps[-1]
    states = VarMap((x, True) for s in steps for x in (s.C, s.n, s.m) if x is not None)
    region = set(inside).union(*(s.inside for s in steps)) | {s.y for s in steps}
    region |= {x for s in steps for x in (s.C, s.n, s.m) if x is not None}
    region |= set(_closure(reader, [s.y for s in steps], states, depth=16))
    last_states = [x for x in (last.C, last.n, last.m) if x is not None]
    last_used = any(u == "return" or u not in region for x in last_states for u in reader.users.get(x, []))
    batch, heads, key, value = tensor_shape(first.prev_C)
    dtype = tensor_dtype(output)
    if dtype not in SUPPORTED_DTYPES:
        raise NotMLSTM(f"dtype {dtype}: scans take {'/'.join(SUPPORTED_DTYPES)}")
    spec = MLSTMScanSpec(batch, heads, len(steps), key, value, first.n is not None,
                         0.0 if eps is None else max(eps, 0.0), reverse, True, last_used, dtype)
    names = tuple(sorted((v.name for v in region if v in reader.vmap), key=lambda n: (len(n), n)))
    return MLSTMMatch(steps, spec, output, out_axis, output, last_used, an, window, names)


def emit_mlstm(bb, match, visit):
    """Emit ``match``'s scan with ``bb``; returns ``[(old var, new expr)]``: the stacked
    output and, where read, the final states."""
    emit, spec, first = bb.emit, match.spec, match.steps[0]
    lifter = Lifter(match.analysis, match.window, emit, visit)
    b, h, length = spec.batch, spec.heads, spec.length

    def seq(expr, last, what):
        return head_major_sequence(lifter, emit, expr, (b, h), length, last, spec.dtype, what)

    def state(expr, shape):
        e = visit(expr)
        got = tuple(tensor_shape(e))
        if got != shape:
            e = emit(relax.op.reshape(e, shape)) if int(np.prod(got)) == int(np.prod(shape)) else \
                emit(relax.op.broadcast_to(e, shape))
        return e if tensor_dtype(e) == "float32" else emit(relax.op.astype(e, "float32"))

    operands = [seq(first.q, spec.key, "q"), seq(first.k, spec.key, "k"), seq(first.v, spec.value, "v"),
                seq(first.i, None, "the input gate"), seq(first.f, None, "the forget gate")]
    shapes = spec.state_shapes()
    prev = {"C": first.prev_C, "n": first.prev_n, "m": first.prev_m}
    operands += [state(prev[n], shapes[n]) for n in spec.state_names()]
    got = emit_spec_scan(emit, spec, operands)
    out, parts = (got[0], got[1:]) if spec.return_last_state else (got, [])
    replaced = [(match.output, as_stacked_output(emit, out, match.output, match.out_axis))]
    last = match.steps[-1]
    replaced += [(old, as_value_of(emit, new, old))
                 for old, new in zip([x for x in (last.C, last.n, last.m) if x is not None], parts)]
    return replaced


def find_mlstm_scans(mod):
    """The mLSTM loops of every Relax function in ``mod`` as ``chains.Recurrence``s of form
    ``"mlstm"`` (accepted: ``rec.mlstm`` holds the match; near misses the reason)."""
    from ...chains import Recurrence  # pylint: disable=import-outside-toplevel
    from ..stabilized.stabilized import _users  # pylint: disable=import-outside-toplevel

    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for var, match in find_mlstm(func, value, _users(func)):
            if isinstance(match, MLSTMMatch):
                spec = match.spec
                found.append(Recurrence(gvar.name_hint, "mlstm", match.length, match.out_axis,
                                        spec.reverse, tuple(spec.state_shapes()["C"]), spec.dtype,
                                        match.bindings, mlstm=match))
            else:
                found.append(Recurrence(gvar.name_hint, "mlstm", 0, 0, False, tensor_shape(var) or (),
                                        tensor_dtype(var), (var.name,), rejected=True,
                                        reason=f"a max-stabilized loop from {var.name} is not an mLSTM "
                                               f"scan: {match}"))
    return found
