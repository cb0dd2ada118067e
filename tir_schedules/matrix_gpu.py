"""CUDA realization of the matrix-state scan (``MatrixScanSpec``: GLA, retention, Mamba-2).

One thread block per (batch, head, tile of ``v_tile`` state columns); the state never leaves
the chip.  Thread ``tx = j * v_tile + c`` owns column ``v0 + c`` and the rows
``i * col_threads + j`` (``rows = ceil(K / col_threads)`` float32 registers; rows past K are
zero padding).  Rows are interleaved, not blocked, so the ``col_threads`` threads of a column
read consecutive shared words (no bank conflicts) and lanes of one j read one word (broadcast).

L is walked in tiles of ``t_tile`` steps.  Per tile:
  1. the operands of the tile (q, k rows of K, the block's v/g columns, converted to float32
     and padded with the identity, q = k = v = 0, g = 1, past L) go from registers to shared;
  2. barrier; the *next* tile's operands (if any) are loaded into registers (software
     pipelining: the global latency hides behind this tile's compute, which is all the latency
     hiding there is with the few blocks a head count gives);
  3. each step updates the thread's registers ``S = g * S + k v`` and stores its partial
     readout ``sum_i q[r_i] S[i]`` to shared (one word per thread per step);
  4. barrier; the ``t_tile * v_tile`` outputs are summed over the ``col_threads`` partials of
     their column (a fixed order, so both emulation orders agree) and stored, coalesced along v.
Two barriers per tile; the partials' reads (4) and the next tile's writes (3) are separated by
the next tile's first barrier, so one shared buffer of each suffices.  Padding steps sit at the
end of the processing order (the identity keeps S), so ``last`` is S after the loop.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MatrixScanSpec, static_or

from .gpu_warp import barrier
from .layout import buffer_layout, extent_vars, from_f32, grid, to_f32

NAME = "matrix_gpu"
TARGET = "cuda"
FORM = "matrix"
F32 = "float32"
SMS = 132                   # H100/H200 SMs: the grid should nearly fill one wave
V_TILE = 8                  # columns per block: each staged q/k row serves 8 columns
PREFETCH_REGS = 64          # registers per thread holding the next tile's operands
SHARED_BYTES = 32 * 1024    # leaves room under the 48 KiB static limit (and for 2+ blocks/SM)


def applies(spec):
    return isinstance(spec, MatrixScanSpec)


def _ceil(a, b):
    return -(-a // b)


def _widths(spec, col_threads, v_tile):
    """Staged floats per step of each operand: q, k (K padded to the row interleave), v, g."""
    kp = _ceil(spec.key, col_threads) * col_threads
    g = {"none": 0, "scalar": 1, "key": kp, "value": v_tile}[spec.decay]
    return {"q": kp, "k": kp, "v": v_tile, "g": g}


def footprint(spec, v_tile, col_threads, t_tile):
    """``(prefetch registers per thread, static shared bytes)`` of a config."""
    threads = v_tile * col_threads
    items = sum(_ceil(t_tile * w, threads) for w in _widths(spec, col_threads, v_tile).values() if w)
    return items, 4 * threads * (items + t_tile)


def default_config(spec):
    """~8 state rows per thread (``col_threads`` a power of two <= 32) and 8 columns per block,
    fewer while doubling the grid would still fit one wave of an H100/H200 (B=1, H=16, K=V=64:
    8 x 8 threads, 128 blocks; Mamba-2's H=24, K=128: 8 x 16 threads, 192 blocks); the time tile
    is the largest power of two <= 64 within the prefetch-register and shared budgets and below
    2L (a symbolic extent counts as large)."""
    col_threads = min(32, 1 << max(0, _ceil(spec.key, 8) - 1).bit_length())
    v_tile = min(spec.value, V_TILE)
    heads = static_or(spec.batch, 1 << 20) * spec.heads

    def blocks(vt):
        return heads * _ceil(spec.value, vt)

    while v_tile > 1 and v_tile * col_threads > 32 and 2 * blocks(v_tile) <= SMS:
        v_tile //= 2
    t_tile, length = 64, static_or(spec.length, 1 << 30)
    while t_tile > 1 and (t_tile >= 2 * length or any(
            x > limit for x, limit in zip(footprint(spec, v_tile, col_threads, t_tile),
                                          (PREFETCH_REGS, SHARED_BYTES)))):
        t_tile //= 2
    return {"v_tile": v_tile, "col_threads": col_threads, "t_tile": t_tile}


def generate(spec: MatrixScanSpec, v_tile=8, col_threads=8, t_tile=16):
    """The PrimFunc ``scanweaver_scan(q, k, v, [g], [h0], o, [last])``: ``v_tile * col_threads``
    threads per block, ``batch * heads * ceil(V / v_tile)`` blocks."""
    threads = v_tile * col_threads
    if min(v_tile, col_threads, t_tile) < 1 or threads > 1024:
        raise ValueError(f"v_tile={v_tile}, col_threads={col_threads}, t_tile={t_tile}: need "
                         "each >= 1 and v_tile * col_threads <= 1024")
    rows, n_vt = _ceil(spec.key, col_threads), _ceil(spec.value, v_tile)
    widths = _widths(spec, col_threads, v_tile)
    kp, heads, K, V = widths["q"], spec.heads, spec.key, spec.value
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            resolve = extent_vars(spec)
            batch, length = resolve(spec.batch), resolve(spec.length)

            def arg(name, shape):
                shape = tuple(resolve(d) for d in shape)
                return T.arg(name, T.buffer(shape, spec.dtype, layout=buffer_layout(shape)))

            shapes = {**spec.operand_shapes(), "o": spec.out_shape}
            if spec.return_last_state:
                shapes["last"] = spec.state_shape
            ops = {name: arg(name, shape) for name, shape in shapes.items()}
            n_tiles = (length + t_tile - 1) // t_tile
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, grid(batch * (heads * n_vt))):
                with T.launch_thread(tx, threads):
                    b, h, v0 = bx // (heads * n_vt), bx // n_vt % heads, bx % n_vt * v_tile
                    j, c = tx // v_tile, tx % v_tile
                    staged = [n for n in ("q", "k", "v", "g") if widths[n]]
                    axes = {"q": "key", "k": "key", "v": "value",
                            "g": {"scalar": "one"}.get(spec.decay, spec.decay)}
                    items = {n: _ceil(t_tile * widths[n], threads) for n in staged}
                    smem = {n: T.alloc_buffer((items[n] * threads,), F32, scope="shared") for n in staged}
                    partial = T.alloc_buffer((t_tile * threads,), F32, scope="shared")
                    pref = {n: T.alloc_buffer((items[n],), F32, scope="local") for n in staged}
                    state = T.alloc_buffer((rows,), F32, scope="local")

                    def time(step):  # tensor index of the step-th step processed
                        return length - 1 - step if spec.reverse else step

                    def at(name, bb, hh, t, col):  # operand index, broadcast dims read at 0
                        sb, sh, st, _ = spec.operand_shapes()[name]
                        return [0 if sb == 1 else bb, 0 if sh == 1 else hh, 0 if st == 1 else t, col]

                    def load(tile):  # the tile's operands into registers, identity-padded
                        for n in staged:
                            w, axis = widths[n], axes[n]
                            for m in range(items[n]):
                                idx = m * threads + tx
                                step = tile * t_tile + idx // w
                                col = idx % w
                                ok = [step < length]
                                if axis != "one":
                                    ok.append(col < K if axis == "key" else v0 + col < V)
                                if (m + 1) * threads > t_tile * w:
                                    ok.append(idx < t_tile * w)
                                col = v0 + col if axis == "value" else col
                                pad = tirx.const(1.0 if n == "g" else 0.0, F32)
                                value = to_f32(ops[n][tuple(at(n, b, h, time(step), col))], spec.dtype)
                                T.buffer_store(pref[n], T.if_then_else(tirx.all(*ok), value, pad), [m])

                    ok_col = v0 + c < V
                    for i in range(rows):
                        r = i * col_threads + j
                        init = (T.if_then_else(tirx.all(r < K, ok_col),
                                               to_f32(ops["h0"][b, h, r, v0 + c], spec.dtype),
                                               tirx.const(0.0, F32)) if spec.has_h0 else tirx.const(0.0, F32))
                        T.buffer_store(state, init, [i])
                    load(0)
                    with T.serial(0, n_tiles) as tile:
                        for n in staged:
                            for m in range(items[n]):
                                T.buffer_store(smem[n], pref[n][m], [m * threads + tx])
                        barrier()
                        # a uniform guard, not dead stores on the last tile (README: StorageRewrite)
                        with T.If(tile + 1 < n_tiles):
                            with T.Then():
                                load(tile + 1)
                        with T.serial(0, t_tile) as s:
                            vv = smem["v"][s * v_tile + c]
                            for i in range(rows):
                                r = i * col_threads + j
                                kv = smem["k"][s * kp + r] * vv
                                if spec.decay == "none":
                                    T.buffer_store(state, state[i] + kv, [i])
                                else:
                                    g_at = {"scalar": s, "key": s * kp + r, "value": s * v_tile + c}
                                    T.buffer_store(state, smem["g"][g_at[spec.decay]] * state[i] + kv, [i])
                            readout = smem["q"][s * kp + j] * state[0]
                            for i in range(1, rows):
                                readout = readout + smem["q"][s * kp + i * col_threads + j] * state[i]
                            T.buffer_store(partial, readout, [s * threads + tx])
                        barrier()
                        for m in range(_ceil(t_tile * v_tile, threads)):
                            item = m * threads + tx
                            s, col = item // v_tile, item % v_tile
                            step = tile * t_tile + s
                            ok = [step < length, v0 + col < V]
                            if (m + 1) * threads > t_tile * v_tile:
                                ok.append(item < t_tile * v_tile)
                            total = partial[s * threads + col]
                            for jj in range(1, col_threads):
                                total = total + partial[s * threads + jj * v_tile + col]
                            with T.If(tirx.all(*ok)):
                                with T.Then():
                                    T.buffer_store(ops["o"], from_f32(total, spec.dtype),
                                                   [b, h, time(step), v0 + col])
                    if spec.return_last_state:
                        for i in range(rows):
                            r = i * col_threads + j
                            with T.If(tirx.all(r < K, ok_col)):
                                with T.Then():
                                    T.buffer_store(ops["last"], from_f32(state[i], spec.dtype),
                                                   [b, h, r, v0 + c])
    return ib.get()
