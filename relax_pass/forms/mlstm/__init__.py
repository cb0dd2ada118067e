"""xLSTM's mLSTM: an unrolled loop (``mlstm.py``) and the chunkwise form (``mlstm_chunked.py``)."""
from ...form import EmittedPlan, Form, none_if_empty, region_recurrences
from .mlstm import emit_mlstm, find_mlstm_scans
from .mlstm_chunked import emit_chunked_mlstm, find_chunked_mlstm


def find_chunked_mlstm_scans(mod):
    """xLSTM's mLSTM in chunkwise form (``mlstm_chunked.py``) as recurrences of form
    ``"mlstm"`` carrying their match; a region with its signature that is not one is a near
    miss with the reason."""
    def accept(m):
        return m.spec.length, 2, False, tuple(m.spec.state_shapes()["C"]), {"chunked_mlstm": m}
    return region_recurrences(mod, find_chunked_mlstm, "mlstm", "a chunkwise mLSTM", accept)


CHUNKED = Form("mlstm-chunked", lambda mod, cumulative: none_if_empty(find_chunked_mlstm_scans(mod)),
               unpad=True)
LOOP = Form("mlstm", lambda mod, cumulative: none_if_empty(find_mlstm_scans(mod)),
            supersedes_near_misses=True)


class MLSTMPlan(EmittedPlan):
    """An mLSTM scan (``mlstm.py``), at the stacked output it replaces."""
    attr, at, emitter = "mlstm", "emit_at", staticmethod(emit_mlstm)


class ChunkedMLSTMPlan(EmittedPlan):
    """A chunkwise mLSTM region (``mlstm_chunked.py``), at the first of its outputs."""
    attr, at, emitter = "chunked_mlstm", "emit_at", staticmethod(emit_chunked_mlstm)
