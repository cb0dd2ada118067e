"""``DeltaScanSpec``: delta rules (plain, gated, KDA, Comba, DPLR)."""
import math
from dataclasses import dataclass

from .common import NamedOperands, _check_dtype, _check_extent, is_symbolic


DELTA_DECAYS = ("none", "head", "key")
DELTA_RULES = ("delta", "dplr")


@dataclass(frozen=True)
class DeltaScanSpec(NamedOperands):
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

    def buffer_dtypes(self):
        """The per-step operands and ``o`` in ``dtype``; the states float32."""
        return {n: "float32" if n in ("S0", "last_S") else self.dtype for n in self.buffer_shapes()}

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
        spec.check_operands(given, check_dtypes)
        return spec
