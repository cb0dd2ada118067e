"""One immutable description of a scan, shared by every stage.

``AffineScanSpec``: ``h_t = a_t * h_{t-1} + b_t`` along ``axis`` of ``b``; ``a`` broadcasts
against ``b``; optional initial state ``h0`` (b's shape without the axis); ``reverse`` runs
from the end.  ``SelectiveScanSpec``: Mamba's selective scan (see ``reference.selective_scan``).
Inputs may be float32/float16/bfloat16; every realization accumulates in float32 and writes
outputs in the input dtype.  Constructors validate and raise ``ValueError`` naming the operand,
so a bad shape never reaches TVM.
"""
from dataclasses import dataclass

__all__ = ["SUPPORTED_DTYPES", "OUTPUT_KINDS", "AffineScanSpec", "SelectiveScanSpec"]

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
OUTPUT_KINDS = ("states", "last")


def _check_dtype(dtype):
    dtype = str(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype: {dtype} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def _check_extent(name, value, symbolic_ok=False):
    if value is None and symbolic_ok:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: extent must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class AffineScanSpec:
    """Plain affine scan.  ``shape`` is b's shape; its ``axis`` entry is None for a symbolic L."""

    shape: tuple
    a_shape: tuple
    axis: int
    reverse: bool = False
    has_h0: bool = False
    dtype: str = "float32"
    outputs: tuple = ("states",)

    @classmethod
    def create(cls, shape, a_shape=None, axis=-1, reverse=False, has_h0=False,
               dtype="float32", outputs=("states",)):
        """Validate and normalize: non-negative axis, ``a_shape`` left-padded to b's rank."""
        shape = tuple(shape)
        rank = len(shape)
        if rank == 0:
            raise ValueError("b: needs at least one dimension (the scan axis)")
        if not isinstance(axis, int) or not -rank <= axis < rank:
            raise ValueError(f"axis: {axis!r} is out of range for b of rank {rank}")
        axis %= rank
        for i, n in enumerate(shape):
            if i == axis and n == 0:
                raise ValueError(f"b: the scan length (dimension {axis}) is 0; a scan needs L >= 1")
            _check_extent(f"b: dimension {i}", n, symbolic_ok=(i == axis))
        a_shape = shape if a_shape is None else tuple(a_shape)
        if len(a_shape) > rank:
            raise ValueError(f"a: rank {len(a_shape)} exceeds b's rank {rank}")
        a_shape = (1,) * (rank - len(a_shape)) + a_shape
        for i, (na, nb) in enumerate(zip(a_shape, shape)):
            if na != 1 and na != nb:
                raise ValueError(f"a: shape {a_shape} does not broadcast to b's shape {shape} "
                                 f"(dimension {i}: {na} vs {nb})")
        if isinstance(outputs, str):
            outputs = (outputs,)
        outputs = tuple(k for k in OUTPUT_KINDS if k in outputs)
        if not outputs:
            raise ValueError(f"outputs: choose from {OUTPUT_KINDS}")
        return cls(shape, a_shape, axis, bool(reverse), bool(has_h0), _check_dtype(dtype), outputs)

    @classmethod
    def for_arrays(cls, a, b, h0=None, axis=-1, reverse=False, outputs=("states",)):
        """The spec of concrete arrays (anything with ``.shape`` and ``.dtype``), checked."""
        spec = cls.create(b.shape, getattr(a, "shape", ()), axis, reverse, h0 is not None,
                          str(b.dtype), outputs)
        if str(getattr(a, "dtype", b.dtype)) != spec.dtype:
            raise ValueError(f"a: dtype {a.dtype} differs from b's {spec.dtype}")
        if h0 is not None:
            if tuple(h0.shape) != spec.state_shape:
                raise ValueError(f"h0: shape {tuple(h0.shape)} is not the state shape {spec.state_shape}")
            if str(h0.dtype) != spec.dtype:
                raise ValueError(f"h0: dtype {h0.dtype} differs from b's {spec.dtype}")
        return spec

    @property
    def length(self):
        """L, or None when symbolic."""
        return self.shape[self.axis]

    @property
    def state_shape(self):
        return self.shape[:self.axis] + self.shape[self.axis + 1:]

    @property
    def lanes(self):
        """Number of independent recurrences (product of the non-axis dimensions)."""
        n = 1
        for d in self.state_shape:
            n *= d
        return n

    @property
    def inner(self):
        """Elements between consecutive steps of one lane (the stride of the axis)."""
        n = 1
        for d in self.shape[self.axis + 1:]:
            n *= d
        return n


@dataclass(frozen=True)
class SelectiveScanSpec:
    """Mamba selective scan: ``u, delta (B,D,L)``, ``A (D,N)``, ``B, C (B,N,L)`` or with
    ``groups`` G: ``(B,G,N,L)``; optional ``D (D,)``, ``z (B,D,L)``, ``delta_bias (D,)``, ``h0 (B,D,N)``.
    ``A``, ``D`` and ``delta_bias`` are float32 parameters; the rest share ``dtype``."""

    batch: int
    dim: int
    length: int
    dstate: int
    groups: int = 0          # 0: B, C are (B,N,L); G >= 1: (B,G,N,L)
    has_D: bool = False
    has_z: bool = False
    has_delta_bias: bool = False
    delta_softplus: bool = False
    has_h0: bool = False
    dtype: str = "float32"
    return_last_state: bool = False

    def __post_init__(self):
        for name in ("batch", "dim", "length", "dstate"):
            _check_extent(name, getattr(self, name))
        if self.groups and (self.groups < 0 or self.dim % self.groups):
            raise ValueError(f"B/C: {self.groups} groups do not divide D={self.dim}")
        _check_dtype(self.dtype)

    @classmethod
    def for_arrays(cls, u, delta, A, B, C, D=None, z=None, delta_bias=None,
                   delta_softplus=False, h0=None, return_last_state=False, check_dtypes=True):
        """The spec of concrete arrays, every operand's shape (and dtype) checked."""
        if len(u.shape) != 3:
            raise ValueError(f"u: expected (batch, dim, L), got shape {tuple(u.shape)}")
        b, d, l = (int(x) for x in u.shape)
        if l == 0:
            raise ValueError("u: the scan length L is 0; a scan needs L >= 1")
        if len(A.shape) != 2 or A.shape[0] != d:
            raise ValueError(f"A: expected ({d}, N), got shape {tuple(A.shape)}")
        n = int(A.shape[1])
        groups = 0
        if len(B.shape) == 4:
            groups = int(B.shape[1])
        bc_shape = (b, n, l) if not groups else (b, groups, n, l)
        spec = cls(b, d, l, n, groups, D is not None, z is not None, delta_bias is not None,
                   bool(delta_softplus), h0 is not None,
                   str(u.dtype) if check_dtypes else "float32", bool(return_last_state))
        expected = {"delta": (delta, (b, d, l)), "B": (B, bc_shape), "C": (C, bc_shape),
                    "D": (D, (d,)), "z": (z, (b, d, l)), "delta_bias": (delta_bias, (d,)),
                    "h0": (h0, (b, d, n))}
        for name, (arr, shape) in expected.items():
            if arr is not None and tuple(arr.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(arr.shape)}")
        if not check_dtypes:
            return spec
        for name, arr in [("u", u), ("delta", delta), ("B", B), ("C", C), ("z", z), ("h0", h0)]:
            if arr is not None and str(arr.dtype) != spec.dtype:
                raise ValueError(f"{name}: dtype {arr.dtype} differs from u's {spec.dtype}")
        for name, arr in [("A", A), ("D", D), ("delta_bias", delta_bias)]:
            if arr is not None and str(arr.dtype) != "float32":
                raise ValueError(f"{name}: dtype {arr.dtype} must be float32 (a parameter)")
        return spec

    @property
    def bc_shape(self):
        if self.groups:
            return (self.batch, self.groups, self.dstate, self.length)
        return (self.batch, self.dstate, self.length)
