"""CUDA realization of the fused selective scan (Mamba's forward kernel, in TensorIR).

One thread block per (batch, channel); L is cut into tiles of ``threads * items`` steps.  Per
tile each thread loads its ``items`` consecutive steps of delta (after bias/softplus) and
delta*u into registers once, then for every state n:
  1. builds its pairs ``(exp(delta*A[n]), delta*u*B[n,t])`` on the fly (padding past L with
     IDENTITY) and composes them in registers;
  2. scans the thread aggregates across the warp with 5 ``shfl_up`` steps; the exclusive
     prefix within the warp is one more ``shfl_up``; warp totals go to shared memory;
  3. after one barrier, applies the carry of state n (the state entering the tile, in shared
     memory) and the totals of the warps before its own, then replays its items, adding
     ``C[n,t] * h_t`` into the per-item output accumulators.
Finally each thread gates its items, ``(y + D*u) * silu(z)``, and stores them.  So the N
states never leave registers/shared memory and nothing of size (B,D,L,N) exists.

One barrier per (tile, n): the warp totals are double-buffered by the parity of the
iteration, the carries by the parity of the tile, so a slow thread never reads a slot that
a fast one already rewrote.  ``last_state`` is written in the input dtype, like ``out``.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import IDENTITY, apply, compose
from scanweaver_core.spec import SelectiveScanSpec, static_or

from .gpu_warp import barrier, set_pair
from .layout import grid
from .fast_math import F32, LOG2E
from .selective_staging import bc_index, declare, extents, stage_delta, stage_output

NAME = "selective_gpu"
TARGET = "cuda"
FORM = "selective"
WARP = 32


def applies(spec):
    return isinstance(spec, SelectiveScanSpec)


def default_config(spec):
    """4 warps x 8 items (1024-step tiles, Mamba-like); fewer warps/items for short L (a
    symbolic L counts as long)."""
    warps, items = 4, 8
    length = static_or(spec.length, 1 << 30)
    while warps > 1 and WARP * warps * items >= 2 * length:
        warps //= 2
    while items > 1 and WARP * warps * items >= 2 * length:
        items //= 2
    return {"warps": warps, "items": items}


def generate(spec: SelectiveScanSpec, warps=4, items=8):
    """The PrimFunc ``scanweaver_scan``: one block of ``32*warps`` threads per (batch, channel)."""
    if not 1 <= warps <= 32 or not 1 <= items <= 16:
        raise ValueError(f"warps={warps}, items={items}: need 1 <= warps <= 32, 1 <= items <= 16")
    threads, n_state = WARP * warps, spec.dstate
    tile = threads * items
    zero = tirx.const(IDENTITY[1], F32)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            batch, length = extents(spec)   # ints, or int64 Vars where symbolic
            n_tiles = (length + tile - 1) // tile
            ops = declare(spec, batch, length)
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, grid(batch * spec.dim)):
                with T.launch_thread(tx, threads):
                    b, d = bx // spec.dim, bx % spec.dim
                    g = d // (spec.dim // spec.groups) if spec.groups else 0
                    lane, warp = tx % WARP, tx // WARP
                    # shared: warp totals [parity][warp][a, u]; carries [parity][n]
                    totals = T.alloc_buffer((2 * warps * 2,), F32, scope="shared")
                    carry = T.alloc_buffer((2 * n_state,), F32, scope="shared")
                    # registers: per item dt, dt*u, y and the pair of state n; scan scratch
                    sizes = (items, items, items, 2 * items, 2, 2, 1)
                    dt, du, y, own, agg, other, h = (T.alloc_buffer((size,), F32, scope="local")
                                                     for size in sizes)

                    def each_state(body):  # threads stride over n (N may exceed the block)
                        with T.serial(0, -(-n_state // threads)) as i:
                            n = i * threads + tx
                            with T.If(n < n_state):
                                with T.Then():
                                    body(n)

                    each_state(lambda n: T.buffer_store(
                        carry, tirx.Cast(F32, ops["h0"][b, d, n]) if spec.has_h0 else zero, [n]))
                    with T.serial(0, n_tiles) as c:
                        steps = [c * tile + tx * items + k for k in range(items)]
                        # clamped index for loads; steps past L are padded with IDENTITY
                        at = [tirx.min(t, length - 1) for t in steps]
                        for k in range(items):
                            stage_delta(spec, ops, b, d, at[k], (dt, k), (du, k), native=True)
                            T.buffer_store(y, zero, [k])
                        with T.serial(0, n_state) as n:
                            par = (c * n_state + n) % 2
                            _state(spec, ops, b, d, g, n, par, c % 2, steps, at, length, locals_=(
                                dt, du, y, own, agg, other, h), shared=(totals, carry),
                                lane=lane, warp=warp, warps=warps, tx=tx)
                        for k in range(items):
                            with T.If(steps[k] < length):
                                with T.Then():
                                    stage_output(spec, ops, b, d, steps[k], (y, k), (du, k), True)
                                    T.buffer_store(ops["out"], tirx.Cast(spec.dtype, y[k]),
                                                   [b, d, steps[k]])
                    if spec.return_last_state:
                        barrier()
                        each_state(lambda n: T.buffer_store(
                            ops["last_state"], tirx.Cast(spec.dtype, carry[(n_tiles % 2) * n_state + n]),
                            [b, d, n]))
    return ib.get()


def _state(spec, ops, b, d, g, n, par, cpar, steps, at, length, locals_, shared, lane, warp, warps, tx):
    """One state n of one tile: pairs, warp scan, one barrier, carry + replay into y."""
    dt, du, y, own, agg, other, h = locals_
    totals, carry = shared
    n_state, items = spec.dstate, len(steps)
    one, zero = (tirx.const(v, F32) for v in IDENTITY)
    # 1. this thread's pairs, composed in registers
    a_n = ops["A"][d, n] * tirx.const(LOG2E, F32)
    for k in range(items):
        valid = steps[k] < length
        bk = tirx.Cast(F32, ops["B"][bc_index(spec, b, g, n, at[k])])
        set_pair(own, (T.if_then_else(valid, T.exp2(dt[k] * a_n), one),
                       T.if_then_else(valid, du[k] * bk, zero)), 2 * k)
    set_pair(agg, (own[0], own[1]))
    for k in range(1, items):
        set_pair(agg, compose((agg[0], agg[1]), (own[2 * k], own[2 * k + 1])))
    # 2. inclusive warp scan of the thread aggregates, then the exclusive prefix
    mask = T.tvm_warp_activemask()
    for s in range(5):
        for i in range(2):
            T.buffer_store(other, T.tvm_warp_shuffle_up(mask, agg[i], 1 << s, WARP, WARP), [i])
        with T.If(lane >= (1 << s)):
            with T.Then():
                set_pair(agg, compose((other[0], other[1]), (agg[0], agg[1])))
    with T.If(lane == WARP - 1):
        with T.Then():
            set_pair(totals, (agg[0], agg[1]), (par * warps + warp) * 2)
    for i in range(2):
        T.buffer_store(other, T.tvm_warp_shuffle_up(mask, agg[i], 1, WARP, WARP), [i])
    barrier()
    # 3. the state entering this thread: carry, then the warps before, then the lanes before
    T.buffer_store(h, carry[cpar * n_state + n], [0])
    for w in range(warps):
        j = (par * warps + w) * 2
        T.buffer_store(h, T.if_then_else(w < warp, apply((totals[j], totals[j + 1]), h[0]), h[0]), [0])
    with T.If(lane > 0):
        with T.Then():
            T.buffer_store(h, apply((other[0], other[1]), h[0]), [0])
    for k in range(items):
        T.buffer_store(h, apply((own[2 * k], own[2 * k + 1]), h[0]), [0])
        T.buffer_store(y, y[k] + tirx.Cast(F32, ops["C"][bc_index(spec, b, g, n, at[k])]) * h[0], [k])
    # 4. the last thread holds the tile's final state: the next tile's carry
    with T.If(tx == warps * WARP - 1):
        with T.Then():
            T.buffer_store(carry, h[0], [(1 - cpar) * n_state + n])
