"""Delta-rule loops read by what they compute (``DeltaScanSpec``).

fla-core's naive recurrent kernels (delta rule, gated delta rule, KDA, Comba), transformers'
``torch_recurrent_gated_delta_rule`` (Qwen3-Next's decode path) and the spellings people write
(``kv = (S * k[..., None]).sum(-2)``, ``S = S + k[..., None] * ((v - kv) * beta)[..., None, :]``,
or matmul/einsum forms) carry one (B, H, K, V) state whose coefficient is a matrix,
``S_t = (I - beta_t k_t p_t^T) D_t S_(t-1) + beta_t k_t v_t^T``: not affine per element, so
the chain finder does not take it; it is one delta scan.  fla's DPLR / IPLR loops and RWKV-7's
``S_t = (D_t + b_t a_t^T) S_(t-1) + k_t v_t^T`` are the same scan with the DPLR rule.

How a loop is read (``find_delta``; steps 2 and 3 are ``step_reader.py``'s):

1. the state chain: rank-4 ``add`` bindings, each computed from exactly one earlier one of
   its shape (the previous state) without passing another;
2. per step, the step's map ``S_(t-1) -> S_t`` evaluated (float64) on chosen previous states:
   ``U`` at zero, the transition ``M`` from random states, the map checked affine on another;
3. the operands, found among the step's per-step tensors by value: ``k`` the left factor of
   ``U = beta k v^T``, ``beta`` and ``v`` its scale and right factor, ``D`` and ``p`` from
   ``M - D = -beta k (D p)^T`` (``D`` = 1, a scalar or a diagonal, matched to a tensor whose
   ``exp`` it is, or to the decay itself) (else, with ``beta`` = 1, ``M = D + b a^T`` with ``b``
   and ``a`` per-step tensors: the DPLR rule), ``q`` and the scale off the readout ``scale S_t^T q``;
4. steps 0, 1 and the last are read and checked; each operand must be a per-step slice of one
   tensor at consecutive times.  The rewrite is then validated like every other.
"""
from dataclasses import dataclass, field

import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap, op_name, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_spec_scan
from scanweaver_core.spec import SUPPORTED_DTYPES, DeltaScanSpec

from ...interpret import EVAL_ERRORS, random_input
from ...lift import Lifter, NotLiftable, as_stacked_output, as_value_of, head_major_sequence
from ..mlstm.loop_reader import _args, _closure, _MReader, _step_window
from ..stabilized.reader import NotStabilized, _analysis
from ..stabilized.stabilized import _users
from .step_reader import NotDelta, _StepReader

__all__ = ["DeltaMatch", "find_delta", "find_delta_scans", "emit_delta"]


# refusals before the step is seen to be a linear map of the state: no delta rule in sight
QUIET = ("no readout of it is stacked", "is not a linear map of the previous")


@dataclass
class _Step:
    S: object                  # the state after the step
    prev: object               # the state before it (a var or a constant)
    y: object = None           # the readout stacked into (or written to) the output
    ops: dict = field(default_factory=dict)     # q, k, v, beta, [g], [p]: per-step vars
    log_decay: bool = True     # g is the log-decay (else the decay itself: the scan takes its log)


@dataclass
class DeltaMatch:
    """One loop read as a delta-rule scan; ``emit_delta`` builds it."""

    steps: list
    spec: DeltaScanSpec
    output: object             # the stacked readouts (replaced by the scan)
    out_axis: int
    last_used: bool
    analysis: object = None
    window: tuple = ()
    bindings: tuple = ()
    transposed: bool = False   # the loop's state is (B, H, V, K), S^T of the spec's

    @property
    def emit_at(self):
        return self.output

    @property
    def length(self):
        return len(self.steps)


