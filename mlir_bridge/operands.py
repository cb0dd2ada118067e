"""Operand lists of a spec in the kernel argument order of tir_schedules/README.md.

Each operand is (name, shape, dtype); a ``None`` extent is the symbolic length L.  Shared by
every stage, the kernels, the launch descriptions and the ctypes caller, so the order is
written once.
"""
import dataclasses

from scanweaver_core.spec import AffineScanSpec, MatrixScanSpec, SelectiveScanSpec, is_symbolic


def mlir_spec(spec):
    """The spec as the MLIR route takes it: an affine scan's symbolic L (a name or None) is
    None, its one scalar argument.  Any other symbolic extent raises ``ValueError`` here, at
    the entry, before any MLIR tool runs."""
    def unsupported(field):
        return ValueError(f"mlir realization: symbolic {field} is not supported yet; "
                          "use realization='tir'")

    if isinstance(spec, MatrixScanSpec):
        raise ValueError("mlir realization: matrix-state scans (MatrixScanSpec: gated linear "
                         "attention, retention, linear attention, Mamba-2) are not there yet, "
                         "except in Mamba-1's form (MatrixScanSpec.as_selective), which takes "
                         "the selective kernel; use realization='tir'")
    if isinstance(spec, SelectiveScanSpec):
        for field in ("batch", "length"):
            if is_symbolic(getattr(spec, field)):
                raise unsupported(f"{field} ({getattr(spec, field)!r}) of a selective scan")
        return spec
    if not isinstance(spec, AffineScanSpec):
        return spec
    for i, d in enumerate(spec.shape):
        if i != spec.axis and is_symbolic(d):
            raise unsupported(f"dimension {i} ({d!r}, not the scan axis)")
    if isinstance(spec.length, str):
        ax = spec.axis
        shape = spec.shape[:ax] + (None,) + spec.shape[ax + 1:]
        a_shape = spec.a_shape[:ax] + ((None,) if spec.a_shape[ax] != 1 else (1,)) + spec.a_shape[ax + 1:]
        return dataclasses.replace(spec, shape=shape, a_shape=a_shape)
    return spec


def operands(spec):
    """[(name, shape, dtype, is_output)] in kernel order."""
    if isinstance(spec, AffineScanSpec):
        dt = spec.dtype
        ops = [("a", spec.a_shape, dt, False), ("b", spec.shape, dt, False)]
        if spec.has_h0:
            ops.append(("h0", spec.state_shape, dt, False))
        if "states" in spec.outputs:
            ops.append(("states", spec.shape, dt, True))
        if "last" in spec.outputs:
            ops.append(("last", spec.state_shape, dt, True))
        return ops
    if isinstance(spec, SelectiveScanSpec):
        b, d, l, n, dt = spec.batch, spec.dim, spec.length, spec.dstate, spec.dtype
        ops = [("u", (b, d, l), dt), ("delta", (b, d, l), dt), ("A", (d, n), "float32"),
               ("B", spec.bc_shape, dt), ("C", spec.bc_shape, dt)]
        if spec.has_D:
            ops.append(("D", (d,), "float32"))
        if spec.has_z:
            ops.append(("z", (b, d, l), dt))
        if spec.has_delta_bias:
            ops.append(("delta_bias", (d,), "float32"))
        if spec.has_h0:
            ops.append(("h0", (b, d, n), dt))
        ops = [(*o, False) for o in ops] + [("out", (b, d, l), dt, True)]
        if spec.return_last_state:
            ops.append(("last_state", (b, d, n), dt, True))
        return ops
    raise TypeError(f"spec: expected AffineScanSpec or SelectiveScanSpec, got {type(spec).__name__}")


def digest(spec):
    """A short stable hash of the spec: makes entry and kernel symbols unique per scan, so
    several scans can share one LLVM module or one executable's device-module imports."""
    import hashlib

    return hashlib.sha256(repr(spec).encode()).hexdigest()[:16]


def symbolic(spec):
    """Names of the trailing scalar arguments: ["L"] when the length is symbolic."""
    return ["L"] if isinstance(spec, AffineScanSpec) and spec.length is None else []


def numel(shape, length=None):
    n = 1
    for d in shape:
        n *= length if d is None else d
    return n
