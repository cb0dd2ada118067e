"""FuseAffineRecurrences: replace each affine recurrence with one ScanWeaver scan (the driver).

Put it first in a ``relax.transform`` pipeline, right after import (``sw.passes`` and ``sw.pipeline`` do).
``fuse`` tries the forms of ``FORMS`` (``relax_pass/forms/``, one subpackage per form) in that
one order, as DLight's ``ApplyDefaultSchedule(*rules)`` tries its rules: each form's ``find``
returns None where it does not apply, else its recurrences, which are rewritten (``rewrite.py``,
emitting each recurrence's plan: ``plan.py``) and validated (``validate.py``) before the next
form looks at the module.  The order: xLSTM's chunkwise mLSTM and the chunked delta rule, then
chunked and parallel regions (their chunk loops are no chains), unrolled chains (each read as
a selective, matrix or plain affine scan: ``CHAIN_READINGS``; readout einsums split where that
shows a matrix state), max-stabilized scans, xLSTM's mLSTM loops, delta rules, and last the
whole-sequence matrix forms.  A recurrence that fails validation is left exactly as it was,
and ``analyze`` says why.
"""
import tvm
from tvm import relax

from scanweaver_core.exprs import error_line
from scanweaver_core.scan_op import parse_scan
from scanweaver_core.spec import SUPPORTED_DTYPES

from .chains import find_chains
from .form import BUILD_ERRORS as _BUILD_ERRORS
from .form import MATCHER_ERRORS as _MATCHER_ERRORS
from .form import Form, none_if_empty
from .form import users_of as _users
from .forms import chunked, delta, matrix, mlstm, selective, stabilized
from .forms.affine.cumulative import cumulative_recurrences
from .forms.chunked import find_chunked_scans                  # noqa: F401 (public names)
from .forms.delta import find_chunked_delta_scans              # noqa: F401
from .forms.matrix import find_lifted_scans                    # noqa: F401
from .forms.matrix.einsum_split import readout_splits, split_einsums
from .forms.mlstm import find_chunked_mlstm_scans              # noqa: F401
from .interpret import cached_constants
from .prune import prune_dead_bindings
from .rewrite import rewrite
from .unpad import unpad
from .validate import validate

# how an accepted chain is read, in this order (else it is a plain affine scan)
CHAIN_READINGS = (selective.READING, matrix.READING)


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
                    _read_chain(rec, value, users)
                found.append(rec)
    return found


def _read_chain(rec, value, users):
    """The first reading of ``CHAIN_READINGS`` that applies to ``rec`` and matches makes it
    that form; each that applies and does not match leaves its reason (``rec.<form>_miss``)."""
    for reading in CHAIN_READINGS:
        if not reading.applies(rec):
            continue
        match = reading.match(rec, value, users)
        if isinstance(match, reading.match_type):
            rec.form = reading.form
            setattr(rec, reading.form, match)
            return
        setattr(rec, f"{reading.form}_miss", match)


# the forms, in the one order the driver tries them
FORMS = (
    mlstm.CHUNKED,          # xLSTM's chunkwise mLSTM   } their chunk loops are no RWKV loop,
    delta.CHUNKED,          # the chunked (UT) delta rule }  no plain matrix scan
    chunked.FORM,           # chunked and parallel matrix regions: their chunk loops are not chains
    Form("chains", lambda mod, cumulative: none_if_empty(find(mod, cumulative)), split_readouts=True),
    stabilized.FORM,        # RWKV's WKV
    mlstm.LOOP,             # xLSTM's mLSTM
    delta.LOOP,             # delta rules
    matrix.LIFTED,          # whole-sequence matrix scans (ONNX Scan bodies, torch's scan op)
)


def fuse(mod, cumulative=False):
    """``(new module, recurrences)``: every form of ``FORMS`` in turn found, rewritten and
    validated (``validate.py``); a recurrence that fails validation is marked rejected with
    the reason and left exactly as it was."""
    with cached_constants():      # every validation reads the same weights: convert them once
        recurrences = []
        for form in FORMS:
            found = form.find(mod, cumulative)
            if found is None:     # the form does not apply
                continue
            before = mod
            if form.split_readouts:
                mod, found = _fuse_split_readouts(mod, found, form, cumulative) or _fuse(mod, found)
            elif any(not r.rejected for r in found):
                mod, found = _fuse(mod, found)
                if form.unpad:    # the padding the region needed goes too (its output re-padded, then sliced)
                    mod = unpad(mod, prune_dead_bindings)
                if form.supersedes_near_misses:
                    covered = {n for r in found if not r.rejected for n in r.bindings}
                    recurrences = [r for r in recurrences    # (its max chain's near miss is now a scan)
                                   if not (r.rejected and r.bindings and (set(r.bindings) <= covered or
                                           _assembled_from(before, r, covered)))]
            recurrences = recurrences + found
        return mod, recurrences


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


def _fuse_split_readouts(mod, found, form, cumulative):
    """``_fuse`` on ``mod`` with its readout einsums split (``einsum_split.py``), when that
    makes more matrix scans and every split readout is replaced by one; else None (``mod`` is
    fused as it is)."""
    splits = readout_splits(found)
    if not splits:
        return None
    split, inner = split_einsums(mod, splits)
    again = form.find(split, cumulative) or []
    if sum(r.form == "matrix" for r in again) <= sum(r.form == "matrix" for r in found):
        return None
    new, recurrences = _fuse(split, again)
    bound = {b.var for gvar, func in new.functions_items() if isinstance(func, relax.Function)
             and isinstance(func.body, relax.SeqExpr) for blk in func.body.blocks for b in blk.bindings}
    if any(v in bound for v in inner):
        return None                      # a split readout is left: keep the einsum as it was
    return new, recurrences


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


@tvm.transform.module_pass(opt_level=0, name="scanweaver.FuseAffineRecurrences")
class FuseAffineRecurrences:
    """Replace each affine recurrence found in the module's Relax functions by one scan;
    ``cumulative=True`` also turns ``cumsum``/``cumprod`` into scans."""

    def __init__(self, cumulative=False):
        self.cumulative = cumulative

    def transform_module(self, mod, _ctx):
        return fuse(mod, self.cumulative)[0]
