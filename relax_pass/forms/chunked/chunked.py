"""Matrix-state scans written in their chunked (parallel) form: Mamba-2's SSD, chunk-wise GLA.

Models shipped since 2024 compute ``S_t = g_t S_{t-1} + k_t v_t^T, o_t = q_t^T S_t`` with no
loop over time: the sequence is zero-padded to a multiple of a chunk length and reshaped into
(chunks, chunk) blocks; a cumsum of the log-decay, masked pairwise differences, contractions
within each chunk and a state passed from chunk to chunk (a loop over chunks or a masked
contraction over them) make the output, reshaped back.  Found by what it computes:

1. the *region*: the bindings between the reshapes that split time into blocks (its entries)
   and one that merges blocks back (its exit), holding a ``cumsum``; or between slices of
   consecutive blocks of rows and their concat (a loop over blocks: MiniMax's lightning
   attention); or the (L, L) form of ``parallel_form.py`` (the frame: ``region.py``);
2. its *operands*: the tensors the entries reshape (seen through their zero padding), and any
   other data it reads (an initial state);
3. their roles and layouts: the operand its cumsums sum is the log-decay, the others are q, k
   and v (v has the output's extents; else probe runs tell); each tensor's dims
   get batch/head/feature labels consistent with their extents; the first assignment whose
   output equals ``reference.matrix_scan`` (and whose other outputs equal its final state) is
   the match (``chunked_roles.py``).  The rewrite is then validated like every other
   (``validate.py``), locally: both sides from the same random operands.
"""
from dataclasses import dataclass

import numpy as np
from tvm import relax

from scanweaver_core.exprs import VarMap, error_line, op_name, tensor_dtype, tensor_shape
from scanweaver_core.spec import SUPPORTED_DTYPES, MatrixScanSpec

from ...interpret import EVAL_ERRORS, slice_span
from ...narrow import narrowed
from .chunked_roles import NotChunked, Operand, assign_roles, role_orders, state_layout
from .parallel_form import READ_THROUGH, parallel_regions
from .region import Entry, Exit, _dead, _Facts, _Probe, _region, entries_and_exits


@dataclass
class ChunkedMatch:
    """What the rewrite emits for one region."""
    spec: MatrixScanSpec
    q: Operand
    k: Operand
    v: Operand
    log_decay: Operand       # or None (no decay, or a constant one)
    h0: Operand              # or None
    output: relax.Var        # the exit: the blocks merged back (time padded to ``padded``)
    out_labels: tuple
    padded: int
    final: tuple             # ((var, labels), ...): other uses that are the final state
    emit_at: relax.Var       # the first of output / final vars in binding order
    region: frozenset        # the region's bindings (replaced)
    decay_values: object = None   # a constant decay per head (H,) when no log-decay is read
    scale: object = None          # the output's scale per head (H,) (on the scores), or None
    inputs: tuple = ()            # what validation draws at random: the operands, seen above the
                                  # zero padding of those padded before they were scaled


# ---------------------------------------------------------------- the region


# ---------------------------------------------------------------- evaluation


# ---------------------------------------------------------------- matching

