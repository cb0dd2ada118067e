"""``MatrixScanSpec`` (a matrix state per (batch, head)) and ``SelectiveScanSpec``, Mamba's
selective scan in its own operand names: an instance of the matrix spec on the same bytes."""
from dataclasses import dataclass

from .common import _check_dtype, _check_extent, is_symbolic


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
