"""Chunked and parallel regions of a matrix-state scan (Mamba-2's SSD, chunk-wise linear
attention, the (L, L) parallel form): found by what they compute (``chunked.py``, operand roles
in ``chunked_roles.py``, the parallel form in ``parallel_form.py``), emitted by ``chunked_emit.py``."""
from ...form import EmittedPlan, Form, none_if_empty, region_recurrences
from .chunked import find_chunked
from .chunked_emit import emit_chunked


def find_chunked_scans(mod):
    """Matrix-state scans in chunked form (``chunked.py``: Mamba-2's SSD, chunk-wise linear
    attention), as recurrences of form ``"matrix"`` carrying their match; a region that looks
    chunked but is not one is a near miss with the reason."""
    def accept(m):
        return (m.spec.length, m.out_labels.index("L"), m.spec.reverse, m.spec.state_shape,
                {"chunked": m})
    return region_recurrences(mod, find_chunked, "matrix", "a matrix scan", accept)


FORM = Form("chunked", lambda mod, cumulative: none_if_empty(find_chunked_scans(mod)), unpad=True)


class ChunkedPlan(EmittedPlan):
    """A chunked or parallel region (``chunked.py``), at the first of its outputs."""
    attr, at, emitter = "chunked", "emit_at", staticmethod(emit_chunked)
