"""CPU realization of the fused selective scan (LLVM target).

Every operand has L innermost, so vectorizing along N (or L) would need a transpose at every
step.  Instead a *pack* of ``lanes`` channels of one (batch, group) is scanned together, one
channel per vector lane: B[n, t] and C[n, t] are the same for the whole pack (a broadcast),
the N states of the pack live in a local buffer that LLVM keeps in vector registers (n is
unrolled), and a step costs, per state, one vector exp2 and three multiply-adds.  L is walked
in tiles: the tile's rows of delta (after bias/softplus), delta*u, B and C are staged with
contiguous vector loads, the recurrence runs sequentially over the tile, and the gated output
rows go out as contiguous vector stores.  A pack that overhangs its group clamps to the
group's last channel: that lane recomputes and rewrites the same values (branch-free).  Packs
run in parallel.  Nothing of size (B, D, L, N) is ever materialized.

LLVM lowers ``exp`` to a scalar libm call per element, which would dominate the kernel, so
``exp2``, softplus and silu are written here as vectorizable float32 polynomials (relative
error ~2e-7).  ``last_state`` is written in the input dtype, like ``out``.

A symbolic batch or L is an int64 Var in the argument shapes (``layout.extent_vars``); the
L // tile full tiles run in a loop and the L % tile tail is one more tile whose staging loops
are serial (TVM vectorizes constant extents only); the recurrence stays vectorized across the
pack either way.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import apply
from scanweaver_core.spec import SelectiveScanSpec, static_or

from .layout import buffer_layout, extent_vars

NAME = "selective_cpu"
TARGET = "cpu"
FORM = "selective"

LOG2E = 1.4426950408889634
F32 = "float32"
_MAGIC, _MAGIC_BITS = 12582912.0, 0x4B400000  # 1.5 * 2**23: its ulp is 1
_ATANH_SERIES = tuple(1.0 / k for k in (13, 11, 9, 7, 5, 3, 1))  # atanh(s)/s in s**2
# Cephes exp2f: 2**f = 1 + f*P(f) on [-0.5, 0.5]
_EXP2_P = (1.535336188319500e-4, 1.339887440266574e-3, 9.618437357674640e-3,
           5.550332471162809e-2, 2.402264791363012e-1, 6.931472028550421e-1)


def _c(v):
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
        k = tirx.reinterpret("int32", x + _c(_MAGIC)) - _MAGIC_BITS
        return let(x - tirx.Cast(F32, k), lambda f: (_c(1.0) + f * _horner(f, _EXP2_P)) *
                   tirx.reinterpret(F32, tirx.shift_left(k + 127, 23)), "f")

    return let(tirx.max(tirx.min(x, _c(127.0)), _c(-126.0)), split, "x")


def _horner(x, coefs):
    p = _c(coefs[0])
    for coef in coefs[1:]:
        p = p * x + _c(coef)
    return p


def exp(x, native=False):
    return T.exp(x) if native else exp2(x * _c(LOG2E))


def softplus(x, native=False):
    """``log(1 + e**x) = max(x, 0) + log1p(e**-|x|)``.  Polynomial form: log1p(v), v in
    (0, 1], as ``2 atanh(v / (2 + v))`` by its odd series (s <= 1/3, error < 1e-8)."""
    if native:
        return let(x, lambda x: tirx.max(x, _c(0.0)) + T.log1p(T.exp(-tirx.abs(x))), "x")

    def series(s):
        return let(s * s, lambda s2: _c(2.0) * s * _horner(s2, _ATANH_SERIES), "s2")

    def log1p_exp(v):
        return let(v / (_c(2.0) + v), series, "s")

    return let(x, lambda x: tirx.max(x, _c(0.0)) + let(exp(-tirx.abs(x)), log1p_exp, "e"), "x")


def silu(z, native=False):
    return let(z, lambda z: z / (_c(1.0) + exp(-z, native)), "z")


def extents(spec):
    """``(batch, length)``: ints, or the spec's int64 Vars where symbolic (pass to ``declare``)."""
    resolve = extent_vars(spec)
    return resolve(spec.batch), resolve(spec.length)


