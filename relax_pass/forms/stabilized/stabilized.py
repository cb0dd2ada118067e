"""Max-stabilized recurrences (RWKV-4's WKV) read from an unrolled loop, by what they compute.

HF ``RwkvForCausalLM`` on a CPU runs ``rwkv_linear_attention_cpu``: per step a max state
``m_t = maximum(m_{t-1} + w, k_t)`` and two states rescaled by it,
``num_t = exp(m_{t-1} + w - m_t) num_{t-1} + exp(k_t - m_t) v_t`` and ``den_t`` (the same with
1 for ``v_t``), read out before the update with the bonus ``u`` and written in place into an
output buffer.  ``torch.export`` unrolls it into ~35 bindings a step.  None of them is affine in
the state (``chains.py`` reports the max steps as a near miss); together they are one step of
the max-stabilized monoid (``algebra.log_compose``), i.e. one ``StabilizedScanSpec`` scan.

How a loop is read (``find_stabilized``; steps 1-3 by ``reader.py``):

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
``standalone.py`` holds the form as a pass of its own (``fuse_stabilized``).
"""
from dataclasses import dataclass

import numpy as np
from tvm import relax

from scanweaver_core import algebra
from scanweaver_core.exprs import VarMap, tensor_dtype, tensor_shape
from scanweaver_core.scan_op import emit_stabilized_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from ...form import users_of
from ...interpret import Interpreter, random_input
from ...interpret_ops import Unsupported
from ...lift import Lifter, NotLiftable
from .reader import RTOL, NotStabilized, _analysis, _args, _is, _Reader, _Step

__all__ = ["StabilizedMatch", "find_stabilized", "find_stabilized_scans", "emit_stabilized"]


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
