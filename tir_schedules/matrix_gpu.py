"""CUDA realization of the matrix-state scan (``MatrixScanSpec``: GLA, retention, Mamba-2, and
with the selective decay Mamba-1).

One thread block per (batch, head, tile of ``v_tile`` state columns); the state never leaves
the chip.  Thread ``tx = j * v_tile + c`` owns column ``v0 + c`` and the rows
``i * col_threads + j`` (``rows = ceil(K / col_threads)`` float32 registers; rows past K are
zero padding).  Rows are interleaved, not blocked, so the ``col_threads`` threads of a column
read consecutive shared words (no bank conflicts) and lanes of one j read one word (broadcast).
Under the selective decay the thread also keeps its entries of A (rows r, column v0 + c),
times log2(e), in ``rows`` more registers.

L is walked in tiles of ``t_tile`` steps.  Per tile:
  1. the operands of the tile (q, k rows of K, the block's v and g / dt columns, converted to
     float32 and padded with the identity, q = k = v = 0, g = 1, dt = 0, past L) go from
     registers to shared; dt arrives there already ``softplus(dt + dt_bias)``;
  2. barrier; the gate's z of the tile goes from registers to shared (read only in 4), then
     the *next* tile's operands (if any) are loaded into registers (software pipelining: the
     global latency hides behind this tile's compute, which is all the latency hiding there is
     with the few blocks a head count gives);
  3. each step updates the thread's registers ``S = g * S + k v`` (selective:
     ``S = exp2(dt * A log2 e) * S + k (dt v)``, exp2 being CUDA's ``exp2f``, as in
     ``selective_gpu``) and stores its partial readout ``sum_i q[r_i] S[i]`` to shared (one
     word per thread per step); the j = 0 thread of a column adds the skip ``D * v``;
  4. barrier; the ``t_tile * v_tile`` outputs are summed over the ``col_threads`` partials of
     their column (a fixed order, so both emulation orders agree), gated by ``silu(z)`` and
     stored.
Two barriers per tile: everything written to shared between the two barriers (partials, z) is
read after the second and rewritten only after the next tile's first; the operands written
before the first are read only before the second.  So one shared buffer of each suffices.
Padding steps sit at the end of the processing order (the identity keeps S), so ``last`` is S
after the loop.

Layouts: time-major operands are loaded, and o stored, coalesced along the channels (item
``idx`` of a tile is step ``idx // width``, column ``idx % width``).  Channel-major ones
(Mamba's (B, H, ., L), time innermost) are loaded coalesced along t (step ``idx % t_tile``,
column ``idx // t_tile``) into the same step-major shared tiles, whose rows are then padded to
an odd number of words so those transposing stores hit distinct banks; o is likewise summed
and stored along t, its partials' rows padded to an odd pitch.  The state (h0, last) and A are
read per thread in either layout (once per kernel).  Indices never divide a reversed step.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MatrixScanSpec, static_or

from .gpu_warp import barrier
from .layout import buffer_layout, extent_vars, from_f32, grid, matrix_index, to_f32
from .fast_math import LOG2E, silu, softplus

NAME = "matrix_gpu"
TARGET = "cuda"
FORM = "matrix"
F32 = "float32"
SMS = 132                   # H100/H200 SMs: the grid should nearly fill one wave
WARP = 32
V_TILE = 8                  # columns per block: each staged q/k row serves 8 columns
PREFETCH_REGS = 64          # registers per thread holding the next tile's operands
SHARED_BYTES = 32 * 1024    # leaves room under the 48 KiB static limit (and for 2+ blocks/SM)


def applies(spec):
    return isinstance(spec, MatrixScanSpec)


def _ceil(a, b):
    return -(-a // b)


def _widths(spec, col_threads, v_tile):
    """Staged floats per step of each staged operand: q, k (K padded to the row interleave),
    v, the decay (g; dt under the selective decay), z (the gate).  Zero: not staged."""
    kp = _ceil(spec.key, col_threads) * col_threads
    g = {"none": 0, "scalar": 1, "key": kp, "value": v_tile, "selective": v_tile}[spec.decay]
    return {"q": kp, "k": kp, "v": v_tile, "dt" if spec.decay == "selective" else "g": g,
            "z": v_tile if spec.has_gate else 0}


def _pitch(spec, width):
    """Words per step of a staged tile in shared: its width, channel-major made odd (the
    stores along t then hit distinct banks)."""
    return width + (spec.layout == "channel_major" and width % 2 == 0)


def _staged_words(spec, width, threads, t_tile):
    """Shared words of one staged operand: time-major every thread stores all its items
    (``items * threads`` slots, the overhang never read), channel-major only the real ones."""
    if spec.layout == "channel_major":
        return t_tile * _pitch(spec, width)
    return _ceil(t_tile * width, threads) * threads


def footprint(spec, v_tile, col_threads, t_tile):
    """``(prefetch registers per thread, static shared bytes)`` of a config.  The bytes are
    each shared buffer's rounded up to 64 (ptxas aligns every one to 64 bytes), so an upper
    bound of what ptxas reports, by under 64 bytes a buffer (TVM trims a buffer to the words
    used: the last padding word of a channel-major tile)."""
    threads = v_tile * col_threads
    widths = [w for w in _widths(spec, col_threads, v_tile).values() if w]
    items = sum(_ceil(t_tile * w, threads) for w in widths)
    words = [_staged_words(spec, w, threads, t_tile) for w in widths] + [t_tile * _pitch(spec, threads)]
    return items, 64 * sum(_ceil(4 * n, 64) for n in words)


def default_config(spec):
    """~8 state rows per thread (``col_threads`` a power of two <= 32) and 8 columns per block,
    then at least a warp per block (more threads per column, i.e. fewer rows each, up to one
    row each, then more columns: Mamba-1's K = 16 gets 8 x 4 threads of 4 rows), fewer columns
    while doubling the grid would still fit one wave of an H100/H200 (B=1, H=16, K=V=64: 8 x 8
    threads, 128 blocks; Mamba-2's H=24, K=128: 8 x 16 threads, 192 blocks); the time tile is
    the largest power of two <= 64 within the prefetch-register and shared budgets and below
    2L (a symbolic extent counts as large)."""
    col_threads = min(32, 1 << max(0, _ceil(spec.key, 8) - 1).bit_length())
    v_tile = min(spec.value, V_TILE)
    one_row_each = min(32, 1 << (spec.key - 1).bit_length())
    while v_tile * col_threads < WARP and col_threads < one_row_each:
        col_threads *= 2
    while v_tile * col_threads < WARP and v_tile < spec.value:
        v_tile = min(spec.value, 2 * v_tile)
    heads = static_or(spec.batch, 1 << 20) * spec.heads

    def blocks(vt):
        return heads * _ceil(spec.value, vt)

    while v_tile > 1 and v_tile * col_threads > WARP and 2 * blocks(v_tile) <= SMS:
        v_tile //= 2
    t_tile, length = 64, static_or(spec.length, 1 << 30)
    while t_tile > 1 and (t_tile >= 2 * length or any(
            x > limit for x, limit in zip(footprint(spec, v_tile, col_threads, t_tile),
                                          (PREFETCH_REGS, SHARED_BYTES)))):
        t_tile //= 2
    return {"v_tile": v_tile, "col_threads": col_threads, "t_tile": t_tile}


def generate(spec: MatrixScanSpec, v_tile=8, col_threads=8, t_tile=16):
    """The PrimFunc ``scanweaver_scan(*spec.operand_names(), o, [last])``: ``v_tile *
    col_threads`` threads per block, ``batch * heads * ceil(V / v_tile)`` blocks."""
    threads = v_tile * col_threads
    if min(v_tile, col_threads, t_tile) < 1 or threads > 1024:
        raise ValueError(f"v_tile={v_tile}, col_threads={col_threads}, t_tile={t_tile}: need "
                         "each >= 1 and v_tile * col_threads <= 1024")
    rows, n_vt = _ceil(spec.key, col_threads), _ceil(spec.value, v_tile)
    widths = {n: w for n, w in _widths(spec, col_threads, v_tile).items() if w}
    pitch = {n: _pitch(spec, w) for n, w in widths.items()}
    kp, heads, K, V = widths["q"], spec.heads, spec.key, spec.value
    channel_major, selective = spec.layout == "channel_major", spec.decay == "selective"
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            resolve = extent_vars(spec)
            batch, length = resolve(spec.batch), resolve(spec.length)
            dtypes = spec.operand_dtypes()

            def arg(name, shape):
                shape = tuple(resolve(d) for d in shape)
                dtype = dtypes.get(name, spec.dtype)
                return T.arg(name, T.buffer(shape, dtype, layout=buffer_layout(shape)))

            ops = {name: arg(name, shape) for name, shape in spec.buffer_shapes().items()}
            n_tiles = (length + t_tile - 1) // t_tile
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            with T.launch_thread(bx, grid(batch * (heads * n_vt))):
                with T.launch_thread(tx, threads):
                    b, h, v0 = bx // (heads * n_vt), bx // n_vt % heads, bx % n_vt * v_tile
                    j, c = tx // v_tile, tx % v_tile
                    staged = list(widths)            # q, k, v, [g | dt], [z]
                    axes = {"q": "key", "k": "key", "v": "value", "dt": "value", "z": "value",
                            "g": {"scalar": "one"}.get(spec.decay, spec.decay)}
                    items = {n: _ceil(t_tile * widths[n], threads) for n in staged}
                    smem = {n: T.alloc_buffer((_staged_words(spec, widths[n], threads, t_tile),), F32,
                                              scope="shared") for n in staged}
                    p_pitch = _pitch(spec, threads)
                    partial = T.alloc_buffer((t_tile * p_pitch,), F32, scope="shared")
                    pref = {n: T.alloc_buffer((items[n],), F32, scope="local") for n in staged}
                    state = T.alloc_buffer((rows,), F32, scope="local")
                    if selective:
                        a2 = T.alloc_buffer((rows,), F32, scope="local")    # A * log2(e)
                        cur = T.alloc_buffer((2,), F32, scope="local")      # this step's dt, dt*v
                    if spec.has_skip:
                        skip = T.alloc_buffer((1,), F32, scope="local")     # D[v0 + c] on j = 0

                    def time(step):  # tensor index of the step-th step processed
                        return length - 1 - step if spec.reverse else step

                    def entry(name, *idx):  # an argument's element at a logical index
                        return ops[name][tuple(matrix_index(spec, name, *idx))]

                    def split(idx, width):  # tile item -> (step in tile, column): coalesced loads
                        return (idx % t_tile, idx // t_tile) if channel_major else (idx // width, idx % width)

                    def load(tile):  # the tile's operands into registers, identity-padded
                        for n in staged:
                            w, axis = widths[n], axes[n]
                            for m in range(items[n]):
                                idx = m * threads + tx
                                s, col = split(idx, w)
                                step = tile * t_tile + s
                                ok = [step < length]
                                if axis != "one":
                                    ok.append(col < K if axis == "key" else v0 + col < V)
                                if (m + 1) * threads > t_tile * w:
                                    ok.append(idx < t_tile * w)
                                col = v0 + col if axis == "value" else col
                                pad = tirx.const(1.0 if n == "g" else 0.0, F32)
                                value = to_f32(entry(n, b, h, time(step), col), spec.dtype)
                                T.buffer_store(pref[n], T.if_then_else(tirx.all(*ok), value, pad), [m])
                                if n != "dt":
                                    continue
                                if spec.has_dt_bias:   # its own store: no Let may hoist this load
                                    bias = T.if_then_else(tirx.all(*ok), ops["dt_bias"][h, col],
                                                          tirx.const(0.0, F32))
                                    T.buffer_store(pref[n], pref[n][m] + bias, [m])
                                if spec.dt_softplus:   # then back to the padding 0 (softplus(0) != 0)
                                    T.buffer_store(pref[n], softplus(pref[n][m], native=True), [m])
                                    T.buffer_store(pref[n], T.if_then_else(tirx.all(*ok), pref[n][m], pad),
                                                   [m])

                    def stage(n):  # registers -> the step-major shared tile
                        w = widths[n]
                        for m in range(items[n]):
                            idx = m * threads + tx
                            if not channel_major:
                                T.buffer_store(smem[n], pref[n][m], [idx])
                                continue
                            s, col = split(idx, w)
                            if (m + 1) * threads > t_tile * w:
                                with T.If(idx < t_tile * w):
                                    with T.Then():
                                        T.buffer_store(smem[n], pref[n][m], [s * pitch[n] + col])
                            else:
                                T.buffer_store(smem[n], pref[n][m], [s * pitch[n] + col])

                    ok_col = v0 + c < V
                    for i in range(rows):
                        r = i * col_threads + j
                        init = (T.if_then_else(tirx.all(r < K, ok_col),
                                               to_f32(entry("h0", b, h, r, v0 + c), spec.dtype),
                                               tirx.const(0.0, F32)) if spec.has_h0 else tirx.const(0.0, F32))
                        T.buffer_store(state, init, [i])
                        if selective:
                            a2_i = entry("A", h, r, v0 + c) * tirx.const(LOG2E, F32)
                            T.buffer_store(a2, T.if_then_else(tirx.all(r < K, ok_col), a2_i,
                                                              tirx.const(0.0, F32)), [i])
                    if spec.has_skip:
                        T.buffer_store(skip, T.if_then_else(tirx.all(j == 0, ok_col), ops["D"][h, v0 + c],
                                                            tirx.const(0.0, F32)), [0])
                    load(0)
                    with T.serial(0, n_tiles) as tile:
                        for n in staged:
                            if n != "z":
                                stage(n)
                        barrier()
                        if spec.has_gate:          # read after the next barrier only
                            stage("z")
                        # a uniform guard, not dead stores on the last tile (README: StorageRewrite)
                        with T.If(tile + 1 < n_tiles):
                            with T.Then():
                                load(tile + 1)
                        with T.serial(0, t_tile) as s:
                            vv = smem["v"][s * pitch["v"] + c]
                            if selective:
                                T.buffer_store(cur, smem["dt"][s * pitch["dt"] + c], [0])
                                T.buffer_store(cur, cur[0] * vv, [1])
                            for i in range(rows):
                                r = i * col_threads + j
                                kr = smem["k"][s * pitch["k"] + r]
                                if spec.decay == "none":
                                    T.buffer_store(state, state[i] + kr * vv, [i])
                                elif selective:
                                    decay = T.exp2(cur[0] * a2[i])
                                    T.buffer_store(state, decay * state[i] + kr * cur[1], [i])
                                else:
                                    g_at = {"scalar": s * pitch["g"], "key": s * pitch["g"] + r,
                                            "value": s * pitch["g"] + c}[spec.decay]
                                    T.buffer_store(state, smem["g"][g_at] * state[i] + kr * vv, [i])
                            q_row = s * pitch["q"]
                            readout = smem["q"][q_row + j] * state[0]
                            for i in range(1, rows):
                                readout = readout + smem["q"][q_row + i * col_threads + j] * state[i]
                            if spec.has_skip:
                                readout = readout + skip[0] * vv
                            T.buffer_store(partial, readout, [s * p_pitch + tx])
                        barrier()
                        for m in range(_ceil(t_tile * v_tile, threads)):
                            item = m * threads + tx
                            s, col = split(item, v_tile)
                            step = tile * t_tile + s
                            ok = [step < length, v0 + col < V]
                            if (m + 1) * threads > t_tile * v_tile:
                                ok.append(item < t_tile * v_tile)
                            total = partial[s * p_pitch + col]
                            for jj in range(1, col_threads):
                                total = total + partial[s * p_pitch + jj * v_tile + col]
                            if spec.has_gate:
                                total = total * silu(smem["z"][s * pitch["z"] + col], native=True)
                            with T.If(tirx.all(*ok)):
                                with T.Then():
                                    T.buffer_store(ops["o"], from_f32(total, spec.dtype),
                                                   matrix_index(spec, "o", b, h, time(step), v0 + col))
                    if spec.return_last_state:
                        for i in range(rows):
                            r = i * col_threads + j
                            with T.If(tirx.all(r < K, ok_col)):
                                with T.Then():
                                    T.buffer_store(ops["last"], from_f32(state[i], spec.dtype),
                                                   matrix_index(spec, "last", b, h, r, v0 + c))
    return ib.get()
