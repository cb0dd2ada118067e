"""One immutable description of a scan, shared by every stage.

``AffineScanSpec``: ``h_t = a_t * h_{t-1} + b_t`` along ``axis`` of ``b``; ``a`` broadcasts
against ``b``; optional initial state ``h0`` (b's shape without the axis); ``reverse`` runs
from the end.  ``MatrixScanSpec``: a matrix state per (batch, head), ``S_t = g_t * S_{t-1} +
k_t v_t^T`` read out as ``o_t = q_t^T S_t`` (gated linear attention, retention, linear
attention, Mamba-2, and with its selective decay Mamba-1).  ``StabilizedScanSpec``: a
first-order recurrence kept in log space, per channel, ``(num, den) <- exp(w) (num, den) +
exp(k_t) (v_t, 1)`` stored max-stabilized (RWKV-4's WKV, logcumsumexp).  ``MLSTMScanSpec``:
xLSTM's mLSTM, a matrix state with exponential gates kept max-stabilized and read out
normalized.  ``SelectiveScanSpec``: Mamba's
selective scan in its own operand names (see ``reference.selective_scan``), an instance of the
matrix spec on the same bytes (``as_matrix``; back by ``MatrixScanSpec.as_selective``).
Inputs may be float32/float16/bfloat16; every realization accumulates in float32 and writes
outputs in the input dtype.  Constructors validate and raise ``ValueError`` naming the operand,
so a bad shape never reaches TVM.

Extents are positive ints or *symbolic*: a non-empty ``str`` naming a size known only at call
time (``"L"``, ``"batch"``, ``"L + 3"``), so one compiled kernel serves every value.  Two
extents are the same value iff their strings are equal.  An affine spec's axis may also be
``None``, the older spelling of a symbolic length; it is the name ``"L"`` (``symbol_name``).
Each distinct name becomes one int64 ``tirx.Var`` named ``symbol_identifiers(spec)[name]``.

One module per spec family in ``scanweaver_core/specs/`` (``affine``, ``matrix`` with the
selective spec, ``stabilized``, ``mlstm``, ``delta``; what they share in ``common``: dtypes,
symbolic extents, checks and ``NamedOperands``, the operand/output views from the buffer
names); this module re-exports every public name.
"""
from .specs.affine import AffineScanSpec
from .specs.common import OUTPUT_KINDS, SUPPORTED_DTYPES, is_symbolic, static_or, symbol_identifiers, symbol_name
from .specs.delta import DELTA_DECAYS, DELTA_RULES, DeltaScanSpec  # noqa: F401 (not in __all__, as before)
from .specs.matrix import DECAYS, LAYOUTS, SELECTIVE_AS_MATRIX, MatrixScanSpec, SelectiveScanSpec
from .specs.mlstm import MLSTMScanSpec
from .specs.stabilized import STABILIZED_DECAYS, StabilizedScanSpec

__all__ = ["SUPPORTED_DTYPES", "OUTPUT_KINDS", "DECAYS", "LAYOUTS", "SELECTIVE_AS_MATRIX",
           "STABILIZED_DECAYS", "AffineScanSpec", "SelectiveScanSpec", "MatrixScanSpec",
           "StabilizedScanSpec", "MLSTMScanSpec", "DeltaScanSpec", "is_symbolic",
           "symbol_name", "symbol_identifiers", "static_or"]
