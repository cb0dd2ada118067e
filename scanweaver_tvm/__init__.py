"""ScanWeaver-TVM: first-order affine recurrences as parallel scans in TVM.

The front door.  The specs (``AffineScanSpec``, ``SelectiveScanSpec``, ``MatrixScanSpec``,
``StabilizedScanSpec``, ``MLSTMScanSpec``, ``DeltaScanSpec``) describe a scan once for every
stage; ``reference`` holds their float64 oracles; ``algebra`` the affine-pair composition (all
three defined in ``scanweaver_core``, the vocabulary every layer shares).  The model-level API
(``from_torch``, ``from_onnx``, ``find_recurrences``, ``FuseAffineRecurrences``, ``compile``,
``pipeline``: the Relax pipeline ``compile`` runs, for ``tvm.compile``; ``passes``: our two
alone) lives in ``api`` and is loaded on first use; ``compile_causal_lm`` (prefill, decode and
``generate`` of a transformers causal LM) in ``causal_lm``.
"""
from scanweaver_core import algebra, reference
from scanweaver_core.spec import (AffineScanSpec, DeltaScanSpec, MatrixScanSpec, MLSTMScanSpec, SelectiveScanSpec,
                                  StabilizedScanSpec)

_API = ("from_torch", "from_onnx", "find_recurrences", "FuseAffineRecurrences", "LowerScans",
        "passes", "pipeline", "compile")
__all__ = ["AffineScanSpec", "SelectiveScanSpec", "MatrixScanSpec", "StabilizedScanSpec", "MLSTMScanSpec",
           "DeltaScanSpec", "algebra", "reference", *_API, "tune", "compile_causal_lm"]


def _use_every_core():
    """TVM's CPU thread pool defaults to half the hardware threads on x86 (it assumes two per
    core), so on a machine with one thread per core compiled models run on half the cores.
    Unless the user chose (``TVM_NUM_THREADS``), use one thread per physical core; this must
    be set before TVM runs its first parallel kernel."""
    import os

    from scanweaver_core.targets import physical_cores

    os.environ.setdefault("TVM_NUM_THREADS", str(physical_cores()))


_use_every_core()


def _register_pipeline():
    """``tvm.compile(mod, target, relax_pipeline="scanweaver")`` right after ``import
    scanweaver_tvm``: ``api.pipeline`` (what ``compile`` runs) for the target of the surrounding
    ``with target:`` that ``tvm.compile`` sets up; the passes are imported when it runs."""
    import tvm
    from tvm import relax

    @relax.register_pipeline("scanweaver")
    def _scanweaver(realization="tir", database=None, weights=None):
        from . import api

        @tvm.transform.module_pass(opt_level=0, name="scanweaver.registered")
        def _apply(mod, _ctx):
            return api.pipeline(tvm.target.Target.current(), realization, database, weights)(mod)

        return _apply


_register_pipeline()


def __getattr__(name):
    if name in _API:
        from . import api
        return getattr(api, name)
    if name == "tune":  # MetaSchedule search over the realizations (tuning.py)
        from .tuning import tune
        return tune
    if name == "compile_causal_lm":
        from .causal_lm import compile_causal_lm
        return compile_causal_lm
    raise AttributeError(f"module 'scanweaver_tvm' has no attribute {name!r}")
