"""Building the CPU route's LLVM IR into a shared library and calling it with ctypes."""
import ctypes
import os
import subprocess
import tempfile

import numpy as np

from .operands import mlir_spec, operands
from .tools import MlirError, llc_object

_LIBS = {}


def build_shared_library(artifact, path):
    """llc -O3 -relocation-model=pic -filetype=obj, then cc -shared; returns ``path``.  The
    object file lives in a temporary folder removed when done."""
    with tempfile.TemporaryDirectory(prefix="scanweaver_mlir_") as tmp:
        obj = os.path.join(tmp, "scan.o")
        llc_object(artifact.llvm_ir, obj)
        proc = subprocess.run(["cc", "-shared", obj, "-o", path, "-lm"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise MlirError(f"cc -shared failed:\n{proc.stderr}")
    return path


def _entry(spec):
    from . import cpu_llvm_ir
    art = cpu_llvm_ir(spec)
    if art.entry not in _LIBS:
        with tempfile.TemporaryDirectory(prefix="scanweaver_mlir_") as tmp:  # loaded, then removed
            lib = ctypes.CDLL(build_shared_library(art, os.path.join(tmp, "scan.so")))
        fn = getattr(lib, art.entry)
        fn.restype = ctypes.c_int32
        _LIBS[art.entry] = (lib, fn, art)
    return _LIBS[art.entry]


def run_cpu(spec, *arrays):
    """Call the entry on numpy inputs (kernel order; trailing optional ones may be omitted or
    ``None``); outputs are allocated NaN-poisoned in the spec's dtype and returned in order."""
    import ml_dtypes
    np_dtypes = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    spec = mlir_spec(spec)
    ops = operands(spec)
    inputs = [o for o in ops if not o[3]]
    given = [a for a in arrays if a is not None]
    if len(given) != len(inputs):
        raise ValueError(f"run_cpu: expected {len(inputs)} inputs ({', '.join(o[0] for o in inputs)}), "
                         f"got {len(given)}")
    length = None
    for (name, shape, dtype, _), arr in zip(inputs, given):
        want_dt = np_dtypes[dtype]
        if arr.dtype != want_dt:
            raise ValueError(f"{name}: dtype {arr.dtype} is not {dtype}")
        for d, n in zip(shape, arr.shape):
            if d is None:
                length = n if length is None else length
        actual = tuple(length if d is None else d for d in shape)
        if tuple(arr.shape) != actual:
            raise ValueError(f"{name}: shape {arr.shape} is not {actual}")
    buffers = [np.ascontiguousarray(a) for a in given]
    outs = [np.full(tuple(length if d is None else d for d in shape), np.nan, dtype=np_dtypes[dt])
            for _, shape, dt, is_out in ops if is_out]
    _, fn, art = _entry(spec)
    args = [ctypes.c_void_p(b.ctypes.data) for b in buffers + outs]
    if art.symbolic:
        args.append(ctypes.c_int64(length))
    rc = fn(*args)
    if rc != 0:
        raise RuntimeError(f"{art.entry} returned {rc}")
    return outs
