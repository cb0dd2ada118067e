"""Max-stabilized scans (RWKV-4's WKV) read from an unrolled loop (``stabilized.py``)."""
from ...form import EmittedPlan, Form, none_if_empty
from .stabilized import emit_stabilized, find_stabilized_scans

FORM = Form("stabilized", lambda mod, cumulative: none_if_empty(find_stabilized_scans(mod)),
            supersedes_near_misses=True)


class StabilizedPlan(EmittedPlan):
    """A max-stabilized scan (``stabilized.py``), at the stacked output it replaces."""
    attr, at, emitter = "stabilized", "emit_at", staticmethod(emit_stabilized)
