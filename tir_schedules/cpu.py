"""CPU realization of the plain affine scan (LLVM target).

Sequential along L inside a lane is already work-optimal on a CPU; what matters is that the
multiply-add chain never stalls and memory streams.  So lanes are processed in groups of
``group`` lanes per step: when the axis is not innermost the group is contiguous in memory and
the step is one vector instruction; when L is innermost the group is ``group`` interleaved
rows (unrolled, independent chains, each row's cache line reused for 16 steps).  Groups run in
parallel across cores.  When lanes are too few to keep the cores busy, L is cut into ``chunks``:
each chunk's aggregate pair is composed first (in parallel), the chunk carries are scanned, and
the chunks are replayed from their carries (in parallel): 5 passes over memory instead of 3,
but every core works.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_tvm.algebra import IDENTITY, apply, compose
from scanweaver_tvm.spec import AffineScanSpec

from .layout import ScanLayout, named

NAME = "cpu"
TARGET = "cpu"
FORM = "affine"


def applies(spec):
    return isinstance(spec, AffineScanSpec)


def default_config(spec, cores=2):
    """Vector groups over a contiguous inner axis, 8 interleaved rows otherwise; chunk L
    only when there are fewer groups than 2 per core and L is long."""
    inner = spec.inner
    group = next((v for v in (16, 8, 4, 2) if inner % v == 0), 1) if inner > 1 else 8
    group = min(group, spec.lanes) if inner == 1 else group
    groups = -(-spec.lanes // group)
    length = spec.length or 0
    chunks = 1
    if groups < 2 * cores and length >= 4096:
        chunks = min(64, max(2, (4 * cores) // groups))
    return {"group": group, "chunks": chunks, "block": 16 if inner == 1 else 1}


def generate(spec: AffineScanSpec, group=8, chunks=1, block=16):
    """The scheduled PrimFunc ``scanweaver_scan`` for ``spec``."""
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            lay = ScanLayout(spec)
            lay.declare_views()
            if chunks > 1:
                _chunked(lay, group, chunks, block)
            else:
                _lanes(lay, group, block)
    return ib.get()


def _group_loop(lay, group):
    """Loop over lanes within a group: vectorized when contiguous, unrolled rows otherwise."""
    return T.vectorized(0, group) if lay.inner_extent > 1 else T.unroll(0, group)


def _lane(lay, group, g, k):
    # Interleaved rows may overhang the lane count: clamp (the last lane is recomputed and
    # rewritten with the same values by the same thread, which is harmless and branch-free).
    lane = g * group + k
    return lane if lay.lanes % group == 0 else tirx.min(lane, lay.lanes - 1)


def _run_steps(lay, group, g, h, start, stop, write, block=1):
    """``h[k] = a*h[k] + b`` over steps [start, stop), optionally writing states.

    With ``block > 1`` (rows contiguous in L) the steps go in blocks of ``block``: each row's
    block is loaded and stored with vector instructions through a small tile in registers/L1,
    and the interleaved chains run on the tile.  Rows of a power-of-two L are 4 KiB apart, so
    the plain interleaved loop keeps 3*group streams in the same L1 sets; whole-line tile
    accesses avoid those conflict misses.
    """
    if block > 1 and lay.inner_extent == 1:
        full = (stop - start) // block
        with T.serial(0, full) as blk:
            named("block", blk)
            _run_block(lay, group, g, h, start + blk * block, block, write)
        start = start + full * block
    with T.serial(start, stop) as s:
        named("step", s)
        with _group_loop(lay, group) as k:
            named("k", k)
            coords = lay.coords(_lane(lay, group, g, k))
            t = lay.time(s)
            T.buffer_store(h, apply(lay.load_pair(coords, t), h[k]), [k])
            if write:
                lay.store_state(coords, t, h[k])


def _run_block(lay, group, g, h, first_step, block, write):
    """Steps [first_step, first_step + block) of ``group`` rows through a tile."""
    reverse = lay.spec.reverse
    t0 = lay.length - first_step - block if reverse else first_step  # lowest time in the block
    ta = named("tile_a", T.alloc_buffer((group, block), "float32", scope="local"))
    tb = named("tile_b", T.alloc_buffer((group, block), "float32", scope="local"))
    rows = [lay.coords(_lane(lay, group, g, k)) for k in range(group)]
    for k in range(group):
        with T.vectorized(0, block) as j:
            a, b = lay.load_pair(rows[k], t0 + j)
            T.buffer_store(ta, a, [k, j])
            T.buffer_store(tb, b, [k, j])
    with T.serial(0, block) as j:
        jj = block - 1 - j if reverse else j
        with T.unroll(0, group) as k:
            T.buffer_store(h, apply((ta[k, jj], tb[k, jj]), h[k]), [k])
            T.buffer_store(tb, h[k], [k, jj])
    if write:
        for k in range(group):
            with T.vectorized(0, block) as j:
                lay.store_state(rows[k], t0 + j, tb[k, j])


def _lanes(lay, group, block):
    n_groups = -(-lay.lanes // group)
    with T.parallel(0, n_groups) as g:
        named("group", g)
        h = named("h", T.alloc_buffer((group,), "float32", scope="local"))
        with _group_loop(lay, group) as k:
            T.buffer_store(h, lay.load_h0(lay.coords(_lane(lay, group, g, k))), [k])
        _run_steps(lay, group, g, h, 0, lay.length, True, block)
        if lay.last is not None:
            with _group_loop(lay, group) as k:
                lay.store_last(lay.coords(_lane(lay, group, g, k)), h[k])


def _chunked(lay, group, chunks, block):
    n_groups = -(-lay.lanes // group)
    size = (lay.length + chunks - 1) // chunks

    def bounds(c):
        return tirx.min(c * size, lay.length), tirx.min((c + 1) * size, lay.length)

    agg_a = named("chunk_a", T.alloc_buffer((n_groups, chunks, group), "float32"))
    agg_u = named("chunk_u", T.alloc_buffer((n_groups, chunks, group), "float32"))
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
    carry_in = named("carry_in", T.alloc_buffer((n_groups, chunks, group), "float32"))
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
        _run_steps(lay, group, g, h, lo, hi, lay.states is not None, block)
        if lay.last is not None:
            with T.If(c == chunks - 1):
                with T.Then():
                    with _group_loop(lay, group) as k:
                        lay.store_last(lay.coords(_lane(lay, group, g, k)), h[k])
