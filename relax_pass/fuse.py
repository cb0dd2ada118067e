"""FuseAffineRecurrences: replace each unrolled affine recurrence with one ScanWeaver scan.

Put it first in a ``relax.transform`` pipeline, right after import (``sw.pipeline`` does).
For every chain found by ``chains.find_chains`` it emits, at the chain's first step:
the whole-sequence coefficients (the step's elementwise template applied to the unsliced
tensors), one ``scanweaver.affine_scan`` call, and what the rest of the graph used: the stacked
states replace the ``concat`` that gathered the steps, the final state replaces uses of the
last step, and any other use of an intermediate state reads its slice of the scan's output.
Nothing else changes; the dead per-step bindings are then removed by DeadCodeElimination.
Chains it is unsure of are left exactly as they were (``find_recurrences`` says why).
"""
import numpy as np
import tvm
from tvm import relax

from scanweaver_core.exprs import error_line
from scanweaver_core.scan_op import emit_affine_scan, make_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from .chains import Recurrence, find_chains
from .chunked import ChunkedMatch, find_chunked
from .chunked_emit import emit_chunked
from .unpad import unpad
from .cumulative import cumulative_recurrences, cumulative_scan
from .interpret import Interpreter, Unsupported, cached_constants
from .lift import Lifter
from .matrix import MatrixMatch, match_matrix, readout_einsum_split
from .matrix_lifted import LiftedMatch, emit_lifted, find_lifted
from .prune import prune_dead_bindings
from .matrix_layout import (canonical, emit_matrix_scan, epilogue_stack, readouts_from_scan,
                            scan_to_stack, state_from_scan)
from .selective import SelectiveMatch, match_selective
from .stabilized import emit_stabilized, find_stabilized_scans
from .steps import ONE, op_name, tensor_dtype, tensor_shape
from .validate import validate


def find(mod, cumulative=False):
    """All recurrences of every Relax function in ``mod``, accepted and rejected, before
    validation; accepted chains that are Mamba selective scans get ``form == "selective"`` and
    their match; with ``cumulative``, also ``cumsum``/``cumprod`` ops."""
    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        users = _users(func)
        value = {b.var: b.value for blk in func.body.blocks for b in blk.bindings}
        for block in func.body.blocks:
            if cumulative:
                found.extend(cumulative_recurrences(gvar.name_hint, block.bindings))
            for rec in find_chains(gvar.name_hint, block.bindings):
                rec.facts = (users, value)
                if not rec.rejected and rec.dtype not in SUPPORTED_DTYPES:
                    rec.rejected, rec.reason = True, (
                        f"dtype {rec.dtype}: scans take {'/'.join(SUPPORTED_DTYPES)}; left as it "
                        "was (TVM compiles its steps)")
                if not rec.rejected:
                    match = match_selective(rec, value, users)
                    if isinstance(match, SelectiveMatch):
                        rec.form, rec.selective = "selective", match
                    else:
                        rec.selective_miss = match
                        _try_matrix(rec, value, users)
                found.append(rec)
    return found


_MATCHER_ERRORS = (RuntimeError, ValueError, TypeError, KeyError, IndexError)


def _try_matrix(rec, value, users):
    """Mark ``rec`` a matrix-state scan when ``match_matrix`` reads it as one."""
    if len(rec.state_shape) < 2:
        return
    try:
        match = match_matrix(rec, value, users)
    except _MATCHER_ERRORS as err:     # a form the matcher did not foresee: leave it affine
        match = f"the matrix matcher could not read it: {error_line(err)}"
    if isinstance(match, MatrixMatch):
        rec.form, rec.matrix = "matrix", match
    else:
        rec.matrix_miss = match


