"""FuseAffineRecurrences: replace each affine recurrence with one ScanWeaver scan (the driver).

Put it first in a ``relax.transform`` pipeline, right after import (``sw.passes`` and ``sw.pipeline`` do).
``fuse`` runs the finders in one order: xLSTM's chunkwise mLSTM (``mlstm_chunked.py``), chunked
and parallel regions (``chunked.py``), then
unrolled chains (``chains.find_chains``, each read as a selective, matrix or plain affine scan;
readout einsums split where that shows a matrix state: ``einsum_split.py``), max-stabilized
scans (``stabilized.py``, then xLSTM's mLSTM: ``mlstm.py``), delta rules (``delta.py``) and whole-sequence forms (``matrix_lifted.py``).  Each batch is
rewritten (``rewrite.py``, emitting each recurrence's plan: ``plan.py``) and validated
(``validate.py``); a recurrence that fails is left exactly as it was, and
``find_recurrences`` says why.
"""
import tvm
from tvm import relax

from scanweaver_core.exprs import error_line
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from .chains import Recurrence, find_chains
from .forms.chunked.chunked import find_chunked
from .forms.affine.cumulative import cumulative_recurrences
from .forms.delta.delta import find_delta_scans
from .forms.delta.delta_chunked import find_chunked_delta
from .forms.matrix.einsum_split import readout_splits, split_einsums
from .interpret import cached_constants
from .forms.matrix.matrix import MatrixMatch, match_matrix
from .forms.matrix.matrix_lifted import LiftedMatch, find_lifted
from .forms.mlstm.mlstm import find_mlstm_scans
from .forms.mlstm.mlstm_chunked import find_chunked_mlstm
from .rewrite import rewrite
from .forms.selective.selective import SelectiveMatch, match_selective
from .forms.stabilized.stabilized import find_stabilized_scans
from .steps import tensor_dtype
from .unpad import unpad
from .prune import prune_dead_bindings
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


_BUILD_ERRORS = (RuntimeError, ValueError, TypeError, KeyError)    # TVM refusing an op a rewrite builds
_MATCHER_ERRORS = _BUILD_ERRORS + (IndexError,)                      # a matcher meeting a form it did not foresee


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
        first = []
        for finder in (find_chunked_mlstm_scans, find_chunked_delta_scans):   # (their chunk loops
            found = finder(mod)                       # are no RWKV loop, no plain matrix scan)
            if any(not r.rejected for r in found):
                mod, found = _fuse(mod, found)
                mod = unpad(mod, prune_dead_bindings)   # (its output re-padded, then sliced)
            first += found
        chunked = find_chunked_scans(mod)
        if any(not r.rejected for r in chunked):   # first: their chunk loops are not chains
            mod, chunked = _fuse(mod, chunked)
            mod = unpad(mod, prune_dead_bindings)   # the padding the region needed goes too
        chunked = first + chunked
        found = find(mod, cumulative)
        new, recurrences = _fuse_split_readouts(mod, found, cumulative) or _fuse(mod, found)
        recurrences = chunked + recurrences
        for finder in (find_stabilized_scans, find_mlstm_scans, find_delta_scans):   # RWKV's WKV, xLSTM's mLSTM, delta rules
            stabilized = finder(new)
            if any(not r.rejected for r in stabilized):
                before = new
                new, stabilized = _fuse(new, stabilized)
                covered = {n for r in stabilized if not r.rejected for n in r.bindings}
                recurrences = [r for r in recurrences    # (its max chain's near miss is now a scan)
                               if not (r.rejected and r.bindings and (set(r.bindings) <= covered or
                                       _assembled_from(before, r, covered)))]
            recurrences = recurrences + stabilized
        lifted = find_lifted_scans(new)
        if not lifted:
            return new, recurrences
        new, lifted = _fuse(new, lifted)
        return new, recurrences + lifted


_ASSEMBLY_OPS = {"relax.concat", "relax.reshape", "relax.permute_dims", "relax.squeeze",
                 "relax.expand_dims", "relax.strided_slice"}


def _assembled_from(mod, rec, covered):
    """Whether the near miss ``rec`` of a chunked region ends in a tensor only put together
    (concats, reshapes, transposes) from bindings in ``covered`` and scans fused before: a
    block loop whose blocks are all scans (xLSTM's whole chunks, then its last steps) was no
    missed scan."""
    if not (rec.chunked is None and rec.chunked_mlstm is None and rec.chunked_delta is None
            and len(rec.bindings) == 1
            and rec.function in [g.name_hint for g in mod.get_global_vars()]):
        return False
    values = {b.var.name: b.value for blk in mod[rec.function].body.blocks for b in blk.bindings}
    todo, seen = [rec.bindings[0]], set()
    while todo:
        name = todo.pop()
        if name in covered or name in seen:
            continue
        seen.add(name)
        value = values.get(name)
        if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
            todo.append(value.tuple_value.name)
            continue
        if isinstance(value, relax.Call) and parse_scan(value) is not None:   # a scan fused earlier
            continue
        if not (isinstance(value, relax.Call) and getattr(value.op, "name", None) in _ASSEMBLY_OPS):
            return False
        for arg in value.args:
            fields = arg.fields if isinstance(arg, relax.Tuple) else [arg]
            todo += [f.name for f in fields if isinstance(f, relax.Var)]
    return bool(seen)