def _state_chains(reader, value):
    """Chains ``[[S_0, S_1, ...]]`` of rank-4 ``add`` bindings, each computed from the one
    before it through tensors of its own size only (the state's path: a decay, a clone, a
    view), and from no other."""
    adds = VarMap((v, True) for v, val in value.items() if op_name(val) == "relax.add"
                  and len(tensor_shape(v) or ()) == 4)
    paths = VarMap((v, _state_paths(reader, v, adds)) for v in adds.keys())

    def is_term(a):
        """An add that reads no earlier add through its own size and feeds one var: a term of
        the update (DPLR's ``k v^T + b (a^T S)``), not a state."""
        return not paths[a] and len(reader.users.get(a, [])) == 1

    prev, nxt = VarMap(), VarMap()
    for v in adds.keys():
        found = [f for f in paths[v] if not is_term(f[0])]
        if len(found) == 1:
            p = found[0][0]
            prev[v] = p
            nxt[p] = None if p in nxt else v      # (two successors: no chain)
    chains = []
    for v in adds.keys():
        if v in prev and nxt.get(prev[v]) is not None:
            continue               # not a first state
        chain = [v]
        while nxt.get(chain[-1]) is not None:
            chain.append(nxt[chain[-1]])
        # a partial sum (``S * w + b sa`` of ``S * w + b sa + k v^T``) feeds only the next add
        chain = [x for x, y in zip(chain, chain[1:]) if list(reader.users.get(x, [])) != [y]] + chain[-1:]
        if len(chain) >= 2:
            chains.append(chain)
    return chains


def _state_path(reader, var, stop):
    """``(state, [argument positions])``: the one var of ``stop`` that ``var`` reads through
    vars of its own size (views of it: a matmul's (B*H, K, V)), and the path to it; None when
    there is not exactly one."""
    found = _state_paths(reader, var, stop)
    return found[0] if len(found) == 1 else None


def _state_paths(reader, var, stop):
    """Every ``(var of stop, path)`` that ``var`` reads through vars of its own size."""
    size = _size(var)
    found, seen, frontier = [], VarMap(), [(var, [])]
    for _ in range(16):
        nxt = []
        for x, path in frontier:
            for i, a in enumerate(_args(reader.val(x))):
                if not isinstance(a, relax.Var) or a in seen or _size(a) != size:
                    continue
                seen[a] = True
                if a in stop:
                    found.append((a, path + [i]))
                else:
                    nxt.append((a, path + [i]))
        frontier = nxt
    return found


def _size(x):
    shape = tensor_shape(x)
    return None if shape is None else int(np.prod(shape))


def _follow(reader, var, path):
    """The expression at argument positions ``path`` below ``var`` (None if it leaves the
    bindings): step 0's previous state, where step 1 finds its own."""
    x = var
    for n, i in enumerate(path):
        args = _args(reader.val(x))
        if i >= len(args) or (n < len(path) - 1 and not isinstance(args[i], relax.Var)):
            return None
        x = args[i]
    return x


def _readout_var(reader, step, states):
    """The readout of ``step.S``: the var, reached from it without entering the next states,
    that is stacked into (or written to) the output."""
    b, h, _, value = tensor_shape(step.S)
    size = int(b) * int(h) * int(value)
    frontier, seen = [step.S], VarMap()
    for _ in range(24):
        nxt = []
        for x in frontier:
            for u in reader.users.get(x, []):
                if u == "return" or u in seen or u in states:
                    continue
                seen[u] = True
                val = reader.val(u)
                if op_name(val) in ("relax.concat", "relax.where") and x is not step.S:
                    return _below_views(reader, x, size)
                nxt.append(u)
        frontier = nxt
    raise NotDelta(f"state {step.S.name}: no readout of it is stacked into an output")


def _below_views(reader, x, size):
    """``x``, or the var below its views (broadcasts, reshapes) with ``size`` elements: the
    readout itself, not its broadcast to the output buffer."""
    y = x
    while int(np.prod(tensor_shape(y) or (0,))) != size:
        val = reader.val(y)
        if op_name(val) not in ("relax.broadcast_to", "relax.expand_dims", "relax.reshape", "relax.squeeze") \
                or not isinstance(_args(val)[0], relax.Var):
            return x
        y = _args(val)[0]
    return y


