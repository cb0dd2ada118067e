"""The matrix forms' plan kinds: a per-step matrix chain (with its epilogue) and a
whole-sequence scan."""
from tvm import relax

from ...form import EmittedPlan, Plan
from ...lift import Lifter
from ...steps import tensor_dtype, tensor_shape
from .matrix_layout import (canonical, emit_matrix_scan, epilogue_stack, readouts_from_scan,
                            scan_to_stack, state_from_scan)
from .matrix_lifted import emit_lifted


class LiftedPlan(EmittedPlan):
    """A whole-sequence scan (``matrix_lifted.py``), at the scan it replaces."""
    attr, at, emitter = "lifted", "scan", staticmethod(emit_lifted)


class MatrixPlan(Plan):
    """A matrix-state chain (``matrix.py``), at its first step like an affine chain; with an
    epilogue per piece, that is emitted where the pieces are stacked (``EpiloguePlan``)."""

    @classmethod
    def place(cls, rec):
        if rec.matrix is None:
            return None
        placed = [(rec.bindings_vars()[0], cls(rec))]
        if rec.matrix.epilogue is not None:
            placed.append((rec.matrix.output, EpiloguePlan(rec)))
        return placed

    def emit(self, rw, binding):
        rec, bb = self.rec, rw.builder_
        match = rec.matrix
        spec = match.spec
        lifter = Lifter(rec.analysis, (min(rec.indices), rec.length), bb.emit, rw.visit_expr)
        factors = {"q": match.q, "k": match.k, "v": match.v, "decay": match.decay}
        h0 = rw.visit_expr(rec.initial) if spec.has_h0 else None
        scan, out = emit_matrix_scan(
            bb, spec, match.roles, match.roles, factors, h0,
            lambda f, inner: canonical(bb, *lifter.lift(f.expr), f.labels, match.roles, inner))
        if match.epilogue is not None:         # pieces E(readout_t, x_t): lifted where stacked
            rw.pending[id(rec)] = (lifter, out)
        elif match.output is not None:
            rw.replace(match.output, scan_to_stack(bb, out, match.roles, match.out_labels,
                                                   tensor_shape(match.output), tensor_dtype(match.output)))
        else:                                   # pieces compute more from each readout
            first = min(rec.indices)
            positions = [t - first for _, t in match.readout_vars]
            for (r, _), value in zip(match.readout_vars, readouts_from_scan(bb, out, match, positions)):
                rw.replace(r, value)
        if spec.return_last_state:
            last = state_from_scan(bb, bb.emit(relax.TupleGetItem(scan, 1)), match.roles, rec.state_shape)
            rw.replace(rec.states[-1], last)


class EpiloguePlan(Plan):
    """Where a matrix scan's lifted epilogue replaces the stacked pieces: E(readout_t, x_t)
    lifted at the stack, where all it reads is bound (an invariant such as ``D[:, None]`` may
    be bound inside the first step, after the scan)."""

    def emit(self, rw, binding):
        lifter, out = rw.pending.pop(id(self.rec))
        rw.replace(binding.var, epilogue_stack(rw.builder_, lifter, out, self.rec.matrix))
