"""GPU realization beyond the paper: items per thread, warp shuffles, warp aggregates.

How CUB and Mamba's kernel scan: each thread composes ``items`` consecutive pairs in
registers; a warp scans those thread aggregates with 5 ``shfl_up`` steps (no barrier); warp
totals go through shared memory (one barrier) and every thread composes the totals of the
warps before it; then each thread replays its items from its starting state.  One block per
lane, tiles of ``32*warps*items`` steps with a running carry, so any L works.  Two barriers
per tile instead of the Blelloch tree's 4*log2(tile).
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import AffineScanSpec, static_or

from .layout import build_plain, grid, named

NAME = "warp"
TARGET = "cuda"
FORM = "affine"
WARP = 32


def applies(spec):
    return isinstance(spec, AffineScanSpec)


def default_config(spec):
    """4 warps x 4 items (512-step tiles); smaller tiles for short L."""
    length = static_or(spec.length, 1 << 30)  # symbolic: as for a long L
    warps, items = 4, 4
    while warps > 1 and WARP * warps * items >= 2 * length:
        warps //= 2
    while items > 1 and WARP * warps * items >= 2 * length:
        items //= 2
    return {"warps": warps, "items": items}


def set_pair(buf, pair, offset=0):
    """Store a pair into ``buf[offset:offset+2]``, u first: ``u' = a2*u1 + u2`` reads the old
    ``a`` when ``buf`` is one of the composed operands, ``a' = a2*a1`` does not read ``u``."""
    T.buffer_store(buf, pair[1], [offset + 1])
    T.buffer_store(buf, pair[0], [offset])


def barrier():
    T.evaluate(T.tvm_storage_sync("shared"))


class WarpTileScan:
    """Registers and shared memory of the warp-level tile scan, for one lane per block.

    ``scan_tile(start)`` processes steps [start, start + tile) of the lane whose state enters
    in ``carry[0]``; it leaves the tile total in ``total`` and, with ``write``, stores states.
    """

    def __init__(self, lay, coords, tx, warps, items):
        self.lay, self.coords, self.tx = lay, coords, tx
        self.warps, self.items = warps, items
        self.tile = WARP * warps * items
        self.own = named("own", T.alloc_buffer((2 * items,), "float32", scope="local"))
        self.agg = named("agg", T.alloc_buffer((2,), "float32", scope="local"))
        self.other = named("other", T.alloc_buffer((2,), "float32", scope="local"))
        self.before = named("before", T.alloc_buffer((2,), "float32", scope="local"))
        self.total = named("total", T.alloc_buffer((2,), "float32", scope="local"))
        self.h = named("h", T.alloc_buffer((1,), "float32", scope="local"))
        self.carry = named("carry", T.alloc_buffer((1,), "float32", scope="local"))
        self.warp_pairs = named("warp_pairs", T.alloc_buffer((2 * warps,), "float32", scope="shared"))

    def _step(self, start, k):
        return start + self.tx * self.items + k

    def _shuffle_up(self, delta):
        mask = T.tvm_warp_activemask()
        for i in range(2):
            T.buffer_store(self.other, T.tvm_warp_shuffle_up(mask, self.agg[i], delta, WARP, WARP), [i])

    def scan_tile(self, start, stop, write=True):
        """Scan steps [start, min(start+tile, stop)) from ``carry``; ``stop`` pads with IDENTITY."""
        lay, own, agg, other = self.lay, self.own, self.agg, self.other
        one, zero = (tirx.const(v, "float32") for v in IDENTITY)
        lane_in_warp, warp = self.tx % WARP, self.tx // WARP
        # 1. this thread's items, composed in registers
        for k in range(self.items):
            step = self._step(start, k)
            a, b = lay.load_pair(self.coords, lay.time(step))
            set_pair(own, (T.if_then_else(step < stop, a, one), T.if_then_else(step < stop, b, zero)), 2 * k)
        set_pair(agg, (own[0], own[1]))
        for k in range(1, self.items):
            set_pair(agg, compose((agg[0], agg[1]), (own[2 * k], own[2 * k + 1])))
        # 2. inclusive warp scan of the thread aggregates
        for d in range(5):
            self._shuffle_up(1 << d)
            with T.If(lane_in_warp >= (1 << d)):
                with T.Then():
                    set_pair(agg, compose((other[0], other[1]), (agg[0], agg[1])))
        with T.If(lane_in_warp == WARP - 1):
            with T.Then():
                set_pair(self.warp_pairs, (agg[0], agg[1]), 2 * warp)
        self._shuffle_up(1)  # exclusive prefix within the warp
        barrier()
        # 3. every thread composes the totals of the warps before its own, and the tile total
        wp = self.warp_pairs
        set_pair(self.before, (one, zero))
        set_pair(self.total, (one, zero))
        for w in range(self.warps):
            pair = (wp[2 * w], wp[2 * w + 1])
            before = compose((self.before[0], self.before[1]), pair)
            set_pair(self.before, (T.if_then_else(w < warp, before[0], self.before[0]),
                                   T.if_then_else(w < warp, before[1], self.before[1])))
            set_pair(self.total, compose((self.total[0], self.total[1]), pair))
        # 4. replay this thread's items from its starting state
        if write:
            with T.If(lane_in_warp > 0):
                with T.Then():
                    set_pair(self.before, compose((self.before[0], self.before[1]), (other[0], other[1])))
            T.buffer_store(self.h, apply((self.before[0], self.before[1]), self.carry[0]), [0])
            for k in range(self.items):
                step = self._step(start, k)
                T.buffer_store(self.h, apply((own[2 * k], own[2 * k + 1]), self.h[0]), [0])
                with T.If(step < stop):
                    with T.Then():
                        lay.store_state(self.coords, lay.time(step), self.h[0])
        barrier()  # warp_pairs is rewritten by the next tile


def generate(spec: AffineScanSpec, warps=4, items=4):
    """The PrimFunc ``scanweaver_scan``: one block of ``32*warps`` threads per lane."""
    if not 1 <= warps <= 32 or not 1 <= items <= 16:
        raise ValueError(f"warps={warps}, items={items}: need 1 <= warps <= 32, 1 <= items <= 16")

    def body(lay):
        bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
        with T.launch_thread(bx, grid(lay.lanes)):
            with T.launch_thread(tx, WARP * warps):
                named("lane", bx)
                named("tx", tx)
                coords = lay.coords(bx)
                scan = WarpTileScan(lay, coords, tx, warps, items)
                T.buffer_store(scan.carry, lay.load_h0(coords), [0])
                n_tiles = (lay.length + scan.tile - 1) // scan.tile
                with T.serial(0, n_tiles) as it:
                    named("tile", it)
                    scan.scan_tile(it * scan.tile, lay.length)
                    T.buffer_store(scan.carry, apply((scan.total[0], scan.total[1]), scan.carry[0]), [0])
                if lay.last is not None:
                    with T.If(tx == 0):
                        with T.Then():
                            lay.store_last(coords, scan.carry[0])

    return build_plain(spec, body)
