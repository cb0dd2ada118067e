"""Delta rules: an unrolled loop (``delta.py``) and the chunked UT form (``delta_chunked.py``)."""
from ...form import EmittedPlan, Form, none_if_empty, region_recurrences
from .delta import emit_delta, find_delta_scans
from .delta_chunked import emit_chunked_delta, find_chunked_delta


def find_chunked_delta_scans(mod):
    """The gated delta rule in chunked (UT) form (``delta_chunked.py``) as recurrences of form
    ``"delta"`` carrying their match; a five-tensor region that is not one is a near miss."""
    def accept(m):
        return m.spec.length, 2, False, (m.spec.batch, m.spec.heads, m.spec.key, m.spec.value), \
            {"chunked_delta": m}
    return region_recurrences(mod, find_chunked_delta, "delta", "a chunked delta rule", accept)


CHUNKED = Form("delta-chunked", lambda mod, cumulative: none_if_empty(find_chunked_delta_scans(mod)),
               unpad=True)
LOOP = Form("delta", lambda mod, cumulative: none_if_empty(find_delta_scans(mod)),
            supersedes_near_misses=True)


class DeltaPlan(EmittedPlan):
    """A delta-rule scan (``delta.py``), at the stacked output it replaces."""
    attr, at, emitter = "delta", "emit_at", staticmethod(emit_delta)


class ChunkedDeltaPlan(EmittedPlan):
    """A chunked (UT-form) delta rule (``delta_chunked.py``), at the first of its outputs."""
    attr, at, emitter = "chunked_delta", "emit_at", staticmethod(emit_chunked_delta)
