"""``StabilizedScanSpec``: a first-order recurrence kept in log space, max-stabilized (RWKV-4's WKV)."""
from dataclasses import dataclass

from .common import NamedOperands, _check_dtype, _check_extent, is_symbolic
from .matrix import LAYOUTS


STABILIZED_DECAYS = ("none", "channel", "step")


@dataclass(frozen=True)
class StabilizedScanSpec(NamedOperands):
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
        spec.check_operands(given, check_dtypes)
        return spec