def fuse(mod, cumulative=False):
    """``(new module, recurrences)``: every accepted recurrence rewritten and validated
    (``validate.py``); one that fails validation is marked rejected with the reason and left
    exactly as it was."""
    with cached_constants():      # every validation reads the same weights: convert them once
        chunked = find_chunked_scans(mod)
        if any(not r.rejected for r in chunked):   # first: their chunk loops are not chains
            mod, chunked = _fuse(mod, chunked)
            mod = unpad(mod, prune_dead_bindings)   # the padding the region needed goes too
        found = find(mod, cumulative)
        new, recurrences = _fuse_split_readouts(mod, found, cumulative) or _fuse(mod, found)
        recurrences = chunked + recurrences
        stabilized = find_stabilized_scans(new)             # RWKV's WKV (stabilized.py)
        if any(not r.rejected for r in stabilized):
            new, stabilized = _fuse(new, stabilized)
            covered = {n for r in stabilized if not r.rejected for n in r.bindings}
            recurrences = [r for r in recurrences    # (its max chain's near miss is now a scan)
                           if not (r.rejected and r.bindings and set(r.bindings) <= covered)]
        recurrences = recurrences + stabilized
        lifted = find_lifted_scans(new)
        if not lifted:
            return new, recurrences
        new, lifted = _fuse(new, lifted)
        return new, recurrences + lifted


def find_chunked_scans(mod):
    """Matrix-state scans in chunked form (``chunked.py``: Mamba-2's SSD, chunk-wise linear
    attention), as recurrences of form ``"matrix"`` carrying their match; a region that looks
    chunked but is not one is a near miss with the reason."""
    found = []
    for gvar, func in mod.functions_items():
        for var, match in find_chunked(func):
            if isinstance(match, ChunkedMatch):
                spec = match.spec
                names = tuple(sorted((v.name for v in match.region), key=lambda n: (len(n), n)))
                found.append(Recurrence(gvar.name_hint, "matrix", spec.length,
                                        match.out_labels.index("L"), spec.reverse, spec.state_shape,
                                        spec.dtype, names, chunked=match))
            else:
                found.append(Recurrence(gvar.name_hint, "matrix", 0, 0, False, (), tensor_dtype(var),
                                        (var.name,), rejected=True,
                                        reason=f"a chunked region ending at {var.name} is not a matrix "
                                               f"scan: {match}"))
    return found


def _fuse_split_readouts(mod, found, cumulative):
    """``_fuse`` on ``mod`` with each readout einsum of three or more operands that reads a
    matrix state (ONNX keeps ``einsum("nhd,nhdm,nh->nhm", q, S, 1 / z)`` one op) split into
    ``q^T S`` and the rest, when that makes more matrix scans and every split readout is
    replaced by one; else None (``mod`` is fused as it is)."""
    splits = {}
    for rec in found:
        if rec.rejected or rec.form != "affine" or len(rec.state_shape) < 2 or rec.facts is None:
            continue
        users, value = rec.facts
        for state in rec.states:
            for u in users.get(state, []):
                plan = readout_einsum_split(value.get(u), state) if isinstance(u, relax.Var) else None
                if plan is not None:
                    splits[u] = plan
    if not splits:
        return None
    split, inner = _split_einsums(mod, splits)
    again = find(split, cumulative)
    if sum(r.form == "matrix" for r in again) <= sum(r.form == "matrix" for r in found):
        return None
    new, recurrences = _fuse(split, again)
    bound = {b.var for gvar, func in new.functions_items() if isinstance(func, relax.Function)
             and isinstance(func.body, relax.SeqExpr) for blk in func.body.blocks for b in blk.bindings}
    if any(v in bound for v in inner):
        return None                      # a split readout is left: keep the einsum as it was
    return new, recurrences


