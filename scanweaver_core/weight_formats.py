"""Weight-only formats: how a dense layer's (K, N) weight is quantized, packed and read back.

The vocabulary the ecosystem uses: ``int8`` (per output channel, symmetric: llama.cpp's Q8_0
without groups, NNCF's ``INT8_SYM``), ``int8_asym`` (NNCF's default ``INT8_ASYM``), ``int4``
in groups along K of 32, 64 or 128 (llama.cpp's Q4_0 / Q4_1 use 32, MLC's ``q4f16_1`` 32, NNCF
128 by default), symmetric or asymmetric.  Named ``int{8,4}[_asym][_g{group}]``; ``int4``
alone is symmetric in groups of 128.  Every format reads a weight back as

    W[k, n] = q[k, n] * scale[k // group, n] + low[k // group, n]

with ``q`` unsigned (4 or 8 bits) for the grouped and asymmetric formats (``low = -zero *
scale``, the integer zero point folded in; symmetric int4 stores ``q + 8``), so one kernel
reads all of them; ``int8`` symmetric keeps ``q`` signed and no ``low`` (``x @ (q * scale) =
(x @ q) * scale``: its scale is the matmul's epilogue).  ``dequantize`` is the oracle.
"""
import re
from dataclasses import dataclass, replace

import numpy as np

PANEL = 32          # columns of a packed panel (``pack``): a register tile's width
GROUPS = (32, 64, 128)
SMALLEST_GROUP = GROUPS[0]   # a 4-bit weight of fewer rows takes the 8-bit backup (``for_depth``)
NAMES = ("int8", "int8_asym", "int4", "int4_asym",       # the names ``weight_format`` takes (a CLI lists them)
         *(f"int4{kind}_g{group}" for group in GROUPS for kind in ("", "_asym")))
ACTIVATIONS = ("bfloat16",)
GEMV_ROWS = 8       # a product of this many rows or fewer (a decode step's) is summed group by group


