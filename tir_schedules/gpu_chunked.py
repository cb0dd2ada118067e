"""GPU realization for long L and few lanes: L split across blocks (reduce, scan, replay).

When the lanes cannot fill the GPU (B*D small, L long), one block per lane leaves most SMs
idle.  Three kernels in one PrimFunc: (1) one block per (lane, chunk) reduces its chunk to an
aggregate pair with the warp tile scan; (2) one thread per lane scans the chunk aggregates
into the state entering each chunk; (3) one block per (lane, chunk) replays its chunk from
that state with the warp tile scan and writes the states.  Reads a and b twice (5 memory
passes instead of 3) to buy ``chunks`` times more parallelism.
"""
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import AffineScanSpec, static_or

from .gpu_warp import WARP, WarpTileScan, set_pair
from .layout import buffer_layout, build_plain, grid, named

NAME = "chunked"
TARGET = "cuda"
FORM = "affine"


def applies(spec):
    return isinstance(spec, AffineScanSpec)


def default_config(spec, blocks_wanted=264):
    """Enough (lane, chunk) blocks to fill an H100/H200-sized GPU twice over."""
    length = static_or(spec.length, 1 << 20)  # symbolic: as for a long L and many lanes
    lanes = static_or(spec.lanes, blocks_wanted)
    chunks = max(1, min(-(-blocks_wanted // lanes), length // 2048))
    return {"warps": 4, "items": 4, "chunks": chunks}


def generate(spec: AffineScanSpec, warps=4, items=4, chunks=8):
    """The PrimFunc ``scanweaver_scan`` (three kernel launches)."""
    if chunks < 1:
        raise ValueError(f"chunks: {chunks} must be >= 1")

    def body(lay):
        tile = WARP * warps * items
        tiles_per_chunk = ((lay.length + tile - 1) // tile + chunks - 1) // chunks
        chunk_len = tiles_per_chunk * tile
        pairs, entries = (lay.lanes, chunks, 2), (lay.lanes, chunks)
        agg = named("chunk_pairs", T.alloc_buffer(pairs, "float32", layout=buffer_layout(pairs)))
        entry = named("chunk_entry", T.alloc_buffer(entries, "float32", layout=buffer_layout(entries)))

        def per_chunk_kernel(write):
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, grid(lay.lanes * chunks)):
                with T.launch_thread(tx, WARP * warps):
                    lane, chunk = bx // chunks, bx % chunks
                    coords = lay.coords(lane)
                    scan = WarpTileScan(lay, coords, tx, warps, items)
                    acc = named("chunk_acc", T.alloc_buffer((2,), "float32", scope="local"))
                    set_pair(acc, IDENTITY)
                    T.buffer_store(scan.carry, entry[lane, chunk] if write else 0.0, [0])
                    with T.serial(0, tiles_per_chunk) as it:
                        start = chunk * chunk_len + it * tile
                        scan.scan_tile(start, lay.length, write=write)
                        if write:
                            T.buffer_store(scan.carry, apply((scan.total[0], scan.total[1]), scan.carry[0]), [0])
                        else:
                            set_pair(acc, compose((acc[0], acc[1]), (scan.total[0], scan.total[1])))
                    if not write:
                        with T.If(tx == 0):
                            with T.Then():
                                T.buffer_store(agg, acc[0], [lane, chunk, 0])
                                T.buffer_store(agg, acc[1], [lane, chunk, 1])
                    elif lay.last is not None:
                        with T.If((tx == 0) & (chunk == chunks - 1)):
                            with T.Then():
                                lay.store_last(coords, scan.carry[0])

        per_chunk_kernel(write=False)
        # the state entering each chunk: one thread per lane, serial over chunks
        bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
        with T.launch_thread(bx, grid((lay.lanes + WARP - 1) // WARP)):
            with T.launch_thread(tx, WARP):
                lane = bx * WARP + tx
                with T.If(lane < lay.lanes):
                    with T.Then():
                        h = named("h", T.alloc_buffer((1,), "float32", scope="local"))
                        T.buffer_store(h, lay.load_h0(lay.coords(lane)), [0])
                        with T.serial(0, chunks) as c:
                            T.buffer_store(entry, h[0], [lane, c])
                            T.buffer_store(h, apply((agg[lane, c, 0], agg[lane, c, 1]), entry[lane, c]), [0])
        per_chunk_kernel(write=True)

    return build_plain(spec, body)