def find_delta(func, value, users):
    """``[(var, DeltaMatch | reason str)]`` for the delta-rule state chains of ``func``."""
    if not isinstance(func.body, relax.SeqExpr):
        return []
    reader = _MReader(func, value, users)
    bindings = [b for blk in func.body.blocks for b in blk.bindings]
    found, an = [], None
    for chain in _state_chains(reader, value):
        try:
            an = an or _analysis(bindings)
            found.append((chain[0], _build(reader, chain, an)))
        except (NotDelta, NotStabilized) as err:
            if not any(q in str(err) for q in QUIET):
                found.append((chain[0], str(err)))
        except EVAL_ERRORS + (NotLiftable,) as err:
            found.append((chain[0], f"could not be read: {type(err).__name__}: {err}"))
    return found


def _build(reader, chain, an):
    """The chain's match; when its first state is no step (``S = zeros + S0``, an initial
    state added in), the chain after it, from that state."""
    _, path = _state_path(reader, chain[1], VarMap([(chain[0], True)]))
    prev0 = _follow(reader, chain[0], path)
    try:
        if prev0 is None:
            raise NotDelta(f"state {chain[0].name}: no previous state where step 1 has one")
        return _build_from(reader, [_Step(chain[0], prev0)] +
                           [_Step(s, p) for p, s in zip(chain, chain[1:])], an)
    except NotDelta:
        if len(chain) < 3:
            raise
        return _build_from(reader, [_Step(s, p) for p, s in zip(chain, chain[1:])], an)


def _read_steps(reader, steps, states, leaf, rng, transposed):
    """The spec fields read off steps 0, 1 and the last (each step's ops set), equal for all."""
    fields = None
    for idx in sorted({0, 1, len(steps) - 1}):
        step = steps[idx]
        ops, got = _StepReader(reader, step, states, leaf, rng, transposed).read()
        step.ops = ops
        if fields is None:
            fields = got
        elif {k: v for k, v in got.items() if k != "scale"} != {k: v for k, v in fields.items() if k != "scale"} \
                or abs(got["scale"] - fields["scale"]) > 1e-6 * max(1.0, abs(fields["scale"])):
            raise NotDelta(f"step {idx} is not read as step 0 is: {got} vs {fields}")
    fields["transposed"] = transposed
    return fields


def _build_from(reader, steps, an):
    states = VarMap((s.S, True) for s in steps)
    for step in steps:
        step.y = _readout_var(reader, step, states)
    rng = np.random.default_rng(0)
    leaves = VarMap()

    def leaf(var):
        if var not in leaves:
            leaves[var] = random_input(var.ty, rng, 1.0)
        return leaves[var]

    for transposed in (False, True):
        try:
            fields = _read_steps(reader, steps, states, leaf, rng, transposed)
            break
        except NotDelta as err:
            if transposed or "applied to every column alike" not in str(err):
                raise
    reverse, window = _step_window(an, steps, [n for n, x in steps[0].ops.items() if x is not None],
                                   lambda step, name: step.ops[name], NotDelta, "the others")
    output, out_axis, inside = reader.gathered(steps, reverse)
    if len(tensor_shape(output) or ()) == 3:
        out_axis = 2             # a bare concat of (B, H, V) readouts: (B, H, L*V) holds (B, H, L, V)
    region = set(inside) | {s.y for s in steps} | {s.S for s in steps}
    region |= set(_closure(reader, [s.y for s in steps] + [s.S for s in steps[1:]], states, depth=24))
    last_used = any(u == "return" or u not in region for u in reader.users.get(steps[-1].S, []))
    batch, heads, key, value = (int(n) for n in tensor_shape(steps[0].S))
    if fields["transposed"]:
        key, value = value, key
    dtype = tensor_dtype(output)
    if dtype not in SUPPORTED_DTYPES:
        raise NotDelta(f"dtype {dtype}: scans take {'/'.join(SUPPORTED_DTYPES)}")
    spec = DeltaScanSpec(batch, heads, len(steps), key, value, fields["decay"], heads, fields["scale"],
                         False, fields["separate_read"], bool(reverse), True, last_used, dtype, fields["rule"])
    names = tuple(sorted((v.name for v in region if v in reader.vmap), key=lambda n: (len(n), n)))
    return DeltaMatch(steps, spec, output, out_axis, last_used, an, window, names, fields["transposed"])