@dataclass(frozen=True)
class WeightFormat:
    """``bits`` per weight, ``group`` rows of K per scale (None: one per output channel),
    ``symmetric`` or with a zero point; ``head``: the format name of the layer that produces
    the logits (``"float"`` keeps it; None: the same as the others).  Peers keep the head at 8
    bits under int4 (NNCF's default, llama.cpp's Q4_K_M keeps it at 6), and so does ``int4``.
    ``activations``: None keeps the model's; ``"bfloat16"`` lets a prefill's dense layers round
    their activations to bf16 where the CPU multiplies bf16 pairs (AVX512-BF16: ``vdpbf16ps``,
    twice an FMA's products), as MLC's ``q4bf16`` and OpenVINO's bf16 inference do; asked for,
    never assumed (a decode step's layers keep float32: they are bound by the weights' bytes)."""
    bits: int
    group: int | None
    symmetric: bool
    head: str | None = None
    activations: str | None = None

    @property
    def name(self):
        return f"int{self.bits}" + ("" if self.symmetric else "_asym") + (f"_g{self.group}" if self.group else "")

    def head_format(self):
        """The ``WeightFormat`` of the logits layer: ``head``'s, this one without a ``head``,
        None where ``head`` is ``"float"`` (the layer kept as it is)."""
        if self.head is None:
            return self
        return None if self.head == "float" else weight_format(self.head, activations=self.activations)

    def for_depth(self, k):
        """The format a weight of ``k`` rows takes: this one, or under 4 bits where ``k`` is
        shorter than ``SMALLEST_GROUP`` (e.g. Mamba's ``dt_proj``, K = 16), the 8-bit asymmetric
        backup NNCF also falls back to there.  Such a layer's bytes are few, and one short group
        of 16 levels per column is coarse where a softplus and an exponential follow it."""
        if self.bits == 4 and k < SMALLEST_GROUP:
            return replace(self, bits=8, group=None, symmetric=False, head=None)
        return self

    def nbytes(self, k, n):
        """Bytes of a (K, N) weight in this format (its values, scales and lows; unpadded)."""
        tables = (1 if self.symmetric and self.bits == 8 else 2) * 4 * n * -(-k // (self.group or k))
        return k * n * self.bits // 8 + tables

    def quantize(self, weight):
        """``QuantizedWeight`` of a (K, N) float array."""
        w = np.asarray(weight, dtype=np.float64)
        k, n = w.shape
        group = self.group or k
        rows = -(-k // group) * group
        blocks = np.concatenate([w, np.zeros((rows - k, n))]).reshape(rows // group, group, n)
        top = 2 ** self.bits - 1
        if self.symmetric:
            half = 2 ** (self.bits - 1) - 1                   # 127, 7: zero stays exactly zero
            if self.bits == 4:   # all 16 levels: the group's largest magnitude is -8 (its sign in
                picked = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], 1)[:, 0]
                scale = picked / -(half + 1)                  # the scale), as llama.cpp's Q4_0
            else:                                             # and NNCF's INT4_SYM do
                scale = np.abs(blocks).max(axis=1) / half
            scale[scale == 0] = 1.0
            q = np.clip(np.rint(blocks / scale[:, None]), -half - 1, half)
            offset = 0 if self.bits == 8 and self.group is None else half + 1
            low = None if offset == 0 else -offset * scale
            q = q + offset
        else:
            lo, hi = blocks.min(axis=1), blocks.max(axis=1)
            scale = (hi - lo) / top
            scale[scale == 0] = 1.0
            zero = np.clip(np.rint(-lo / scale), 0, top)
            q = np.clip(np.rint(blocks / scale[:, None]) + zero[:, None], 0, top)
            low = -zero * scale
        q = q.reshape(rows, n)[:k]
        dtype = np.int8 if low is None else np.uint8
        return QuantizedWeight(self, q.astype(dtype), scale.astype(np.float32),
                               None if low is None else low.astype(np.float32))


@dataclass(frozen=True)
class QuantizedWeight:
    """A weight in ``fmt``: ``values`` (K, N) integers, ``scale`` and ``low`` (groups, N)
    float32 (``low`` None for ``int8`` symmetric)."""
    fmt: WeightFormat
    values: np.ndarray
    scale: np.ndarray
    low: np.ndarray | None

    @property
    def group(self):
        return self.fmt.group or self.values.shape[0]

    def dequantize(self):
        """The float64 (K, N) weight this stands for."""
        g = np.arange(self.values.shape[0]) // self.group
        w = self.values.astype(np.float64) * self.scale.astype(np.float64)[g]
        return w if self.low is None else w + self.low.astype(np.float64)[g]

    def packed(self):
        """``values`` in panels of ``PANEL`` columns, each streamed over k: ``(ceil(N / PANEL),
        K, PANEL)`` bytes, and for 4 bits two columns a byte, ``(.., K, PANEL // 2)``: column
        ``c`` of a panel in the low nibble of byte ``c``, column ``c + PANEL // 2`` in its high
        one (a vector of bytes unpacks to two vectors of adjacent columns)."""
        k, n = self.values.shape
        panels = -(-n // PANEL)
        v = np.zeros((k, panels * PANEL), np.uint8)
        v[:, :n] = self.values
        v = v.reshape(k, panels, PANEL).transpose(1, 0, 2)
        if self.fmt.bits == 8:
            return np.ascontiguousarray(v)
        return np.ascontiguousarray(v[..., :PANEL // 2] | (v[..., PANEL // 2:] << 4))

    def unsigned(self):
        """This weight with unsigned values and a ``low``: ``int8`` symmetric's ``q`` as
        ``q + 128`` with ``low = -128 * scale`` (the form the dequantizing kernels read); any
        other format is already so."""
        if self.low is not None:
            return self
        values = (self.values.astype(np.int16) + 128).astype(np.uint8)
        return QuantizedWeight(self.fmt, values, self.scale, (-128 * self.scale).astype(np.float32))

    def padded(self, table):
        """``table`` (scale or low) with its columns padded with zeros to whole panels."""
        n = table.shape[1]
        return np.pad(table, ((0, 0), (0, -n % PANEL)))


def weight_format(spec, head=None, activations=None):
    """The ``WeightFormat`` named ``spec`` (``int8``, ``int8_asym``, ``int4``, ``int4_asym_g32``,
    ...; a ``WeightFormat`` passes through); ``head`` overrides the logits layer's format,
    ``activations`` (``"bfloat16"``) the prefill's activations' precision."""
    if isinstance(spec, WeightFormat):
        fmt = spec
    else:
        match = re.fullmatch(r"int([48])(_sym|_asym)?(?:_g(\d+))?", str(spec))
        group = int(match.group(3)) if match and match.group(3) else None
        if not match or (group is not None and group not in GROUPS) or (match.group(1) == "8" and group):
            raise ValueError(f"weights={spec!r}: the formats are int8 and int8_asym (per output channel), "
                             f"int4 and int4_asym in groups of {'/'.join(map(str, GROUPS))} along K "
                             "(int4_g32, int4_asym_g64, ...; int4 alone: groups of 128, symmetric)")
        bits = int(match.group(1))
        fmt = WeightFormat(bits, group if bits == 8 or group else 128, match.group(2) != "_asym",
                           "int8" if bits == 4 else None)
    if head is not None:
        if head != "float":
            weight_format(head)                      # (a clear error for an unknown one)
        fmt = replace(fmt, head=head)
    if activations is not None:
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations={activations!r}: None keeps the model's; "
                             f"{', '.join(map(repr, ACTIVATIONS))} rounds a prefill's")
        fmt = replace(fmt, activations=activations)
    return fmt
