"""CPU realization of the plain affine scan (LLVM target).

Sequential along L inside a lane is already work-optimal on a CPU; what matters is that the
multiply-add chain never stalls and memory streams.  So lanes are processed in groups of
``group`` lanes per step: when the axis is not innermost the group is contiguous in memory and
the step is one vector instruction; when L is innermost the group is ``group`` interleaved
rows (unrolled, independent chains, each row's cache line reused for 16 steps).  (Tiling
rows through a transposed block for vector loads was tried and measured slower on Zen 3:
the in-register transposes cost more than the strided scalar loads.)  Groups run in
parallel across cores.  When lanes are too few to keep the cores busy, L is cut into ``chunks``:
each chunk's aggregate pair is composed first (in parallel), the chunk carries are scanned, and
the chunks are replayed from their carries (in parallel): 5 passes over memory instead of 3,
but every core works.
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import AffineScanSpec, static_or

from .layout import buffer_layout, build_plain, named

NAME = "cpu"
TARGET = "cpu"
FORM = "affine"


def applies(spec):
    return isinstance(spec, AffineScanSpec)


def default_config(spec, cores=2):
    """Vector groups over a contiguous inner axis, 4 interleaved rows otherwise (4 FMA chains
    hide the latency; more rows of a power-of-two L thrash L1 sets, measured on Zen 3);
    chunk L only when there are fewer groups than 2 per core and L is long.  A symbolic extent
    counts as large; a symbolic inner extent gets 4 interleaved rows (no divisor is known)."""
    inner = spec.inner
    if inner is None:
        group = 4
    else:
        group = next((v for v in (16, 8, 4, 2) if inner % v == 0), 1) if inner > 1 else 4
    lanes = static_or(spec.lanes, 1 << 30)
    group = min(group, lanes) if inner == 1 else group
    groups = -(-lanes // group)
    length = static_or(spec.length, 1 << 30)
    chunks = 1
    if groups < 2 * cores and length >= 4096:
        chunks = min(64, max(2, (4 * cores) // groups))
    return {"group": group, "chunks": chunks}


def generate(spec: AffineScanSpec, group=4, chunks=1):
    """The scheduled PrimFunc ``scanweaver_scan`` for ``spec``."""
    return build_plain(spec, lambda lay: _chunked(lay, group, chunks) if chunks > 1 else _lanes(lay, group))


def _group_loop(lay, group):
    """Loop over lanes within a group: vectorized when contiguous (a static inner extent > 1),
    unrolled rows otherwise (also for a symbolic inner extent)."""
    contiguous = isinstance(lay.inner_extent, int) and lay.inner_extent > 1
    return T.vectorized(0, group) if contiguous else T.unroll(0, group)


def _lane(lay, group, g, k):
    # Interleaved rows may overhang the lane count: clamp (the last lane is recomputed and
    # rewritten with the same values by the same thread, which is harmless and branch-free).
    lane = g * group + k
    return lane if lay.divisible(group) else tirx.min(lane, lay.lanes - 1)


def _run_steps(lay, group, g, h, start, stop, write):
    """``h[k] = a*h[k] + b`` over steps [start, stop), optionally writing states."""
    with T.serial(start, stop) as s:
        named("step", s)
        with _group_loop(lay, group) as k:
            named("k", k)
            coords = lay.coords(_lane(lay, group, g, k))
            t = lay.time(s)
            T.buffer_store(h, apply(lay.load_pair(coords, t), h[k]), [k])
            if write:
                lay.store_state(coords, t, h[k])


def _lanes(lay, group):
    n_groups = (lay.lanes + group - 1) // group
    with T.parallel(0, n_groups) as g:
        named("group", g)
        h = named("h", T.alloc_buffer((group,), "float32", scope="local"))
        with _group_loop(lay, group) as k:
            T.buffer_store(h, lay.load_h0(lay.coords(_lane(lay, group, g, k))), [k])
        _run_steps(lay, group, g, h, 0, lay.length, True)
        if lay.last is not None:
            with _group_loop(lay, group) as k:
                lay.store_last(lay.coords(_lane(lay, group, g, k)), h[k])


def _chunked(lay, group, chunks):
    n_groups = (lay.lanes + group - 1) // group
    size = (lay.length + chunks - 1) // chunks

    def bounds(c):
        return tirx.min(c * size, lay.length), tirx.min((c + 1) * size, lay.length)

    shape = (n_groups, chunks, group)
    agg_a = named("chunk_a", T.alloc_buffer(shape, "float32", layout=buffer_layout(shape)))
    agg_u = named("chunk_u", T.alloc_buffer(shape, "float32", layout=buffer_layout(shape)))
    # 1. each chunk's aggregate pair, composed from the identity
    with T.parallel(0, n_groups * chunks) as gc:
        g, c = gc // chunks, gc % chunks
        pa = named("pa", T.alloc_buffer((group,), "float32", scope="local"))
        pu = named("pu", T.alloc_buffer((group,), "float32", scope="local"))
        with _group_loop(lay, group) as k:
            T.buffer_store(pa, tirx.const(IDENTITY[0], "float32"), [k])
            T.buffer_store(pu, tirx.const(IDENTITY[1], "float32"), [k])
        lo, hi = bounds(c)
        with T.serial(lo, hi) as s:
            with _group_loop(lay, group) as k:
                pair = lay.load_pair(lay.coords(_lane(lay, group, g, k)), lay.time(s))
                na, nu = compose((pa[k], pu[k]), pair)
                T.buffer_store(pa, na, [k])
                T.buffer_store(pu, nu, [k])
        with _group_loop(lay, group) as k:
            T.buffer_store(agg_a, pa[k], [g, c, k])
            T.buffer_store(agg_u, pu[k], [g, c, k])
    # 2. carries: the state entering each chunk, serial over chunks
    carry_in = named("carry_in", T.alloc_buffer(shape, "float32", layout=buffer_layout(shape)))
    with T.parallel(0, n_groups) as g:
        h = named("carry", T.alloc_buffer((group,), "float32", scope="local"))
        with _group_loop(lay, group) as k:
            T.buffer_store(h, lay.load_h0(lay.coords(_lane(lay, group, g, k))), [k])
        with T.serial(0, chunks) as c:
            with _group_loop(lay, group) as k:
                T.buffer_store(carry_in, h[k], [g, c, k])
                T.buffer_store(h, apply((agg_a[g, c, k], agg_u[g, c, k]), carry_in[g, c, k]), [k])
    # 3. replay every chunk from its carry, writing states
    with T.parallel(0, n_groups * chunks) as gc:
        g, c = gc // chunks, gc % chunks
        h = named("h", T.alloc_buffer((group,), "float32", scope="local"))
        with _group_loop(lay, group) as k:
            T.buffer_store(h, carry_in[g, c, k], [k])
        lo, hi = bounds(c)
        _run_steps(lay, group, g, h, lo, hi, lay.states is not None)
        if lay.last is not None:
            with T.If(c == chunks - 1):
                with T.Then():
                    with _group_loop(lay, group) as k:
                        lay.store_last(lay.coords(_lane(lay, group, g, k)), h[k])