def _partitions(entries, source, length):
    """The slices of ``source`` among ``entries`` cover ``[0, length)`` in two or more
    consecutive blocks (one loop step each) of two or more rows but the last (a loop over
    single steps is the loop finders')."""
    spans = sorted({e.span for e in entries if e.source.same_as(source)})
    if len(spans) < 2 or spans[0][0] != 0 or spans[-1][1] != length:
        return False
    if any(b - a < 2 for a, b in spans[:-1]):
        return False
    return all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def match_region(facts, ex, entries, tainted):
    """A ``ChunkedMatch`` for the region ending at exit ``ex``; raises ``NotChunked``."""
    exit_var, exit_axis, blocks = ex.var, ex.axis, ex.blocks
    region = _region(facts, exit_var, tainted, entries)
    mine = [e for e in entries if e.var in region]
    if blocks is not None and not any(
            op_name(facts.value[v]) == "relax.cumsum"
            and (tensor_shape(v) or (0,))[int(facts.value[v].attrs.axis)] in blocks for v in region):
        raise NotChunked("no cumsum over a block in it")     # (or over the blocks: their states)
    sources = VarMap()
    for e in mine:
        sources.setdefault(e.source, e.axis)
    seq = list(sources.keys())
    shapes = {v: tensor_shape(v) for v in seq}
    padded = ex.length
    if None in shapes.values():
        raise NotChunked("its inputs' shapes are not static")
    if any(e.span is not None for e in mine) and not all(_partitions(mine, v, padded) for v in seq):
        raise NotChunked("not blocked tensors")     # (slices that are no loop over blocks: quiet)
    lengths = {shapes[v][sources[v]] for v in seq}
    length = min(lengths)
    if not lengths <= {length, padded}:       # (an input padded before it was scaled: its tail is
        raise NotChunked("its inputs do not share one length")   # never read by earlier steps)
    if length < 2:
        raise NotChunked("one step")            # (no scan; not reported, as for chains)
    if blocks is not None and padded - length >= blocks[1]:
        raise NotChunked(f"its inputs' length {length} does not fill {blocks[0]} blocks of {blocks[1]}")
    side = []
    for v in region:
        if v in sources:             # (an operand read as it is: a parallel form's q, k, v)
            continue
        for r in facts.reads[v]:
            if r not in region and r not in sources and not _pad_of(facts, r, sources) \
                    and not facts.constant(r) and r not in side:
                side.append(r)
    if len(seq) < 2:
        raise NotChunked("one blocked tensor")  # (a reshape into blocks and back: quiet)
    if len(seq) not in (3, 4) or len(side) > 1:
        raise NotChunked(f"it reads {len(seq)} blocked tensors and {len(side)} other ones "
                         "(a chunked matrix scan reads q, k, v and a log-decay, maybe an initial state)")
    external = []
    for v in region:
        if v in sources or _prepared(facts, v, sources):     # (kept as they are: not the state)
            continue
        for u in facts.users.get(v, []):
            if (u != "return" and u not in region and v != exit_var and u not in external
                    and not _dead(facts, u)):
                external.append(u)
            if v != exit_var and (u == "return" or _returned_tuple(facts, u)):
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
    env = VarMap((v, _zero_tail(rng.uniform(-0.5, 0.5, shapes[v]), sources[v], length)) for v in seq)
    for s in side:        # zero for the probes of roles (an initial state adds an offset)
        env[s] = np.zeros(tensor_shape(s))
    try:
        orders = role_orders(probe, out_var, linear, env, exit_axis, sources, length)
    except EVAL_ERRORS as err:
        raise NotChunked(f"it cannot be evaluated: {error_line(err)}") from None
    for s in side:
        env[s] = rng.uniform(-1.0, 1.0, tensor_shape(s))
    # the oracle's inputs: decays below 1, the others as before
    if log_decay is not None:
        env[log_decay] = _zero_tail(rng.uniform(-0.6, 0.0, shapes[log_decay]), sources[log_decay], length)
    (y,) = probe(env, [out_var])
    finals = _FinalState(facts, region, (exit_var, out_var), sources, side, probe.evaluator(env), external)
    match = assign_roles(orders, env, y, finals, out_var, exit_axis, log_decay, side, sources,
                         length, out_padded)
    region.update((v, True) for v in finals.absorbed)
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
    inputs = []
    for op in (match["q"], match["k"], match["v"], match["log_decay"], match["h0"]):
        if op is not None:
            vars_ = relax.analysis.free_vars(op.source()) if op.expr is not None else \
                _above_padding(facts, op.var, op.labels.index("L"), spec.length) if "L" in op.labels else [op.var]
            inputs.extend(v for v in vars_ if v not in inputs)
    return ChunkedMatch(output=out_var, padded=out_padded, emit_at=emit_at, region=frozenset(region.keys()),
                        inputs=tuple(inputs), **match)


def _above_padding(facts, var, axis, length, budget=8):
    """What ``var`` is computed from above the zero padding that makes it longer than
    ``length`` on ``axis`` (``F.pad`` then a scale or a layout op): random values there would
    fill rows that are padding in the model, which the final state reads.  ``[var]`` when it
    is not that long, or no padding is found within ``budget`` bindings."""
    if tensor_shape(var)[axis] <= length:
        return [var]
    leaves, stack, seen = [], [var], VarMap()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen[v] = True
        val = facts.value.get(v)
        if op_name(val) == "relax.nn.pad" and isinstance(val.args[0], relax.Var):
            leaves.append(val.args[0])
        elif val is None or len(seen) > budget:
            return [var]
        elif not facts.constant(v):
            stack.extend(facts.reads[v])
    return leaves


class _FinalState:
    """Reads the region's other uses as its final state.  Called with the oracle's final state
    under one assignment: ``[(var, labels)]`` when every use outside the region is that state in
    some layout, or computes it from the region alone (then it joins the region, as the update
    after the last block does in a loop over blocks: the output never reads it); else None."""

    def __init__(self, facts, region, outputs, sources, side, evaluate, external):
        self.facts, self.region, self.outputs = facts, region, outputs
        self.sources, self.side, self.evaluate = sources, side, evaluate
        self.external = external
        self.absorbed = ()

    def __call__(self, last, known):
        facts, found, absorbed = self.facts, [], VarMap()
        pending = sorted(self.external, key=lambda v: facts.order[v])
        seen = VarMap((v, True) for v in pending)
        while pending:
            u = pending.pop(0)
            if tensor_shape(u) is None:           # (a tuple: the state is not read whole)
                return None
            labels = state_layout(u, np.asarray(self.evaluate(u), dtype=np.float64), last, known)
            if labels is not None:
                found.append((u, labels))
                continue
            if not self._computable(u, absorbed):
                return None
            absorbed[u] = True
            for w in facts.users.get(u, []):
                if w == "return":
                    return None               # (a part of the state is returned)
                if w not in seen and not _dead(facts, w):
                    seen[w] = True
                    pending.append(w)
            pending.sort(key=lambda v: facts.order[v])
        self.absorbed = tuple(absorbed.keys())
        return found

    def _computable(self, u, absorbed):
        """``u`` reads only the region (not its outputs), what was absorbed, its operands and
        constants."""
        return all((r in self.region and not any(r.same_as(o) for o in self.outputs))
                   or r in absorbed or r in self.sources or r in self.side
                   or _prepared(self.facts, r, self.sources) or self.facts.constant(r)
                   for r in self.facts.reads[u])