def _region_recurrences(mod, finder, form, kind, accept):
    """``finder(func)``'s ``[(var, match | reason)]`` of every function as recurrences of
    ``form``: ``accept(match)`` gives an accepted one's ``(length, axis, reverse, state
    shape, fields)``; a reason is a near miss ("... is not <kind>: reason")."""
    found = []
    for gvar, func in mod.functions_items():
        for var, match in finder(func):
            if isinstance(match, str):
                found.append(Recurrence(gvar.name_hint, form, 0, 0, False, (), tensor_dtype(var),
                                        (var.name,), rejected=True,
                                        reason=f"a chunked region ending at {var.name} is not {kind}: {match}"))
                continue
            length, axis, reverse, state_shape, fields = accept(match)
            names = tuple(sorted((v.name for v in match.region), key=lambda n: (len(n), n)))
            found.append(Recurrence(gvar.name_hint, form, length, axis, reverse, state_shape,
                                    match.spec.dtype, names, **fields))
    return found


def find_chunked_scans(mod):
    """Matrix-state scans in chunked form (``chunked.py``: Mamba-2's SSD, chunk-wise linear
    attention), as recurrences of form ``"matrix"`` carrying their match; a region that looks
    chunked but is not one is a near miss with the reason."""
    def accept(m):
        return (m.spec.length, m.out_labels.index("L"), m.spec.reverse, m.spec.state_shape,
                {"chunked": m})
    return _region_recurrences(mod, find_chunked, "matrix", "a matrix scan", accept)


def find_chunked_mlstm_scans(mod):
    """xLSTM's mLSTM in chunkwise form (``mlstm_chunked.py``) as recurrences of form
    ``"mlstm"`` carrying their match; a region with its signature that is not one is a near
    miss with the reason."""
    def accept(m):
        return m.spec.length, 2, False, tuple(m.spec.state_shapes()["C"]), {"chunked_mlstm": m}
    return _region_recurrences(mod, find_chunked_mlstm, "mlstm", "a chunkwise mLSTM", accept)


def find_chunked_delta_scans(mod):
    """The gated delta rule in chunked (UT) form (``delta_chunked.py``) as recurrences of form
    ``"delta"`` carrying their match; a five-tensor region that is not one is a near miss."""
    def accept(m):
        return m.spec.length, 2, False, (m.spec.batch, m.spec.heads, m.spec.key, m.spec.value), \
            {"chunked_delta": m}
    return _region_recurrences(mod, find_chunked_delta, "delta", "a chunked delta rule", accept)


def _fuse_split_readouts(mod, found, cumulative):
    """``_fuse`` on ``mod`` with its readout einsums split (``einsum_split.py``), when that
    makes more matrix scans and every split readout is replaced by one; else None (``mod`` is
    fused as it is)."""
    splits = readout_splits(found)
    if not splits:
        return None
    split, inner = split_einsums(mod, splits)
    again = find(split, cumulative)
    if sum(r.form == "matrix" for r in again) <= sum(r.form == "matrix" for r in found):
        return None
    new, recurrences = _fuse(split, again)
    bound = {b.var for gvar, func in new.functions_items() if isinstance(func, relax.Function)
             and isinstance(func.body, relax.SeqExpr) for blk in func.body.blocks for b in blk.bindings}
    if any(v in bound for v in inner):
        return None                      # a split readout is left: keep the einsum as it was
    return new, recurrences


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
        except _BUILD_ERRORS as err:
            _reject_unbuildable(mod, recurrences, err)
            continue
        failed = False
        for rec in recurrences:       # (one validated before a retry is the same rewrite)
            if rec.rejected or rec.validation_s is not None or id(rec) not in replaced:
                continue
            try:
                region = rec.chunked or rec.chunked_mlstm or rec.chunked_delta     # local to its region
                given = region.inputs if region is not None else ()
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
        except _BUILD_ERRORS as own:
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


@tvm.transform.module_pass(opt_level=0, name="scanweaver.FuseAffineRecurrences")
class FuseAffineRecurrences:
    """Replace each affine recurrence found in the module's Relax functions by one scan;
    ``cumulative=True`` also turns ``cumsum``/``cumprod`` into scans."""

    def __init__(self, cumulative=False):
        self.cumulative = cumulative

    def transform_module(self, mod, _ctx):
        return fuse(mod, self.cumulative)[0]