def emit_delta(bb, match, visit):
    """Emit ``match``'s scan with ``bb``; returns ``[(old var, new expr)]``: the stacked
    output and, where read, the final state."""
    emit, spec, first = bb.emit, match.spec, match.steps[0]
    lifter = Lifter(match.analysis, match.window, emit, visit)
    b, h, length = spec.batch, spec.heads, spec.length

    def seq(expr, last, what):
        return head_major_sequence(lifter, emit, expr, (b, h), length, last, spec.dtype, what)

    ops = first.ops
    operands = [seq(ops["q"], spec.key, "q"), seq(ops["k"], spec.key, "k"), seq(ops["v"], spec.value, "v")]
    if spec.is_dplr:
        operands += [seq(ops["a"], spec.key, "a"), seq(ops["b"], spec.key, "b")]
    elif ops["beta"] is None:
        beta = relax.const(np.ones((b, h, length), dtype="float32"))
        operands.append(beta if spec.dtype == "float32" else emit(relax.op.astype(beta, spec.dtype)))
    else:
        operands.append(seq(ops["beta"], None, "beta"))
    if spec.decay != "none":
        g = seq(ops["g"], spec.key if spec.decay == "key" else None, "the decay")
        operands.append(g if first.log_decay else emit(relax.op.log(g)))
    if spec.separate_read:
        operands.append(seq(ops["p"], spec.key, "p"))
    s0 = visit(first.prev)
    if match.transposed:
        s0 = emit(relax.op.permute_dims(s0, [0, 1, 3, 2]) if len(tensor_shape(s0) or ()) == 4 else s0)
    if tuple(tensor_shape(s0)) != (b, h, spec.key, spec.value):
        s0 = emit(relax.op.broadcast_to(s0, (b, h, spec.key, spec.value)))
    operands.append(s0 if tensor_dtype(s0) == "float32" else emit(relax.op.astype(s0, "float32")))
    got = emit_spec_scan(emit, spec, operands)
    out, parts = (got[0], got[1:]) if spec.return_last_state else (got, [])
    replaced = [(match.output, as_stacked_output(emit, out, match.output, match.out_axis))]
    last = match.steps[-1].S
    if match.transposed:
        parts = [emit(relax.op.permute_dims(new, [0, 1, 3, 2])) for new in parts]
    replaced += [(last, as_value_of(emit, new, last)) for new in parts]
    return replaced


def find_delta_scans(mod):
    """The delta-rule loops of every Relax function in ``mod`` as ``chains.Recurrence``s of
    form ``"delta"`` (accepted: ``rec.delta`` holds the match; near misses the reason)."""
    from ...chains import Recurrence  # pylint: disable=import-outside-toplevel

    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for var, match in find_delta(func, value, _users(func)):
            if isinstance(match, DeltaMatch):
                spec = match.spec
                found.append(Recurrence(gvar.name_hint, "delta", match.length, match.out_axis, spec.reverse,
                                        (spec.batch, spec.heads, spec.key, spec.value), spec.dtype,
                                        match.bindings, delta=match))
            else:
                found.append(Recurrence(gvar.name_hint, "delta", 0, 0, False, tensor_shape(var) or (),
                                        tensor_dtype(var), (var.name,), rejected=True,
                                        reason=f"a matrix-state loop from {var.name} is not a delta-rule "
                                               f"scan: {match}"))
    return found