def declare(spec, batch, length):
    """The PrimFunc arguments in the README order (``batch``, ``length`` from ``extents``);
    absent options are None."""
    dt, (b, d, l, n) = spec.dtype, (batch, spec.dim, length, spec.dstate)
    bc = (b, spec.groups, n, l) if spec.groups else (b, n, l)
    bufs = {"u": ((b, d, l), dt), "delta": ((b, d, l), dt), "A": ((d, n), F32),
            "B": (bc, dt), "C": (bc, dt),
            "D": ((d,), F32) if spec.has_D else None,
            "z": ((b, d, l), dt) if spec.has_z else None,
            "delta_bias": ((d,), F32) if spec.has_delta_bias else None,
            "h0": ((b, d, n), dt) if spec.has_h0 else None,
            "out": ((b, d, l), dt),
            "last_state": ((b, d, n), dt) if spec.return_last_state else None}
    return {name: (T.arg(name, T.buffer(*sd, layout=buffer_layout(sd[0]))) if sd else None)
            for name, sd in bufs.items()}


def stage_delta(spec, ops, b, d, t, dt, du, native=False):
    """Store delta (after bias and softplus) and delta*u of channel d at step t, in float32,
    into the slots ``dt`` and ``du`` (``(buffer, index)`` pairs).  The input is stored before
    the softplus binds it: TVM's bf16 legalization miscompiles a Let whose value loads bf16."""
    (dbuf, di), (ubuf, ui) = dt, du
    x = tirx.Cast(F32, ops["delta"][b, d, t])
    T.buffer_store(dbuf, x + ops["delta_bias"][d] if spec.has_delta_bias else x, [di])
    if spec.delta_softplus:
        T.buffer_store(dbuf, softplus(dbuf[di], native), [di])
    T.buffer_store(ubuf, dbuf[di] * tirx.Cast(F32, ops["u"][b, d, t]), [ui])


def stage_output(spec, ops, b, d, t, y, scratch, native=False):
    """Turn the slot ``y`` (holding sum_n C*h) into ``(y + D*u) * silu(z)``, in float32;
    ``scratch`` receives z first (same bf16 reason).  Callers then cast y to the input dtype."""
    (ybuf, yi), (sbuf, si) = y, scratch
    if spec.has_D:
        T.buffer_store(ybuf, ybuf[yi] + tirx.Cast(F32, ops["u"][b, d, t]) * ops["D"][d], [yi])
    if spec.has_z:
        T.buffer_store(sbuf, tirx.Cast(F32, ops["z"][b, d, t]), [si])
        T.buffer_store(ybuf, ybuf[yi] * silu(sbuf[si], native), [yi])


def bc_index(spec, b, g, n, t):
    """Index of B/C for group g (ignored without groups)."""
    return (b, g, n, t) if spec.groups else (b, n, t)


def applies(spec):
    return isinstance(spec, SelectiveScanSpec)


