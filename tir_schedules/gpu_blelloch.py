"""GPU realization: the paper's Blelloch schedule on affine pairs in shared memory.

One thread block per lane.  The lane's sequence is cut into tiles of ``2*threads`` steps; each
tile's pairs are staged in ``shared`` scope (padded with the identity pair past L), then
upsweep (reduce to the root), root initialization (the tile total is kept, the root becomes
the identity), downsweep (every slot gets its exclusive prefix), and affine-prefix
reconstruction: ``h_t = apply(compose(prefix_t, pair_t), carry)``.  The carry runs across
tiles, so any L works.  Work-efficient (O(L) composes) with O(log tile) barriers per tile.
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import AffineScanSpec, static_or

from .layout import build_plain, grid, named

NAME = "blelloch"
TARGET = "cuda"
FORM = "affine"


def applies(spec):
    return isinstance(spec, AffineScanSpec)


def default_config(spec):
    """128 threads (a 256-step tile), fewer when L is short so the tile does not overhang."""
    length = static_or(spec.length, 1 << 30)  # symbolic: as for a long L
    threads = 32
    while threads < 128 and 2 * threads < length:
        threads *= 2
    return {"threads": threads}


def _barrier():
    T.evaluate(T.tvm_storage_sync("shared"))


def _tree_level(sa, su, node, tx, active, stride, up):
    """One level of the tree.  Reads go to registers, a barrier, then the writes: TVM's sync
    planner cannot prove that threads touch disjoint slots, and would otherwise demand a
    barrier inside the (thread-dependent) branch."""
    left = stride * (2 * tx + 1) - 1
    right = left + stride
    with T.If(active):
        with T.Then():
            for i, x in enumerate((sa[left], su[left], sa[right], su[right])):
                T.buffer_store(node, x, [i])
    _barrier()
    left_pair, right_pair = (node[0], node[1]), (node[2], node[3])
    with T.If(active):
        with T.Then():
            if up:
                new_right = compose(left_pair, right_pair)
            else:
                new_right = compose(right_pair, left_pair)
                T.buffer_store(sa, node[2], [left])
                T.buffer_store(su, node[3], [left])
            T.buffer_store(sa, new_right[0], [right])
            T.buffer_store(su, new_right[1], [right])
    _barrier()


def generate(spec: AffineScanSpec, threads=128):
    """The PrimFunc ``scanweaver_scan``; ``threads`` must be a power of two."""
    if threads & (threads - 1) or not 1 <= threads <= 1024:
        raise ValueError(f"threads: {threads} must be a power of two <= 1024")
    tile = 2 * threads
    levels = tile.bit_length() - 1
    one, zero = (tirx.const(v, "float32") for v in IDENTITY)

    def body(lay):
        n_tiles = (lay.length + tile - 1) // tile
        bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
        with T.launch_thread(bx, grid(lay.lanes)):
            with T.launch_thread(tx, threads):
                named("lane", bx)
                named("tx", tx)
                coords = lay.coords(bx)
                sa = named("shared_a", T.alloc_buffer((tile,), "float32", scope="shared"))
                su = named("shared_u", T.alloc_buffer((tile,), "float32", scope="shared"))
                own_a = named("own_a", T.alloc_buffer((2,), "float32", scope="local"))
                own_u = named("own_u", T.alloc_buffer((2,), "float32", scope="local"))
                total = named("total", T.alloc_buffer((2,), "float32", scope="local"))
                node = named("node", T.alloc_buffer((4,), "float32", scope="local"))
                carry = named("carry", T.alloc_buffer((1,), "float32", scope="local"))
                T.buffer_store(carry, lay.load_h0(coords), [0])
                with T.serial(0, n_tiles) as it:
                    named("tile", it)
                    # stage: thread tx owns slots tx and tx + threads (coalesced loads)
                    with T.unroll(0, 2) as j:
                        slot = tx + j * threads
                        step = it * tile + slot
                        pair = lay.load_pair(coords, lay.time(step))
                        T.buffer_store(own_a, T.if_then_else(step < lay.length, pair[0], one), [j])
                        T.buffer_store(own_u, T.if_then_else(step < lay.length, pair[1], zero), [j])
                        T.buffer_store(sa, own_a[j], [slot])
                        T.buffer_store(su, own_u[j], [slot])
                    _barrier()
                    # upsweep: slot right <- compose(left, right) up the tree
                    for d in range(levels):
                        _tree_level(sa, su, node, tx, tx < (tile >> (d + 1)), 1 << d, up=True)
                    # root: keep the tile total, then clear the root to the identity
                    T.buffer_store(total, sa[tile - 1], [0])
                    T.buffer_store(total, su[tile - 1], [1])
                    _barrier()
                    with T.If(tx == 0):
                        with T.Then():
                            T.buffer_store(sa, one, [tile - 1])
                            T.buffer_store(su, zero, [tile - 1])
                    _barrier()
                    # downsweep: left <- parent's prefix, right <- compose(parent, old left)
                    for d in reversed(range(levels)):
                        _tree_level(sa, su, node, tx, tx < (tile >> (d + 1)), 1 << d, up=False)
                    # reconstruction: inclusive prefix of each owned slot, applied to the carry
                    with T.unroll(0, 2) as j:
                        slot = tx + j * threads
                        step = it * tile + slot
                        incl = compose((sa[slot], su[slot]), (own_a[j], own_u[j]))
                        with T.If(step < lay.length):
                            with T.Then():
                                lay.store_state(coords, lay.time(step), apply(incl, carry[0]))
                    T.buffer_store(carry, apply((total[0], total[1]), carry[0]), [0])
                    _barrier()
                if lay.last is not None:
                    with T.If(tx == 0):
                        with T.Then():
                            lay.store_last(coords, carry[0])

    return build_plain(spec, body)
