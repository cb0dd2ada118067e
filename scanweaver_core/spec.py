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
"""
import math
import re
from dataclasses import dataclass

__all__ = ["SUPPORTED_DTYPES", "OUTPUT_KINDS", "DECAYS", "LAYOUTS", "SELECTIVE_AS_MATRIX",
           "STABILIZED_DECAYS", "AffineScanSpec", "SelectiveScanSpec", "MatrixScanSpec",
           "StabilizedScanSpec", "MLSTMScanSpec", "DeltaScanSpec", "is_symbolic",
           "symbol_name", "symbol_identifiers", "static_or"]

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")
OUTPUT_KINDS = ("states", "last")


def _check_dtype(dtype):
    dtype = str(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype: {dtype} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return dtype


def is_symbolic(extent):
    """True for a symbolic extent: a name (``str``), or None (the axis' length ``"L"``)."""
    return extent is None or isinstance(extent, str)


def symbol_name(extent):
    """The name of a symbolic extent (None is ``"L"``)."""
    return "L" if extent is None else extent


def static_or(extent, otherwise):
    """``extent`` when it is a known int, else ``otherwise``: heuristics that size a schedule
    from an extent pick for a symbolic one as for ``otherwise`` (typically a large value)."""
    return otherwise if is_symbolic(extent) else extent


def _identifier(name):
    ident = re.sub(r"\W+", "_", name.strip()).strip("_") or "n"
    return "_" + ident if ident[0].isdigit() else ident


def symbol_identifiers(spec):
    """``{name: identifier}`` of the spec's distinct symbolic extents in first-use order: the
    names of the int64 variables standing for them in kernels and Relax types (unique per spec,
    so ``"L+3"`` and ``"L + 3"`` do not print alike)."""
    extents = spec.shape if isinstance(spec, AffineScanSpec) else (spec.batch, spec.length)
    out = {}
    for extent in extents:
        if is_symbolic(extent) and symbol_name(extent) not in out:
            ident, k = _identifier(symbol_name(extent)), 1
            while ident in out.values():
                ident, k = f"{_identifier(symbol_name(extent))}_{k}", k + 1
            out[symbol_name(extent)] = ident
    return out


def _check_extent(name, value, symbolic_ok=False):
    if value is None and symbolic_ok:
        return None
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{name}: a symbolic extent needs a non-empty name, got {value!r}")
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: extent must be a positive int or a name (str), got {value!r}")
    return value


def _product(extents):
    """Product of int extents; None when any is symbolic."""
    n = 1
    for d in extents:
        if is_symbolic(d):
            return None
        n *= d
    return n


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


@dataclass(frozen=True)
class SelectiveScanSpec:
    """Mamba selective scan: ``u, delta (B,D,L)``, ``A (D,N)``, ``B, C (B,N,L)`` or with
    ``groups`` G: ``(B,G,N,L)``; optional ``D (D,)``, ``z (B,D,L)``, ``delta_bias (D,)``, ``h0 (B,D,N)``.
    ``A``, ``D`` and ``delta_bias`` are float32 parameters; the rest share ``dtype``.
    ``batch`` and ``length`` may be symbolic (names); ``dim``, ``dstate``, ``groups`` are ints."""

    batch: object            # int or str
    dim: int
    length: object           # int or str
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
            _check_extent(name, getattr(self, name), symbolic_ok=False)
        for name in ("dim", "dstate"):
            if isinstance(getattr(self, name), str):
                raise ValueError(f"{name}: must be a positive int (only batch and length may be symbolic)")
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
    def is_symbolic(self):
        """True when batch or length is known only at call time."""
        return is_symbolic(self.batch) or is_symbolic(self.length)

    @property
    def bc_shape(self):
        if self.groups:
            return (self.batch, self.groups, self.dstate, self.length)
        return (self.batch, self.dstate, self.length)

    def buffer_shapes(self):
        """``{name: shape}`` of every PrimFunc argument, in order (``tir_schedules/README.md``)."""
        bdl, bdn = (self.batch, self.dim, self.length), (self.batch, self.dim, self.dstate)
        shapes = {"u": bdl, "delta": bdl, "A": (self.dim, self.dstate), "B": self.bc_shape,
                  "C": self.bc_shape, "D": (self.dim,) if self.has_D else None,
                  "z": bdl if self.has_z else None,
                  "delta_bias": (self.dim,) if self.has_delta_bias else None,
                  "h0": bdn if self.has_h0 else None, "out": bdl,
                  "last_state": bdn if self.return_last_state else None}
        return {n: s for n, s in shapes.items() if s is not None}

    def as_matrix(self):
        """This scan as the ``MatrixScanSpec`` it is an instance of, on the same buffers
        reshaped (``SELECTIVE_AS_MATRIX`` names them): channel-major, one head per group of
        channels (all channels one head without groups), K = N, V = channels per head, the
        selective decay."""
        heads = self.groups or 1
        per_step = (self.batch, heads, self.length, self.dim // heads)
        bc = (self.batch, heads if self.groups else 1, self.length, self.dstate)
        return MatrixScanSpec.create(self.batch, heads, self.length, self.dstate, self.dim // heads,
                                     bc, bc, per_step, "selective", per_step, False, self.has_h0,
                                     self.dtype, self.return_last_state, "channel_major",
                                     self.has_delta_bias, self.delta_softplus, self.has_D, self.has_z)


DECAYS = ("none", "scalar", "key", "value", "selective")
LAYOUTS = ("time_major", "channel_major")
# a selective scan's operands and outputs -> the matrix scan's it becomes (same bytes, reshaped)
SELECTIVE_AS_MATRIX = {"u": "v", "delta": "dt", "A": "A", "B": "k", "C": "q", "D": "D", "z": "z",
                       "delta_bias": "dt_bias", "h0": "h0", "out": "o", "last_state": "last"}


def _swap_last(shape):
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


@dataclass(frozen=True)
class MatrixScanSpec:
    """A matrix-valued affine recurrence, one (K, V) state per (batch, head)::

        S_t = g_t * S_{t-1} + k_t v_t^T        o_t = (q_t^T S_t + D * v_t) * silu(z_t)

    (a V-vector; the skip ``D * v_t`` with ``has_skip``, the gate with ``has_gate``).
    ``decay`` says what ``g_t`` varies over: ``"none"`` (1: linear attention), ``"scalar"``
    (one value per (batch, head, step): retention, simple GLA, Mamba-2's ``exp(dt*A)``),
    ``"key"`` (``g_t[k]`` scales row k: GLA's ``exp(gk)``), ``"value"`` (column v) or
    ``"selective"``: Mamba-1's discretization, ``g_t[k, v] = exp(dt_t[v] * A[k, v])`` and the
    input ``k_t (dt_t * v_t)^T``, computed in the kernel from ``dt`` (…, V) and ``A`` (H, K, V)
    (a full decay that is never materialized), ``dt`` optionally ``softplus(dt + dt_bias)``.
    The readout always contracts the key dim: a layer reading over its other dim is this spec
    with K and V named the other way round (the matcher transposes the state).

    Shapes below are *logical*, (B, H, L, .): ``q``, ``k`` (…, K), ``v`` (…, V), ``g`` (…, K | V
    | 1; ``dt`` under the selective decay, (…, V)), ``z`` (B, H, L, V), ``h0`` (B, H, K, V); the
    float32 parameters ``A`` (H, K, V), ``dt_bias`` and ``D`` (H, V).  ``q_shape`` … may be 1 on
    B and H (a tensor shared across heads, e.g. Mamba's B and C) and ``g``'s also on L (a
    constant decay, e.g. retention's gamma); each entry is 1 or the full extent.  ``layout``
    says how they lie in memory: ``"time_major"`` as written, or ``"channel_major"`` (Mamba's
    (B, D, L) layout): every per-step operand and ``o`` (B, H, ., L), the state (B, H, V, K),
    ``A`` (H, V, K) — so a ``SelectiveScanSpec`` is this spec on its own buffers reshaped
    (``SelectiveScanSpec.as_matrix``).  ``operand_shapes``, ``out_shape`` and ``state_shape``
    are the buffers' shapes.  Outputs: ``o`` and, with ``return_last_state``, S after the last
    step, both in ``dtype``; the state is kept in float32.  ``reverse`` runs from the end.
    ``batch`` and ``length`` may be symbolic (names); the other extents are ints."""

    batch: object            # int or str
    heads: int
    length: object           # int or str
    key: int
    value: int
    q_shape: tuple
    k_shape: tuple
    v_shape: tuple
    decay: str = "none"
    g_shape: tuple = ()
    reverse: bool = False
    has_h0: bool = False
    dtype: str = "float32"
    return_last_state: bool = False
    layout: str = "time_major"
    has_dt_bias: bool = False
    dt_softplus: bool = False
    has_skip: bool = False
    has_gate: bool = False

    @classmethod
    def create(cls, batch, heads, length, key, value, q_shape=None, k_shape=None, v_shape=None,
               decay="none", g_shape=None, reverse=False, has_h0=False, dtype="float32",
               return_last_state=False, layout="time_major", has_dt_bias=False,
               dt_softplus=False, has_skip=False, has_gate=False):
        """Validate and normalize (logical operand shapes default to the full ones)."""
        full_k, full_v = (batch, heads, length, key), (batch, heads, length, value)
        g_last = {"none": None, "scalar": 1, "key": key, "value": value, "selective": value}
        if decay not in DECAYS:
            raise ValueError(f"decay: {decay!r} is not one of {DECAYS}")
        g_full = () if decay == "none" else (batch, heads, length, g_last[decay])
        return cls(batch, heads, length, key, value,
                   tuple(full_k if q_shape is None else q_shape), tuple(full_k if k_shape is None else k_shape),
                   tuple(full_v if v_shape is None else v_shape), decay,
                   tuple(g_full if g_shape is None else g_shape), bool(reverse), bool(has_h0),
                   dtype, bool(return_last_state), layout, bool(has_dt_bias), bool(dt_softplus),
                   bool(has_skip), bool(has_gate))

    def __post_init__(self):
        for name in ("batch", "heads", "length", "key", "value"):
            value = _check_extent(name, getattr(self, name))
            if isinstance(value, str) and name not in ("batch", "length"):
                raise ValueError(f"{name}: must be a positive int (only batch and length may be symbolic)")
        if self.decay not in DECAYS:
            raise ValueError(f"decay: {self.decay!r} is not one of {DECAYS}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} is not one of {LAYOUTS}")
        if (self.has_dt_bias or self.dt_softplus) and self.decay != "selective":
            raise ValueError("dt_bias, dt_softplus: only the selective decay has a dt")
        last = {"scalar": 1, "key": self.key, "value": self.value, "selective": self.value}.get(self.decay)
        shapes = {"q": (self.q_shape, self.key, False), "k": (self.k_shape, self.key, False),
                  "v": (self.v_shape, self.value, False)}
        if self.decay != "none":
            shapes["dt" if self.decay == "selective" else "g"] = (self.g_shape, last,
                                                                  self.decay != "selective")
        elif self.g_shape:
            raise ValueError(f"g: decay 'none' takes no g, got shape {self.g_shape}")
        for name, (shape, inner, time_may_broadcast) in shapes.items():
            if len(shape) != 4:
                raise ValueError(f"{name}: expected a (B, H, L, .) shape, got {shape}")
            b, h, t, x = shape
            full_t = t == self.length
            if b not in (1, self.batch) or h not in (1, self.heads) or x != inner or \
                    not (full_t or (time_may_broadcast and t == 1)):
                raise ValueError(f"{name}: shape {shape} does not broadcast to "
                                 f"{(self.batch, self.heads, self.length, inner)}")
        _check_dtype(self.dtype)

    @property
    def is_symbolic(self):
        """True when batch or length is known only at call time."""
        return is_symbolic(self.batch) or is_symbolic(self.length)

    def _lay(self, shape):
        """A logical (…, L|K, X) shape as it lies in memory."""
        return _swap_last(shape) if self.layout == "channel_major" else tuple(shape)

    @property
    def state_shape(self):
        """h0's and the last state's buffer shape: (B, H, K, V), channel-major (B, H, V, K)."""
        return self._lay((self.batch, self.heads, self.key, self.value))

    @property
    def out_shape(self):
        """o's buffer shape: (B, H, L, V), channel-major (B, H, V, L)."""
        return self._lay((self.batch, self.heads, self.length, self.value))

    def operand_names(self):
        """The PrimFunc's inputs, in order."""
        decay = {"none": [], "selective": ["dt", "A"]}.get(self.decay, ["g"])
        return (["q", "k", "v"] + decay + (["dt_bias"] if self.has_dt_bias else []) +
                (["D"] if self.has_skip else []) + (["z"] if self.has_gate else []) +
                (["h0"] if self.has_h0 else []))

    def logical_shapes(self):
        """``{name: (B, H, L, .) shape}`` of the inputs (parameters at theirs)."""
        shapes = {"q": self.q_shape, "k": self.k_shape, "v": self.v_shape, "g": self.g_shape,
                  "dt": self.g_shape, "A": (self.heads, self.key, self.value),
                  "dt_bias": (self.heads, self.value), "D": (self.heads, self.value),
                  "z": (self.batch, self.heads, self.length, self.value),
                  "h0": (self.batch, self.heads, self.key, self.value)}
        return {n: shapes[n] for n in self.operand_names()}

    def operand_shapes(self):
        """``{name: buffer shape}`` of the inputs, in order."""
        return {n: s if n in ("dt_bias", "D") else self._lay(s) for n, s in self.logical_shapes().items()}

    def buffer_shapes(self):
        """``{name: shape}`` of every PrimFunc argument, in order: the inputs, ``o``, ``last``."""
        return {**self.operand_shapes(), "o": self.out_shape,
                **({"last": self.state_shape} if self.return_last_state else {})}

    def operand_dtypes(self):
        """``{name: dtype}``: the parameters ``A``, ``dt_bias``, ``D`` are float32."""
        return {n: "float32" if n in ("A", "dt_bias", "D") else self.dtype for n in self.operand_names()}

    def as_selective(self):
        """The ``SelectiveScanSpec`` this spec is on the same bytes, or None.  That needs Mamba's
        form: selective decay, channel-major, forward, B and C (k and q) per head (groups) or
        shared by all, every other operand per (batch, head)."""
        full_b = (self.batch, self.heads)
        if self.decay != "selective" or self.layout != "channel_major" or self.reverse:
            return None
        if self.k_shape != self.q_shape or self.k_shape[0] != self.batch or \
                self.v_shape[:2] != full_b or self.g_shape[:2] != full_b:
            return None
        groups = self.heads if self.k_shape[1] == self.heads and self.heads > 1 else 0
        return SelectiveScanSpec(self.batch, self.heads * self.value, self.length, self.key, groups,
                                 self.has_skip, self.has_gate, self.has_dt_bias, self.dt_softplus,
                                 self.has_h0, self.dtype, self.return_last_state)

    @classmethod
    def for_arrays(cls, q, k, v, g=None, decay=None, h0=None, reverse=False, return_last_state=False,
                   check_dtypes=True, A=None, dt_bias=None, dt_softplus=False, D=None, z=None,
                   layout="time_major"):
        """The spec of concrete arrays (their buffer shapes in ``layout``), checked; ``decay``
        is "selective" with ``A`` (``g`` is then dt), else read from ``g``'s last dim when not
        given (K: "key", V: "value", 1: "scalar"; ambiguous when K == V).  Without
        ``check_dtypes`` (the float64 reference) the spec says float32."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {LAYOUTS}")
        if len(q.shape) != 4 or len(v.shape) != 4:
            raise ValueError(f"q, v: expected 4-d arrays, got {tuple(q.shape)}, {tuple(v.shape)}")
        lay = _swap_last if layout == "channel_major" else tuple
        shapes = [lay(tuple(int(n) for n in x.shape)) for x in (q, k, v)]
        batch = max(s[0] for s in shapes)
        heads = max(s[1] for s in shapes)
        length, key, value = shapes[0][2], shapes[0][3], shapes[2][3]
        g_shape = None
        if A is not None:
            decay = "selective"
        if g is None:
            decay = "none"
        else:
            g_shape = lay(tuple(int(n) for n in g.shape))
            if decay is None:
                decay = {1: "scalar", key: "key", value: "value"}.get(g_shape[-1] if g_shape else 0)
                if key == value and g_shape and g_shape[-1] == key and key != 1:
                    raise ValueError("g: its last dim is both K and V; say decay='key' or 'value'")
            if decay is None:
                raise ValueError(f"g: shape {g_shape} is not a decay over (B, H, L, K | V | 1)")
        dtype = str(q.dtype) if check_dtypes else "float32"
        spec = cls.create(batch, heads, length, key, value, *shapes, decay, g_shape, reverse,
                          h0 is not None, dtype, return_last_state, layout, dt_bias is not None,
                          dt_softplus, D is not None, z is not None)
        given = {"q": q, "k": k, "v": v, "g": g, "dt": g, "A": A, "dt_bias": dt_bias, "D": D,
                 "z": z, "h0": h0}
        if spec.decay == "selective" and A is None:
            raise ValueError("A: the selective decay needs A")
        if A is not None and spec.decay != "selective":   # (the other options follow their arrays)
            raise ValueError("A: this spec takes no A (the selective decay needs g, its dt)")
        dtypes = spec.operand_dtypes()
        for name, shape in spec.operand_shapes().items():
            x = given[name]
            if name not in ("q", "k", "v") and tuple(x.shape) != shape:
                raise ValueError(f"{name}: expected shape {shape}, got {tuple(x.shape)}")
            if check_dtypes and str(x.dtype) != dtypes[name]:
                raise ValueError(f"{name}: dtype {x.dtype} is not {dtypes[name]}")
        return spec



STABILIZED_DECAYS = ("none", "channel", "step")


@dataclass(frozen=True)
class StabilizedScanSpec:
    """A per-channel recurrence in log space, kept max-stabilized::

        num_t = exp(w_t) num_{t-1} + exp(k_t) v_t      den_t = exp(w_t) den_{t-1} + exp(k_t)

    stored as ``(num', den', m)`` with ``num = exp(m) num'`` and ``m_t = max(m_{t-1} + w_t,
    k_t)`` (``algebra.log_compose``), so no exponent ever exceeds 0.  Lanes are (batch,
    channel); ``layout`` says where time lies: ``"time_major"`` (B, L, C) (RWKV's) or
    ``"channel_major"`` (B, C, L).  ``decay``: ``"none"`` (w = 0: logcumsumexp), ``"channel"``
    (one log-decay per channel, ``w (C,)``, float32: RWKV's ``-exp(time_decay)``) or ``"step"``
    (``w`` shaped like ``k``).  Without ``has_values`` only den is kept (no ``v``).

    Output ``out`` (k's shape, ``dtype``): ``num_t / den_t``, or ``log(den_t)`` without values
    (so den-only with no decay is ``logcumsumexp(k)``).  With ``has_bonus`` the output reads
    the state *before* the step's update plus the step with a bonus ``u (C,)`` (float32;
    RWKV's ``time_first``): ``(num_{t-1} + exp(u + k_t) v_t) / (den_{t-1} + exp(u + k_t))``.
    ``has_h0``: an initial state ``num0`` (with values), ``den0``, ``max0``, each (B, C)
    float32 (no initial state is the empty sum: ``num0 = den0 = 0``, ``max0 = -1e38``);
    ``return_last_state`` adds ``last_num`` (with values), ``last_den``, ``last_max`` (B, C)
    float32.  ``reverse`` runs from the end.  ``k``, ``v`` and a per-step ``w`` are in
    ``dtype`` (float32/float16/bfloat16); the state is float32.  ``batch`` and ``length`` may be
    symbolic (names); ``channels`` is an int."""

    batch: int
    channels: int
    length: int
    decay: str = "channel"
    has_values: bool = True
    has_bonus: bool = False
    has_h0: bool = False
    reverse: bool = False
    return_last_state: bool = False
    layout: str = "time_major"
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("batch", "channels", "length"):
            value = _check_extent(name, getattr(self, name))
            if isinstance(value, str) and name == "channels":
                raise ValueError("channels: must be a positive int (only batch and length may be symbolic)")
        if self.decay not in STABILIZED_DECAYS:
            raise ValueError(f"decay: {self.decay!r} is not one of {STABILIZED_DECAYS}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: {self.layout!r} is not one of {LAYOUTS}")
        _check_dtype(self.dtype)

    @property
    def is_symbolic(self):
        """True when batch or length is known only at call time."""
        return is_symbolic(self.batch) or is_symbolic(self.length)

    @property
    def seq_shape(self):
        """k's, v's, a per-step w's and out's buffer shape."""
        b, c, l = self.batch, self.channels, self.length
        return (b, l, c) if self.layout == "time_major" else (b, c, l)

    @property
    def state_shape(self):
        return (self.batch, self.channels)

    @property
    def time_axis(self):
        return 1 if self.layout == "time_major" else 2

    def state_names(self):
        """The state's parts, in order: ``num`` (with values), ``den``, ``max``."""
        return (["num"] if self.has_values else []) + ["den", "max"]

    def operand_names(self):
        """The PrimFunc's inputs, in order: ``k, [v], [w], [u], [num0], [den0, max0]``."""
        return (["k"] + (["v"] if self.has_values else []) +
                (["w"] if self.decay != "none" else []) + (["u"] if self.has_bonus else []) +
                ([f"{n}0" for n in self.state_names()] if self.has_h0 else []))

    def output_names(self):
        """The PrimFunc's outputs, in order: ``out, [last_num], [last_den, last_max]``."""
        return ["out"] + ([f"last_{n}" for n in self.state_names()] if self.return_last_state else [])

    def operand_shapes(self):
        shapes = {"k": self.seq_shape, "v": self.seq_shape,
                  "w": (self.channels,) if self.decay == "channel" else self.seq_shape,
                  "u": (self.channels,)}
        return {n: shapes.get(n, self.state_shape) for n in self.operand_names()}

    def output_shapes(self):
        return {n: self.seq_shape if n == "out" else self.state_shape for n in self.output_names()}

    def buffer_shapes(self):
        """``{name: shape}`` of every PrimFunc argument, in order."""
        return {**self.operand_shapes(), **self.output_shapes()}

    def buffer_dtypes(self):
        """``{name: dtype}``: ``k``, ``v``, a per-step ``w`` and ``out`` in ``dtype``; a
        per-channel ``w``, ``u`` and every state buffer float32."""
        seq = {"k", "v", "out"} | ({"w"} if self.decay == "step" else set())
        return {n: self.dtype if n in seq else "float32" for n in self.buffer_shapes()}

    def operand_dtypes(self):
        dtypes = self.buffer_dtypes()
        return {n: dtypes[n] for n in self.operand_names()}

    @classmethod
    def for_arrays(cls, k, v=None, w=None, u=None, h0=None, reverse=False,
                   return_last_state=False, layout="time_major", check_dtypes=True):
        """The spec of concrete arrays, every operand's shape (and dtype) checked.  ``w`` is
        per channel when 1-d, per step when shaped like ``k``, none when None; ``h0`` is the
        tuple ``(num0, den0, max0)`` (``(den0, max0)`` without ``v``).  Without
        ``check_dtypes`` (the float64 reference) the spec says float32."""
        if layout not in LAYOUTS:
            raise ValueError(f"layout: {layout!r} is not one of {LAYOUTS}")
        if len(k.shape) != 3:
            raise ValueError(f"k: expected a 3-d (B, L, C) or (B, C, L) array, got shape {tuple(k.shape)}")
        shape = tuple(int(n) for n in k.shape)
        if 0 in shape:
            raise ValueError(f"k: shape {shape} has an empty dimension")
        b, l, c = shape if layout == "time_major" else (shape[0], shape[2], shape[1])
        decay = "none"
        if w is not None:
            wshape = tuple(int(n) for n in w.shape)
            decay = "channel" if wshape == (c,) else "step" if wshape == shape else None
            if decay is None:
                raise ValueError(f"w: expected shape ({c},) (per channel) or {shape} (per step), got {wshape}")
        dtype = str(k.dtype) if check_dtypes else "float32"
        if h0 is not None:
            h0 = tuple(h0)
        spec = cls(b, c, l, decay, v is not None, u is not None, h0 is not None, bool(reverse),
                   bool(return_last_state), layout, dtype)
        given = dict(zip(spec.operand_names(), [k] + [x for x in (v, w, u) if x is not None] +
                         list(h0 or ())))
        if h0 is not None and len(h0) != len(spec.state_names()):
            raise ValueError(f"h0: expected {len(spec.state_names())} arrays "
                             f"({', '.join(n + '0' for n in spec.state_names())}), got {len(h0)}")
        dtypes = spec.operand_dtypes()
        for name, want in spec.operand_shapes().items():
            x = given[name]
            if tuple(int(n) for n in x.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
            if check_dtypes and str(x.dtype) != dtypes[name]:
                raise ValueError(f"{name}: dtype {x.dtype} is not {dtypes[name]}")
        return spec


@dataclass(frozen=True)
class MLSTMScanSpec:
    """xLSTM's mLSTM: a matrix memory with exponential gating, kept max-stabilized::

        m_t = max(f_t + m_{t-1}, i_t)
        C_t = exp(f_t + m_{t-1} - m_t) C_{t-1} + exp(i_t - m_t) k_t v_t^T     (K, V)
        n_t = exp(f_t + m_{t-1} - m_t) n_{t-1} + exp(i_t - m_t) k_t           (K)
        h_t = q_t^T C_t / (max(|q_t . n_t|, exp(-m_t)) + eps)                 (V)

    per (batch, head): ``f`` is the log forget gate (HF's ``logsigmoid(fgate)``), ``i`` the
    log input gate.  ``C`` and ``n`` are the unstabilized sums scaled by ``exp(-m_t)``, so no
    exponent exceeds 0 (as ``StabilizedScanSpec`` keeps RWKV's); the readout depends on
    ``m`` only through ``exp(-m_t)`` and ``eps``, which is why ``m`` is part of the state and
    not an implementation detail.  Without ``normalized`` the readout is ``q_t^T C_t`` (no
    ``n``).  Inputs: ``q``, ``k`` (B, H, L, K), ``v`` (B, H, L, V), ``i``, ``f`` (B, H, L),
    in ``dtype``; with ``has_h0`` ``C0`` (B, H, K, V), ``n0`` (B, H, K) (normalized only) and
    ``m0`` (B, H), float32; without, all three are 0, as HF starts them.  Outputs: ``h``
    (B, H, L, V) in ``dtype``; with ``return_last_state`` ``last_C``, ``last_n``, ``last_m``
    (float32).  ``reverse`` runs from the end.  ``batch`` and ``length`` may be symbolic."""

    batch: object
    heads: int
    length: object
    key: int
    value: int
    normalized: bool = True
    eps: float = 1e-6
    reverse: bool = False
    has_h0: bool = False
    return_last_state: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("batch", "heads", "length", "key", "value"):
            value = _check_extent(name, getattr(self, name))
            if isinstance(value, str) and name not in ("batch", "length"):
                raise ValueError(f"{name}: must be a positive int (only batch and length may be symbolic)")
        if not isinstance(self.eps, (int, float)) or not self.eps >= 0:
            raise ValueError(f"eps: must be a float >= 0, got {self.eps!r}")
        _check_dtype(self.dtype)

    @property
    def is_symbolic(self):
        """True when batch or length is known only at call time."""
        return is_symbolic(self.batch) or is_symbolic(self.length)

    def state_names(self):
        """The state's parts, in order: ``C``, ``n`` (normalized), ``m``."""
        return ["C"] + (["n"] if self.normalized else []) + ["m"]

    def state_shapes(self):
        b, h = self.batch, self.heads
        shapes = {"C": (b, h, self.key, self.value), "n": (b, h, self.key), "m": (b, h)}
        return {n: shapes[n] for n in self.state_names()}

    def operand_names(self):
        """The PrimFunc's inputs, in order: ``q, k, v, i, f, [C0, n0, m0]``."""
        return ["q", "k", "v", "i", "f"] + ([f"{n}0" for n in self.state_names()] if self.has_h0 else [])

    def output_names(self):
        """The PrimFunc's outputs, in order: ``h, [last_C, last_n, last_m]``."""
        return ["h"] + ([f"last_{n}" for n in self.state_names()] if self.return_last_state else [])

    def buffer_shapes(self):
        """``{name: shape}`` of every PrimFunc argument, in order."""
        b, h, l = self.batch, self.heads, self.length
        shapes = {"q": (b, h, l, self.key), "k": (b, h, l, self.key), "v": (b, h, l, self.value),
                  "i": (b, h, l), "f": (b, h, l), "h": (b, h, l, self.value)}
        states = self.state_shapes()
        for n in self.state_names():
            shapes[f"{n}0"] = shapes[f"last_{n}"] = states[n]
        return {n: shapes[n] for n in self.operand_names() + self.output_names()}

    def operand_shapes(self):
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.operand_names()}

    def output_shapes(self):
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.output_names()}

    def buffer_dtypes(self):
        """``{name: dtype}``: the per-step operands and ``h`` in ``dtype``, states float32."""
        return {n: self.dtype if n in ("q", "k", "v", "i", "f", "h") else "float32"
                for n in self.buffer_shapes()}

    def operand_dtypes(self):
        dtypes = self.buffer_dtypes()
        return {n: dtypes[n] for n in self.operand_names()}

    @classmethod
    def for_arrays(cls, q, k, v, i, f, h0=None, normalized=True, eps=1e-6, reverse=False,
                   return_last_state=False, check_dtypes=True):
        """The spec of concrete arrays, every operand's shape (and dtype) checked; ``h0`` is
        ``(C0, n0, m0)`` (``(C0, m0)`` unnormalized).  Without ``check_dtypes`` (the float64
        reference) the spec says float32."""
        if len(q.shape) != 4 or len(v.shape) != 4:
            raise ValueError(f"q, v: expected (B, H, L, .) arrays, got {tuple(q.shape)}, {tuple(v.shape)}")
        b, h, l, key = (int(n) for n in q.shape)
        h0 = None if h0 is None else tuple(h0)
        spec = cls(b, h, l, key, int(v.shape[-1]), bool(normalized), float(eps), bool(reverse),
                   h0 is not None, bool(return_last_state), str(q.dtype) if check_dtypes else "float32")
        if h0 is not None and len(h0) != len(spec.state_names()):
            raise ValueError(f"h0: expected {len(spec.state_names())} arrays "
                             f"({', '.join(n + '0' for n in spec.state_names())}), got {len(h0)}")
        given = dict(zip(spec.operand_names(), [q, k, v, i, f] + list(h0 or ())))
        dtypes = spec.operand_dtypes()
        for name, want in spec.operand_shapes().items():
            x = given[name]
            if tuple(int(n) for n in x.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
            if check_dtypes and str(x.dtype) != dtypes[name]:
                raise ValueError(f"{name}: dtype {x.dtype} is not {dtypes[name]}")
        return spec


DELTA_DECAYS = ("none", "head", "key")
DELTA_RULES = ("delta", "dplr")


@dataclass(frozen=True)
class DeltaScanSpec:
    """The delta-rule family (DeltaNet, Gated DeltaNet, KDA, Comba): a K x V matrix state per
    (batch, head) whose transition is a matrix, not an elementwise coefficient::

        S'_t = D_t S_{t-1}                             D_t = I | exp(g_t) | diag(exp(g_t))
        S_t  = S'_t + beta_t k_t (v_t - S'_t^T p_t)^T  (p = k; Comba reads with its own p)
        o_t  = scale * S_t^T q_t                        (V)

    i.e. ``S_t = (I - beta_t k_t p_t^T) D_t S_{t-1} + beta_t k_t v_t^T``: a first-order linear
    recurrence, so a scan whose elements compose by matrix products.  ``decay``: ``"none"``
    (DeltaNet), ``"head"`` (a log-decay ``g`` (B, H, L), Gated DeltaNet), ``"key"`` (``g``
    (B, H, L, K), KDA).  ``l2norm``: q and k (and p) are divided by their L2 norm (+1e-6 under
    the root, as fla's ``l2norm``) inside the kernel.  ``qk_heads`` divides ``heads``: head h
    reads q/k/p head ``h // (heads // qk_heads)`` (grouped value heads).  Inputs: ``q``, ``k``
    (B, qk_heads, L, K), ``v`` (B, H, L, V), ``beta`` (B, H, L), ``g``, ``p`` (B, qk_heads, L,
    K) with ``separate_read``, ``S0`` (B, H, K, V, float32) with ``has_h0``; outputs ``o`` (B, H,
    L, V) in ``dtype``, ``last_S`` (float32) with ``return_last_state``.  The state is float32
    whatever ``dtype``.  ``batch`` and ``length`` may be symbolic.

    ``rule="dplr"``: the generalized diagonal-plus-rank-1 transition (RWKV-7, fla's DPLR and
    IPLR recurrences), the rank-1 term reading the state before its decay::

        S_t = D_t S_{t-1} + b_t (a_t^T S_{t-1}) + k_t v_t^T,   o_t = scale * S_t^T q_t

    i.e. ``S_t = (D_t + b_t a_t^T) S_{t-1} + k_t v_t^T``: inputs ``q, k, v, a, b`` (``a``, ``b``
    shaped as ``k``), ``[g]``, ``[S0]``; no ``beta``, ``p`` or ``l2norm``.  The delta rule is
    the case ``b = -beta k``, ``a = D p`` (its own rule: it reads the decayed state)."""

    batch: object
    heads: int
    length: object
    key: int
    value: int
    decay: str = "none"
    qk_heads: int = 0              # 0: as many as heads
    scale: float = 1.0
    l2norm: bool = False
    separate_read: bool = False    # Comba's p
    reverse: bool = False
    has_h0: bool = False
    return_last_state: bool = False
    dtype: str = "float32"
    rule: str = "delta"

    def __post_init__(self):
        for name in ("batch", "heads", "length", "key", "value"):
            value = _check_extent(name, getattr(self, name))
            if isinstance(value, str) and name not in ("batch", "length"):
                raise ValueError(f"{name}: must be a positive int (only batch and length may be symbolic)")
        if self.decay not in DELTA_DECAYS:
            raise ValueError(f"decay: {self.decay!r} is not one of {DELTA_DECAYS}")
        if self.rule not in DELTA_RULES:
            raise ValueError(f"rule: {self.rule!r} is not one of {DELTA_RULES}")
        if self.rule == "dplr" and (self.separate_read or self.l2norm):
            raise ValueError("rule 'dplr': its read vector is a (no separate_read) and it has no l2norm")
        if self.qk_heads == 0:
            object.__setattr__(self, "qk_heads", self.heads)
        if not isinstance(self.qk_heads, int) or self.qk_heads < 1 or self.heads % self.qk_heads:
            raise ValueError(f"qk_heads: {self.qk_heads!r} must divide heads ({self.heads})")
        if not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise ValueError(f"scale: must be a finite float, got {self.scale!r}")
        object.__setattr__(self, "scale", float(self.scale))
        _check_dtype(self.dtype)

    @property
    def is_symbolic(self):
        """True when batch or length is known only at call time."""
        return is_symbolic(self.batch) or is_symbolic(self.length)

    @property
    def group(self):
        """Value heads per q/k head."""
        return self.heads // self.qk_heads

    @property
    def is_dplr(self):
        return self.rule == "dplr"

    def operand_names(self):
        """The PrimFunc's inputs, in order: ``q, k, v, beta, [g], [p], [S0]``; with the DPLR
        rule ``q, k, v, a, b, [g], [S0]``."""
        rank1 = ["a", "b"] if self.is_dplr else ["beta"]
        return (["q", "k", "v"] + rank1 + (["g"] if self.decay != "none" else [])
                + (["p"] if self.separate_read else []) + (["S0"] if self.has_h0 else []))

    def output_names(self):
        return ["o"] + (["last_S"] if self.return_last_state else [])

    def buffer_shapes(self):
        """``{name: shape}`` of every PrimFunc argument, in order."""
        b, h, hk, l, key = self.batch, self.heads, self.qk_heads, self.length, self.key
        shapes = {"q": (b, hk, l, key), "k": (b, hk, l, key), "p": (b, hk, l, key),
                  "a": (b, hk, l, key), "b": (b, hk, l, key),
                  "v": (b, h, l, self.value), "beta": (b, h, l),
                  "g": (b, h, l) if self.decay == "head" else (b, h, l, key),
                  "S0": (b, h, key, self.value), "o": (b, h, l, self.value),
                  "last_S": (b, h, key, self.value)}
        return {n: shapes[n] for n in self.operand_names() + self.output_names()}

    def operand_shapes(self):
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.operand_names()}

    def output_shapes(self):
        shapes = self.buffer_shapes()
        return {n: shapes[n] for n in self.output_names()}

    def buffer_dtypes(self):
        """The per-step operands and ``o`` in ``dtype``; the states float32."""
        return {n: "float32" if n in ("S0", "last_S") else self.dtype for n in self.buffer_shapes()}

    def operand_dtypes(self):
        dtypes = self.buffer_dtypes()
        return {n: dtypes[n] for n in self.operand_names()}

    @classmethod
    def for_arrays(cls, q, k, v, beta, g=None, p=None, h0=None, scale=1.0, l2norm=False,
                   reverse=False, return_last_state=False, check_dtypes=True, a=None, b=None):
        """The spec of concrete arrays (decay from ``g``'s rank; the DPLR rule when ``a`` and
        ``b`` are given, ``beta`` None), every operand's shape (and dtype) checked.  Without
        ``check_dtypes`` (the float64 reference) it says float32."""
        if (a is None) != (b is None) or (a is not None) == (beta is not None):
            raise ValueError("give beta (a delta rule) or both a and b (the DPLR rule)")
        if len(q.shape) != 4 or len(v.shape) != 4:
            raise ValueError(f"q, v: expected (B, H, L, .) arrays, got {tuple(q.shape)}, {tuple(v.shape)}")
        batch, hk, l, key = (int(n) for n in q.shape)
        heads, value = int(v.shape[1]), int(v.shape[-1])
        decay = "none" if g is None else {3: "head", 4: "key"}.get(len(g.shape))
        if decay is None:
            raise ValueError(f"g: expected (B, H, L) or (B, H, L, K), got {tuple(g.shape)}")
        spec = cls(batch, heads, l, key, value, decay, hk, scale, bool(l2norm), p is not None, bool(reverse),
                   h0 is not None, bool(return_last_state), str(q.dtype) if check_dtypes else "float32",
                   "delta" if a is None else "dplr")
        given = {"q": q, "k": k, "v": v, "beta": beta, "g": g, "p": p, "S0": h0, "a": a, "b": b}
        dtypes = spec.operand_dtypes()
        for name, want in spec.operand_shapes().items():
            x = given[name]
            if tuple(int(n) for n in x.shape) != want:
                raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
            if check_dtypes and str(x.dtype) != dtypes[name]:
                raise ValueError(f"{name}: dtype {x.dtype} is not {dtypes[name]}")
        return spec