@relax.expr_functor.mutator
class _EinsumSplitter(relax.PyExprMutator):
    def __init__(self, mod, splits):
        super().__init__(mod)
        self.splits = splits
        self.inner = []

    def visit_var_binding_(self, binding):
        plan = self.splits.get(binding.var)
        if plan is None:
            super().visit_var_binding_(binding)
            return
        i, j, inner_subs, rest, outer_subs = plan
        bb = self.builder_
        ops = [self.visit_expr(f) for f in binding.value.args[0].fields]
        inner = bb.emit(relax.op.einsum([ops[i], ops[j]], inner_subs))
        self.inner.append(inner)
        value = relax.op.einsum([inner] + [ops[r] for r in rest], outer_subs)
        if not isinstance(binding.var, relax.DataflowVar) and bb.current_block_is_dataflow():
            self.set_var_remap(binding.var, bb.emit_output(value))
        else:
            self.set_var_remap(binding.var, bb.emit(value))


def _split_einsums(mod, splits):
    """``mod`` with each einsum binding of ``splits`` (var -> ``readout_einsum_split``) made
    two einsums; also the inner ones' vars."""
    splitter = _EinsumSplitter(mod, splits)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            splitter.builder_.update_func(gvar, splitter.visit_expr(func))
    return splitter.builder_.get(), splitter.inner


def find_lifted_scans(mod):
    """Matrix-state scans in whole-sequence form (``matrix_lifted.py``: ONNX ``Scan`` bodies,
    the torch ``scan`` op, chains the per-step matcher did not read), as recurrences of form
    ``"matrix"`` carrying their match (affine scans that are not one stay as they are)."""
    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for var, match in find_lifted(func, _users(func), _MATCHER_ERRORS):
            if isinstance(match, LiftedMatch):
                spec = match.spec
                found.append(Recurrence(gvar.name_hint, "matrix", spec.length, 2, spec.reverse,
                                        spec.state_shape, spec.dtype, (var.name,), lifted=match))
    return found


def _fuse(mod, recurrences):
    while True:
        try:
            new, replaced = rewrite(mod, recurrences)
        except (RuntimeError, ValueError, TypeError, KeyError) as err:
            _reject_unbuildable(mod, recurrences, err)
            continue
        failed = False
        for rec in recurrences:       # (one validated before a retry is the same rewrite)
            if rec.rejected or rec.validation_s is not None or id(rec) not in replaced:
                continue
            try:
                given = rec.chunked.inputs if rec.chunked is not None else ()   # local to its region
                ok, why, seconds = validate(mod[rec.function], new[rec.function], replaced[id(rec)], given)
            except _MATCHER_ERRORS + (ArithmeticError,) as err:   # numpy refused a probe value
                ok, why, seconds = False, f"the probe run could not evaluate it: {error_line(err)}", 0.0
            rec.validation_s = seconds
            if not ok:
                rec.rejected, rec.reason, failed = True, f"validation failed: {why}", True
        if not failed:
            return new, recurrences


def _reject_unbuildable(mod, recurrences, err):
    """A rewrite raised (TVM refused an op it built): find the chains that cannot be built
    alone and leave them as they were, saying why."""
    culprits = []
    for rec in recurrences:
        if rec.rejected:
            continue
        try:
            rewrite(mod, [rec])
        except (RuntimeError, ValueError, TypeError, KeyError) as own:
            culprits.append((rec, own))
    if not culprits:
        raise err
    for rec, own in culprits:
        rec.rejected, rec.reason = True, f"its whole-sequence coefficients could not be built: {error_line(own)}"


def analyze(mod, cumulative=False):
    """What ``FuseAffineRecurrences(cumulative)`` finds in ``mod``, validated (``fuse``)."""
    return fuse(mod, cumulative)[1]


