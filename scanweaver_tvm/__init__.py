"""ScanWeaver-TVM: first-order affine recurrences as parallel scans in TVM.

The front door.  ``AffineScanSpec`` / ``SelectiveScanSpec`` describe a scan once for every
stage; ``reference`` holds their float64 oracles; ``algebra`` the affine-pair composition.
The model-level API (``from_torch``, ``from_onnx``, ``find_recurrences``,
``FuseAffineRecurrences``, ``compile``, ``pipeline``) lives in ``api`` and is loaded on first
use, because the lower layers import the spec from this package.
"""
from . import algebra, reference
from .spec import AffineScanSpec, SelectiveScanSpec

_API = ("from_torch", "from_onnx", "find_recurrences", "FuseAffineRecurrences", "LowerScans",
        "pipeline", "compile")
__all__ = ["AffineScanSpec", "SelectiveScanSpec", "algebra", "reference", *_API, "tune"]


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    if name == "tune":  # MetaSchedule search over the realizations (tuning.py)
        from .tuning import tune
        return tune
    raise AttributeError(f"module 'scanweaver_tvm' has no attribute {name!r}")
