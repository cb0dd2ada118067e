"""``MLSTMScanSpec``: xLSTM's mLSTM."""
from dataclasses import dataclass

from .common import NamedOperands, _check_dtype, _check_extent, is_symbolic


@dataclass(frozen=True)
class MLSTMScanSpec(NamedOperands):
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

    def buffer_dtypes(self):
        """``{name: dtype}``: the per-step operands and ``h`` in ``dtype``, states float32."""
        return {n: self.dtype if n in ("q", "k", "v", "i", "f", "h") else "float32"
                for n in self.buffer_shapes()}

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
        spec.check_operands(given, check_dtypes)
        return spec
