"""``AffineScanSpec``: ``h_t = a_t * h_{t-1} + b_t`` along one axis."""
from dataclasses import dataclass

from .common import OUTPUT_KINDS, _check_dtype, _check_extent, _product, is_symbolic


@dataclass(frozen=True)
class AffineScanSpec:
    """Plain affine scan.  ``shape`` is b's shape: ints or names on any dimension (None on the
    axis: the name ``"L"``); each ``a_shape`` entry is 1 or equal to ``shape``'s."""

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
        """L: an int, or its symbolic extent (a name, or None)."""
        return self.shape[self.axis]

    @property
    def state_shape(self):
        """b's shape without the axis (names kept)."""
        return self.shape[:self.axis] + self.shape[self.axis + 1:]

    @property
    def lanes(self):
        """Number of independent recurrences (product of the non-axis dimensions); None when
        one of them is symbolic."""
        return _product(self.state_shape)

    @property
    def inner(self):
        """Elements between consecutive steps of one lane (the stride of the axis); None when
        a dimension after the axis is symbolic."""
        return _product(self.shape[self.axis + 1:])

    @property
    def is_symbolic(self):
        """True when some extent is known only at call time."""
        return any(is_symbolic(d) for d in self.shape)
