"""What a form is to the driver (``fuse.FORMS``), and the helpers the forms' finders share.

A ``Form`` is what DLight's ``ApplyDefaultSchedule(*rules)`` takes a rule to be: the driver
tries each in one explicit order, and a form's ``find(mod, cumulative)`` returns None where it
does not apply (no candidate of it in ``mod``), else its recurrences (accepted ones with their
match, near misses with the reason).  The flags say how the driver rewrites a batch of it.

A plan kind (``Plan``; ``EmittedPlan`` for a match that emits itself) is what the rewrite
emits for an accepted recurrence of a form, and where (``plan.PLAN_KINDS``).

A ``ChainReading`` is a way to read an accepted affine chain as a richer scan (selective,
matrix); ``fuse.CHAIN_READINGS`` lists them in the order they are tried.
"""
from typing import Callable, NamedTuple

from tvm import relax

from .chains import Recurrence
from .steps import tensor_dtype

BUILD_ERRORS = (RuntimeError, ValueError, TypeError, KeyError)    # TVM refusing an op a rewrite builds
MATCHER_ERRORS = BUILD_ERRORS + (IndexError,)                      # a matcher meeting a form it did not foresee


class Form(NamedTuple):
    """One form the driver tries (``fuse.FORMS``)."""
    name: str
    find: Callable                    # (mod, cumulative) -> [Recurrence] | None (does not apply)
    unpad: bool = False               # a chunked region: the padding it needed goes after the rewrite
    supersedes_near_misses: bool = False   # near misses inside its scans (or assembled from them) go
    split_readouts: bool = False      # chains: retried with readout einsums split (``einsum_split.py``)


class ChainReading(NamedTuple):
    """A reading of an accepted chain as form ``form``: where ``applies(rec)``,
    ``match(rec, value, users)`` gives a ``match_type`` (then ``rec.form`` is ``form`` and
    ``rec.<form>`` the match) or why not (``rec.<form>_miss``)."""
    form: str
    match: Callable
    match_type: type
    applies: Callable = lambda rec: True


def none_if_empty(found):
    """A finder's list, or None where it found nothing (the form does not apply)."""
    return found or None


def region_recurrences(mod, finder, form, kind, accept):
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


def users_of(func):
    """var -> names of the bindings (or ``"return"``) that use it."""
    users = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users.setdefault(v, []).append(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users.setdefault(v, []).append("return")
    return users


class Plan:
    """One recurrence's emission; ``rec`` is what it reports to."""

    def __init__(self, rec):
        self.rec = rec


class EmittedPlan(Plan):
    """A form whose match emits itself (``emitter(bb, match, visit) -> [(old, new)]``), at
    the binding ``match.<at>``; ``attr`` names the match on the recurrence."""
    attr, at, emitter = None, None, None

    @classmethod
    def place(cls, rec):
        match = getattr(rec, cls.attr)
        return [(getattr(match, cls.at), cls(rec))] if match is not None else None

    def emit(self, rw, binding):
        for old, new in type(self).emitter(rw.builder_, getattr(self.rec, self.attr), rw.visit_expr):
            rw.replace(old, new)
