"""Vectorizable float32 math for the TensorIR kernels (CPU and CUDA).

LLVM lowers ``exp`` to a scalar libm call per element, which would dominate a scan kernel, so
``exp2``, ``exp``, softplus and silu are written here as float32 polynomials (relative error
~2e-7); ``native=True`` gives TVM's intrinsics instead (CUDA has fast ones).
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

LOG2E = 1.4426950408889634
F32 = "float32"
_MAGIC, _MAGIC_BITS = 12582912.0, 0x4B400000  # 1.5 * 2**23: its ulp is 1
_ATANH_SERIES = tuple(1.0 / k for k in (13, 11, 9, 7, 5, 3, 1))  # atanh(s)/s in s**2
# Cephes exp2f: 2**f = 1 + f*P(f) on [-0.5, 0.5]
_EXP2_P = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
           5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1)


def const(v):
    """A float32 immediate."""
    return tirx.const(v, F32)


def let(value, body, name="v"):
    """``body(v)`` with ``v`` bound to ``value`` once: the polynomials below use their argument
    several times, and nested inline copies would grow the IR (and the CUDA source) exponentially."""
    var = tirx.Var(name, value.ty)
    return tirx.Let(var, value, body(var))


def exp2(x):
    """``2**x`` for a float32 expression: ``k = round(x)`` by the magic-number addition (the
    integer lands in the low mantissa bits), ``2**(x-k)`` by a polynomial, ``2**k`` built in
    the exponent bits.  Clamped to [-126, 127] (``2**-126`` stands in for 0 as a decay)."""
    def split(x):
        k = tirx.reinterpret("int32", x + const(_MAGIC)) - _MAGIC_BITS
        return let(x - tirx.Cast(F32, k), lambda f: (const(1.0) + f * _horner(f, _EXP2_P)) *
                   tirx.reinterpret(F32, tirx.shift_left(k + 127, 23)), "f")

    return let(tirx.max(tirx.min(x, const(127.0)), const(-126.0)), split, "x")


def _horner(x, coefs):
    p = const(coefs[0])
    for coef in coefs[1:]:
        p = p * x + const(coef)
    return p


def exp(x, native=False):
    return T.exp(x) if native else exp2(x * const(LOG2E))


def softplus(x, native=False):
    """``log(1 + e**x) = max(x, 0) + log1p(e**-|x|)``.  Polynomial form: log1p(v), v in
    (0, 1], as ``2 atanh(v / (2 + v))`` by its odd series (s <= 1/3, error < 1e-8)."""
    if native:
        return let(x, lambda x: tirx.max(x, const(0.0)) + T.log1p(T.exp(-tirx.abs(x))), "x")

    def series(s):
        return let(s * s, lambda s2: const(2.0) * s * _horner(s2, _ATANH_SERIES), "s2")

    def log1p_exp(v):
        return let(v / (const(2.0) + v), series, "s")

    return let(x, lambda x: tirx.max(x, const(0.0)) + let(exp(-tirx.abs(x)), log1p_exp, "e"), "x")


def silu(z, native=False):
    return let(z, lambda z: z / (const(1.0) + exp(-z, native)), "z")