def _zero_tail(x, axis, length):
    """``x`` with its rows from ``length`` on along ``axis`` zero: an input padded before it
    was scaled holds padding there (zero, or a log-decay of 0), which the final state reads."""
    index = [slice(None)] * x.ndim
    index[axis] = slice(length, None)
    x[tuple(index)] = 0.0
    return x


def _prepared(facts, var, sources, budget=8):
    """``var`` is an operand's cumsum or broadcast (``parallel_form.READ_THROUGH``) of the
    sources alone: other uses may read it, as they read the operands."""
    val = facts.value.get(var)
    if budget == 0 or op_name(val) not in READ_THROUGH:
        return False
    return all(r in sources or _prepared(facts, r, sources, budget - 1) for r in facts.reads[var])


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


def _returned_tuple(facts, var):
    """``var`` is the tuple the function returns (an exported model's outputs)."""
    return isinstance(facts.value.get(var), relax.Tuple) and "return" in facts.users.get(var, [])


def _prefix_cut(facts, var, axis):
    """``n`` when the one use of ``var`` is ``var[..., :n, ...]`` along ``axis``, else None."""
    users = facts.users.get(var, [])
    if len(users) != 1 or users[0] == "return":
        return None
    val = facts.value[users[0]]
    span = slice_span(val) if op_name(val) == "relax.strided_slice" else None
    return span[2] if span is not None and span[:2] == (axis, 0) else None


def _pad_of(facts, r, sources):
    """``r`` pads one of the sources (read by an entry)."""
    val = facts.value.get(r)
    while op_name(val) == "relax.nn.pad":
        if val.args[0] in sources:
            return True
        val = facts.value.get(val.args[0])
    return False


def _log_decay(facts, region, blocks, sources):
    """The blocked input the region's cumsums within a block are computed from (the
    log-decay; None when none is), or NotChunked when several are.  (A cumsum over the blocks
    sums their states: no decay.)"""
    cumsums = [v for v in region if op_name(facts.value.get(v)) == "relax.cumsum"
               and (blocks is None or (tensor_shape(v) or (0,))[int(facts.value[v].attrs.axis)] == blocks[1])]
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


# ---------------------------------------------------------------- the driver

def find_chunked(func):
    """``[(exit var, ChunkedMatch | reason)]`` for the blocked regions of ``func``, in binding
    order: every block-merging reshape computed from time-splitting ones through a cumsum, and
    every concat of a loop's blocks (slices), latest first; then each parallel (L, L) form
    (``parallel_form.py``).  An exit inside a region already matched is not looked at again."""
    if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
        return []
    facts = _Facts(func)
    entries, exits = entries_and_exits(facts.bindings, facts.value)
    entries = [e for e in entries if e.span is None or not facts.constant(e.source)]
    by_key, found, covered = {}, [], VarMap()
    for ex in reversed(exits):
        var = ex.var
        mine = [e for e in entries if e.key == ex.key]
        if not mine:
            continue
        if ex.key not in by_key:
            by_key[ex.key] = facts.tainted(mine)
        tainted = by_key[ex.key]
        if var in covered or var not in tainted:
            continue
        _attempt(facts, ex, mine, tainted, found, covered, ("no cumsum over a block in it",) + QUIET)
    views = VarMap((e.var, True) for e in entries)
    in_blocks = None
    for var, axis, length, operands in reversed(parallel_regions(facts, views)):
        if var in covered or any(v in covered for v, _ in operands):
            continue
        mine = [Entry(v, v, a, None) for v, a in operands]
        if in_blocks is None:
            in_blocks = facts.tainted(entries)
        # (a failure reading blocks is quiet: a chunk's inner part, or a later layer's)
        report = not any(v in in_blocks for v, _ in operands)
        _attempt(facts, Exit(var, axis, None, length), mine, facts.tainted(mine), found, covered,
                 QUIET, report)
    return sorted(found, key=lambda p: facts.order[p[0]])


QUIET = ("not blocked tensors", "one blocked tensor", "one step")     # refusals not reported (whole reasons): no scan was in sight


def _attempt(facts, ex, entries, tainted, found, covered, quiet, report=True):
    """``match_region`` at ``ex``: a match (its region then covered) or a reason (unless
    ``quiet`` or not ``report``) appended to ``found``."""
    try:
        match = match_region(facts, ex, entries, tainted)
    except NotChunked as why:
        if report and str(why) not in quiet:
            found.append((ex.var, str(why)))
        return
    for v in match.region:
        covered[v] = True
    found.append((ex.var, match))
