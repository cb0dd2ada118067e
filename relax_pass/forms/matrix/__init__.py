"""Matrix-state scans ``S_t = decay_t * S_{t-1} + k_t v_t^T``: per step on a chain
(``matrix.py``, its input and decay read as factors by ``factors.py``, the readout stacks by
``stacks.py``), in whole-sequence form
(``matrix_lifted.py``), readout einsums split to show a matrix state (``einsum_split.py``),
and the scan's layout and emission (``matrix_layout.py``)."""
from tvm import relax

from scanweaver_core.exprs import error_line

from ...chains import Recurrence
from ...form import MATCHER_ERRORS, ChainReading, Form, none_if_empty, users_of
from .matrix import MatrixMatch, match_matrix
from .matrix_lifted import LiftedMatch, find_lifted


def read_matrix(rec, value, users):
    """``match_matrix``, or why not; a form the matcher did not foresee is a reason too (the
    chain stays affine)."""
    try:
        return match_matrix(rec, value, users)
    except MATCHER_ERRORS as err:
        return f"the matrix matcher could not read it: {error_line(err)}"


READING = ChainReading("matrix", read_matrix, MatrixMatch, applies=lambda rec: len(rec.state_shape) >= 2)


def find_lifted_scans(mod):
    """Matrix-state scans in whole-sequence form (``matrix_lifted.py``: ONNX ``Scan`` bodies,
    the torch ``scan`` op, chains the per-step matcher did not read), as recurrences of form
    ``"matrix"`` carrying their match (affine scans that are not one stay as they are)."""
    found = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for var, match in find_lifted(func, users_of(func), MATCHER_ERRORS):
            if isinstance(match, LiftedMatch):
                spec = match.spec
                found.append(Recurrence(gvar.name_hint, "matrix", spec.length, 2, spec.reverse,
                                        spec.state_shape, spec.dtype, (var.name,), lifted=match))
    return found


LIFTED = Form("matrix-lifted", lambda mod, cumulative: none_if_empty(find_lifted_scans(mod)))
