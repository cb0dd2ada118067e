"""What the rewrite emits for each accepted recurrence, and where: one plan kind per form.

``plans_for(rec)`` tries the kinds of ``PLAN_KINDS`` in that order (a kind's ``place``
returns None when it does not apply, as DLight's rules do); a placed plan is
``[(binding var, plan)]``: the rewriter calls ``plan.emit(rw, binding)`` when it reaches that
binding, and the plan replaces what the rest of the graph read through ``rw.replace``.  Each
kind lives with its form (``relax_pass/forms/<form>/``); the base classes are ``form.Plan`` and
``form.EmittedPlan``.
"""
from .forms.affine.plan import AffinePlan, CumulativePlan
from .forms.chunked import ChunkedPlan
from .forms.delta import ChunkedDeltaPlan, DeltaPlan
from .forms.matrix.plan import LiftedPlan, MatrixPlan
from .forms.mlstm import ChunkedMLSTMPlan, MLSTMPlan
from .forms.selective.plan import SelectivePlan
from .forms.stabilized import StabilizedPlan


def plans_for(rec):
    """``[(binding var, plan)]`` for an accepted ``rec`` (empty: nothing reads its states)."""
    for kind in PLAN_KINDS:
        placed = kind.place(rec)
        if placed is not None:
            return placed
    raise AssertionError(f"no plan kind for {rec}")     # (AffinePlan takes every chain)


PLAN_KINDS = (LiftedPlan, StabilizedPlan, MLSTMPlan, DeltaPlan, ChunkedDeltaPlan, ChunkedMLSTMPlan, ChunkedPlan, MatrixPlan, SelectivePlan,
              CumulativePlan, AffinePlan)