def default_config(spec, cores=2):
    """16 channels per pack (an AVX-512 vector, two AVX2 ones: measured best on AVX2 and on
    generic x86-64) when the group has them, else the next power of two; halve while there
    are fewer packs than 2 per core.  Unroll n when N <= 32 (h in registers).  Time tiles of
    64 steps: four cache lines per staged row streams better from DRAM than 32 (the rows of
    a pack are L*4 bytes apart) while the staging (20 KB at N=16) stays in L1.  A symbolic
    batch counts as large."""
    per_group = spec.dim // (spec.groups or 1)
    batch = static_or(spec.batch, 1 << 30)
    lanes = 16
    while lanes > 1 and (lanes // 2 >= per_group or
                         batch * (spec.groups or 1) * -(-per_group // lanes) < 2 * cores):
        lanes //= 2
    return {"lanes": lanes, "tile": 64, "unroll": spec.dstate <= 32}


def generate(spec: SelectiveScanSpec, lanes=16, tile=64, unroll=True):
    """The PrimFunc ``scanweaver_scan`` for ``spec``: parallel packs, sequential in L."""
    groups = spec.groups or 1
    per_group, n_state = spec.dim // groups, spec.dstate
    packs = -(-per_group // lanes)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            batch, length = extents(spec)
            ops = declare(spec, batch, length)
            with T.parallel(0, batch * groups * packs) as lane:
                b, g, p = lane // (groups * packs), lane // packs % groups, lane % packs

                def chan(w):  # the channel of vector lane w, clamped into the group
                    return g * per_group + tirx.min(p * lanes + w, per_group - 1)

                h = T.alloc_buffer((n_state * lanes,), F32, scope="local")
                a2 = T.alloc_buffer((n_state * lanes,), F32, scope="local")
                with T.serial(0, n_state) as n:
                    with T.vectorized(0, lanes) as w:
                        T.buffer_store(a2, ops["A"][chan(w), n] * _c(LOG2E), [n * lanes + w])
                        h0 = tirx.Cast(F32, ops["h0"][b, chan(w), n]) if spec.has_h0 else _c(0.0)
                        T.buffer_store(h, h0, [n * lanes + w])
                # per-tile staging: rows of dt, dt*u, y (one per lane) and of B, C (one per n)
                rows = T.alloc_buffer((3 * lanes * tile,), F32, scope="local")
                bc = T.alloc_buffer((2 * n_state * tile,), F32, scope="local")
                cur = T.alloc_buffer((6 * lanes,), F32, scope="local")
                ctx = (spec, ops, b, g, chan, lanes, tile, unroll, h, a2, rows, bc, cur)
                # full tiles in a loop, then the tail (0..tile-1 steps; PrimExprs when symbolic)
                full, rest = length // tile, length % tile
                if not isinstance(full, int) or full:
                    with T.serial(0, full) as k:
                        _tile(ctx, k * tile, tile)
                if not isinstance(rest, int) or rest:
                    _tile(ctx, full * tile, rest)
                if spec.return_last_state:
                    with T.serial(0, n_state) as n:
                        with T.vectorized(0, lanes) as w:
                            T.buffer_store(ops["last_state"],
                                           tirx.Cast(spec.dtype, h[n * lanes + w]), [b, chan(w), n])
    return ib.get()


def _tile(ctx, t0, size):
    """``size`` steps from ``t0``: stage contiguous rows (vectorized along t; serial for a
    symbolic tail), run the recurrence (vectorized across the pack), write the gated rows."""
    spec, ops, b, g, chan, lanes, tile, unroll, h, a2, rows, bc, cur = ctx
    dt_row, du_row, y_row = 0, lanes * tile, 2 * lanes * tile
    along_t = T.vectorized if isinstance(size, int) else T.serial
    with T.unroll(0, lanes) as w:
        with along_t(0, size) as t:
            stage_delta(spec, ops, b, chan(w), t0 + t, (rows, dt_row + w * tile + t),
                        (rows, du_row + w * tile + t))
    with T.serial(0, spec.dstate) as n:
        with along_t(0, size) as t:
            for i, name in enumerate(("B", "C")):
                T.buffer_store(bc, tirx.Cast(F32, ops[name][bc_index(spec, b, g, n, t0 + t)]),
                               [(i * spec.dstate + n) * tile + t])
    parts = min(4, spec.dstate) if unroll else 1  # y = sum_n C*h as 4 independent chains
    with T.serial(0, size) as t:
        # this step's dt, dt*u (gathered from the rows once) and partial y, as vectors
        with T.vectorized(0, lanes) as w:
            T.buffer_store(cur, rows[dt_row + w * tile + t], [w])
            T.buffer_store(cur, rows[du_row + w * tile + t], [lanes + w])
            for j in range(parts):
                T.buffer_store(cur, _c(0.0), [(2 + j) * lanes + w])
        with (T.unroll if unroll else T.serial)(0, spec.dstate) as n:
            with T.vectorized(0, lanes) as w:
                i, y = n * lanes + w, (2 + n % parts) * lanes + w
                pair = (exp2(cur[w] * a2[i]), cur[lanes + w] * bc[n * tile + t])
                T.buffer_store(h, apply(pair, h[i]), [i])
                T.buffer_store(cur, cur[y] + bc[(spec.dstate + n) * tile + t] * h[i], [y])
        with T.vectorized(0, lanes) as w:
            total = cur[2 * lanes + w]
            for j in range(1, parts):
                total = total + cur[(2 + j) * lanes + w]
            T.buffer_store(rows, total, [y_row + w * tile + t])
    with T.unroll(0, lanes) as w:
        with along_t(0, size) as t:
            y = y_row + w * tile + t
            stage_output(spec, ops, b, chan(w), t0 + t, (rows, y), (rows, du_row + w * tile + t))
            T.buffer_store(ops["out"], tirx.Cast(spec.dtype, rows[y]), [b, chan(w), t0 + t])