def _users(func):
    """var -> names of the bindings (or ``"return"``) that use it."""
    users = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users.setdefault(v, []).append(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users.setdefault(v, []).append("return")
    return users


def _written_buffers(rec, value, users):
    """In-place output writes ``out = x.new_empty(..); out[:, t] = h_t`` export as one
    ``where(arange == t, broadcast(h_t), out)`` per step over the whole buffer.  A last such
    ``where`` that equals the states stacked at an axis (checked by evaluating it on random
    states and a random first buffer: every slot written, in time order) is that stack:
    ``{buffer var: (axis, the bindings that built it)}``."""
    shape, n = rec.state_shape, rec.length
    found = {}
    rng = np.random.default_rng(5)
    for v, val in value.items():
        full = tensor_shape(v)
        if op_name(val) != "relax.where" or full is None or len(full) != len(shape) + 1:
            continue
        fits = [k for k in range(len(shape) + 1) if full == shape[:k] + (n,) + shape[k:]]
        if not fits or any(op_name(value.get(u)) == "relax.where" and tensor_shape(u) == full
                           for u in users.get(v, []) if isinstance(u, relax.Var)):
            continue                    # not of a stack's shape, or not the last write
        env = {s: rng.standard_normal(shape) for s in rec.states}
        interp = Interpreter(value, missing=lambda var: rng.standard_normal(tensor_shape(var) or ()))
        interp.memo.update(env)
        try:
            got = interp(v)
        except (Unsupported, ValueError, TypeError, IndexError, KeyError):
            continue
        stacked = [env[s] for _, s in sorted(zip(rec.indices, rec.states), key=lambda p: p[0])]
        for k in fits:
            if np.array_equal(got, np.stack(stacked, k)):
                found[v] = (k, {x for x in interp.memo if x not in env})
                break
    return found


class _Plan:
    """What to emit for one accepted chain, and which bindings it replaces."""

    def __init__(self, rec, users, value):
        self.rec = rec
        states = rec.states
        first = min(rec.indices)
        self.position = {s: i - first for s, i in zip(states, rec.indices)}
        internal = rec.internal
        self.concats = {}                       # concat var -> (axis, expanded, increasing)
        for v, val in value.items():
            if op_name(val) == "relax.concat":
                got = self._stacking(val, value, users)
                if got is not None:
                    self.concats[v] = got
        consumed = {f for c in self.concats for f in value[c].args[0].fields} | set(self.concats)
        for buf, (axis, region) in _written_buffers(rec, value, users).items():
            self.concats[buf] = (axis, axis, True, None)   # out[:, t] = h_t for every t: a stack
            consumed |= region
        self.external = {}
        for s in states:
            uses = [u for u in users.get(s, []) if u not in internal and u not in consumed]
            if uses:
                self.external[s] = uses
        self.last = states[-1]
        self.need_states = bool(self.concats) or any(not s.same_as(self.last) for s in self.external)
        self.need_last = self.last in self.external

    def _stacking(self, concat, value, users):
        """``(axis, expand_axis or None, increasing, initial)`` when ``concat`` gathers exactly
        the chain's states (each maybe through its own ``expand_dims``) in time order or its
        reverse, maybe with the initial state in front or behind (``hs = [h0]`` before the loop:
        ``initial`` is then ``("first" | "last", that state)``); axes normalized
        (``torch.stack(hs, -1)`` exports with negative ones)."""
        fields = list(concat.args[0].fields)
        rank = len(self.rec.state_shape)
        states, expand_axes = [], set()
        for f in fields:
            inner = value.get(f)
            if (op_name(inner) == "relax.expand_dims" and len(inner.attrs.axis) == 1
                    and len(users.get(f, [])) == 1):
                expand_axes.add(int(inner.attrs.axis[0]) % (rank + 1))
                f = inner.args[0]
            else:
                expand_axes.add(None)
            states.append(f)
        initial = None
        if len(states) == len(self.rec.states) + 1:
            for end, k in (("first", 0), ("last", -1)):
                if self._is_initial(states[k]):
                    initial = (end, states[k])
                    states.pop(k)
                    break
        if len(expand_axes) != 1 or len(states) != len(self.rec.states) or set(states) != set(self.rec.states):
            return None
        order = [self.position[s] for s in states]
        n = len(order)
        if order == list(range(n)):
            increasing = True
        elif order == list(range(n - 1, -1, -1)):
            increasing = False
        else:
            return None
        expand = expand_axes.pop()
        return int(concat.attrs.axis) % (rank + (expand is not None)), expand, increasing, initial

    def _is_initial(self, x):
        """``x`` is the state before the first step: the chain's initial state, or zeros."""
        rec = self.rec
        if rec.initial is not None:
            return x.same_as(rec.initial)
        return tensor_shape(x) == rec.state_shape and rec.analysis.is_zeros(x)


def gathered(bb, states, axis, rank, cat_axis, expand, increasing, shape):
    """What ``concat([expand_dims(h_t, expand) ...], cat_axis)`` computed, from the scan's
    stacked ``states`` (L at ``axis``): concatenating the pieces along ``cat_axis`` is
    stacking them there and merging L with the next dim (a reshape)."""
    if not increasing:
        states = bb.emit(relax.op.flip(states, axis))
    if expand == cat_axis:                                             # a plain torch.stack
        perm = [i for i in range(rank + 1) if i != axis]
        perm.insert(cat_axis, axis)
        return states if perm == list(range(rank + 1)) else bb.emit(relax.op.permute_dims(states, perm))
    perm = [i for i in range(rank + 1) if i != axis] + [axis]        # L last
    if perm != list(range(rank + 1)):
        states = bb.emit(relax.op.permute_dims(states, perm))
    piece_rank = rank
    if expand is not None:                                             # the pieces' unit dim
        states = bb.emit(relax.op.expand_dims(states, [expand]))
        piece_rank += 1
    perm = list(range(piece_rank))
    perm.insert(cat_axis, piece_rank)                                  # L stacked at cat_axis
    if perm != list(range(piece_rank + 1)):
        states = bb.emit(relax.op.permute_dims(states, perm))
    if tensor_shape(states) != shape:
        states = bb.emit(relax.op.reshape(states, shape))
    return states


class _Epilogue:
    """Where a matrix scan's lifted epilogue replaces the stacked pieces (``rec.matrix.output``)."""

    def __init__(self, rec):
        self.rec = rec


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans              # first state var -> _Plan (affine) or the Recurrence
        self.dropped = set()
        self.replaced = {}              # id(recurrence) -> [(old var, new expr)]
        self._current = None
        self._pending = {}              # id(recurrence) -> (lifter, scan output) until its stack

    def visit_var_binding_(self, binding):
        plan = self.plans.get(binding.var)
        if plan is not None:
            self._current = self.replaced.setdefault(id(getattr(plan, "rec", plan)), [])
        if isinstance(plan, _Epilogue):
            # E(readout_t, x_t) lifted at the stack, where all it reads is bound (an invariant
            # such as D[:, None] may be bound inside the first step, after the scan)
            lifter, out = self._pending.pop(id(plan.rec))
            self._replace(binding.var, epilogue_stack(self.builder_, lifter, out, plan.rec.matrix))
        elif isinstance(plan, _Plan):
            self._emit(plan)
        elif plan is not None and plan.form == "selective":
            self._emit_selective(plan)
        elif plan is not None and plan.form == "matrix" and plan.lifted is not None:
            for old, new in emit_lifted(self.builder_, plan.lifted, self.visit_expr):
                self._replace(old, new)
        elif plan is not None and plan.form == "stabilized":
            for old, new in emit_stabilized(self.builder_, plan.stabilized, self.visit_expr):
                self._replace(old, new)
        elif plan is not None and plan.form == "matrix" and plan.chunked is not None:
            for old, new in emit_chunked(self.builder_, plan.chunked, self.visit_expr):
                self._replace(old, new)
        elif plan is not None and plan.form == "matrix":
            self._emit_matrix(plan)
        elif plan is not None:                              # cumsum / cumprod
            x = self.visit_expr(binding.value.args[0])
            self._replace(binding.var, cumulative_scan(plan, x, self.builder_.emit))
        if binding.var in self.dropped:
            return
        super().visit_var_binding_(binding)

    # -- emission ----------------------------------------------------------------------------
    def _emit(self, plan):
        rec, bb = plan.rec, self.builder_
        rank, axis = len(rec.state_shape), rec.axis
        lifter = Lifter(rec.analysis, (min(rec.indices), rec.length), bb.emit, self.visit_expr)
        a = self._vectorize(lifter, rec.a, rank - axis)
        b = self._vectorize(lifter, rec.b, rank - axis)
        outputs = tuple(k for k, need in (("states", plan.need_states), ("last", plan.need_last)) if need)
        h0 = self.visit_expr(rec.initial) if rec.initial is not None else None
        outs = emit_affine_scan(bb.emit, None if a is ONE else a, b, h0, rec.state_shape, rec.length,
                                axis, rec.reverse, outputs)
        for s, uses in plan.external.items():
            if s.same_as(plan.last):
                self._replace(s, outs["last"])
            else:
                pos = relax.const(plan.position[s], "int64")
                self._replace(s, bb.emit(relax.op.take(outs["states"], pos, axis=axis)))
        for c, (cat_axis, expand, increasing, initial) in plan.concats.items():
            shape = list(tensor_shape(c))
            if initial is not None:                 # hs = [h0, h1, ...]: h0's piece, then the states
                piece = self.visit_expr(initial[1])        # (bound before the chain; its own
                if expand is not None:                    # expand_dims may come after it)
                    piece = bb.emit(relax.op.expand_dims(piece, [expand]))
                shape[cat_axis] -= tensor_shape(piece)[cat_axis]
            states = gathered(bb, outs["states"], axis, rank, cat_axis, expand, increasing, tuple(shape))
            if initial is not None:
                pieces = [piece, states] if initial[0] == "first" else [states, piece]
                states = bb.emit(relax.op.concat(pieces, cat_axis))
            self._replace(c, states)

    def _emit_selective(self, rec):
        bb, match = self.builder_, rec.selective
        args = []
        for x, axes, shape, dtype in match.operands:     # each in the spec's layout and dtype
            e = self.visit_expr(x)
            if axes is not None:
                e = bb.emit(relax.op.permute_dims(e, axes))
            if shape is not None and tensor_shape(e) != tuple(shape):
                e = bb.emit(relax.op.reshape(e, shape))
            if tensor_dtype(e) != dtype:
                e = bb.emit(relax.op.astype(e, dtype))
            args.append(e)
        scan = bb.emit(make_scan(match.spec, args), "selective_scan")
        y = bb.emit(relax.TupleGetItem(scan, 0)) if match.spec.return_last_state else scan
        if match.out_axes is not None:
            y = bb.emit(relax.op.permute_dims(y, match.out_axes))
        if tensor_dtype(y) != match.out_dtype:
            y = bb.emit(relax.op.astype(y, match.out_dtype))
        self._replace(match.output, y)
        if match.spec.return_last_state:
            self._replace(rec.states[-1], bb.emit(relax.TupleGetItem(scan, 1)))

    def _emit_matrix(self, rec):
        bb, match = self.builder_, rec.matrix
        spec = match.spec
        lifter = Lifter(rec.analysis, (min(rec.indices), rec.length), bb.emit, self.visit_expr)
        factors = {"q": match.q, "k": match.k, "v": match.v, "decay": match.decay}
        h0 = self.visit_expr(rec.initial) if spec.has_h0 else None
        scan, out = emit_matrix_scan(
            bb, spec, match.roles, match.roles, factors, h0,
            lambda f, inner: canonical(bb, *lifter.lift(f.expr), f.labels, match.roles, inner))
        if match.epilogue is not None:         # pieces E(readout_t, x_t): lifted where stacked
            self._pending[id(rec)] = (lifter, out)
        elif match.output is not None:
            self._replace(match.output, scan_to_stack(bb, out, match.roles, match.out_labels,
                                                      tensor_shape(match.output), tensor_dtype(match.output)))
        else:                                   # pieces compute more from each readout
            first = min(rec.indices)
            positions = [t - first for _, t in match.readout_vars]
            for (r, _), value in zip(match.readout_vars, readouts_from_scan(bb, out, match, positions)):
                self._replace(r, value)
        if spec.return_last_state:
            last = state_from_scan(bb, bb.emit(relax.TupleGetItem(scan, 1)), match.roles, rec.state_shape)
            self._replace(rec.states[-1], last)

    def _replace(self, var, new):
        if not isinstance(var, relax.DataflowVar) and self.builder_.current_block_is_dataflow():
            # an output of the dataflow block (ONNX returns the stacked readouts themselves):
            # its replacement is bound as one, or the return would read a var of the block
            new = self.builder_.emit_output(new)
        self.set_var_remap(var, new)
        self.dropped.add(var)
        self._current.append((var, new))

    def _vectorize(self, lifter, expr, rho):
        """The whole-sequence tensor of a step coefficient, time ``rho`` dims from the end."""
        if expr is ONE:
            return expr
        return lifter.align(*lifter.lift(expr), rho)


def rewrite(mod, recurrences):
    """Apply the accepted ``recurrences`` (from ``find(mod)``): ``(new module, replaced)``,
    ``replaced`` mapping ``id(rec)`` to the ``(old var, new expr)`` pairs it replaced."""
    by_function = {}
    for rec in recurrences:
        if not rec.rejected:
            by_function.setdefault(rec.function, []).append(rec)
    if not by_function:
        return mod, {}
    plans = {}
    for recs in by_function.values():
        for rec in recs:
            if rec.form == "matrix" and rec.lifted is not None:
                plans[rec.lifted.scan] = rec         # at the whole-sequence scan it replaces
                continue
            if rec.form == "stabilized":
                plans[rec.stabilized.emit_at] = rec    # at the stacked output it replaces
                continue
            if rec.form == "matrix" and rec.chunked is not None:
                plans[rec.chunked.emit_at] = rec     # at the first of its outputs
                continue
            if rec.form == "matrix":            # at the first step, like an affine chain
                plans[rec.states[len(rec.states) - len(rec.bindings)]] = rec
                if rec.matrix.epilogue is not None:
                    plans[rec.matrix.output] = _Epilogue(rec)
                continue
            if rec.form != "affine":            # selective, cumsum, cumprod: emitted from rec
                plans[rec.selective.emit_at if rec.form == "selective" else rec.states[0]] = rec
                continue
            plan = _Plan(rec, *rec.facts)
            if plan.need_states or plan.need_last:
                # emitted at the first step, whose operands (rec.a, rec.b) are all bound by then;
                # not at an h_0 = b_0 state put in front of it (fuzz case 1063: a coefficient
                # recomputed per step is bound after h_0)
                plans[rec.states[len(rec.states) - len(rec.bindings)]] = plan
    rewriter = _Rewriter(mod, plans)
    for name in by_function:
        gvar = mod.get_global_var(name)
        rewriter.builder_.update_func(gvar, rewriter.visit_expr(mod[gvar]))
    new = rewriter.builder_.get()
    for name in by_function:
        gvar = new.get_global_var(name)
        new[gvar] = prune_dead_bindings(new[gvar])
    return new, rewriter.replaced


@tvm.transform.module_pass(opt_level=0, name="scanweaver.FuseAffineRecurrences")
class FuseAffineRecurrences:
    """Replace each affine recurrence found in the module's Relax functions by one scan;
    ``cumulative=True`` also turns ``cumsum``/``cumprod`` into scans."""

    def __init__(self, cumulative=False):
        self.cumulative = cumulative

    def transform_module(self, mod, _ctx):
        return fuse(mod, self.cumulative)[0]
