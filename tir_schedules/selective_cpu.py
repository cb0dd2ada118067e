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
``exp2``, softplus and silu are vectorizable float32 polynomials (``fast_math.py``).
``last_state`` is written in the input dtype, like ``out``.

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

from .fast_math import F32, LOG2E, const as _c, exp2
from .selective_staging import bc_index, declare, extents, stage_delta, stage_output

NAME = "selective_cpu"
TARGET = "cpu"
FORM = "selective"

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
