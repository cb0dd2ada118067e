"""CPU realization of the matrix-state scan (LLVM target).

Per (batch, head) the state S is K x V float32 and a step costs 2 K V multiply-adds (update and
readout) against K + 2 V loaded numbers, so the kernel is bound by arithmetic only if S never
goes to memory between steps.  A task owns one (batch, head, V tile) and its state (a local
buffer).  L is walked in time tiles: the tile's rows of the decay and of the operands that are
rescaled (below), narrower than float32 or channel-major are staged as float32 in processing
order (reverse scans run backwards; other operands are read where they lie), then the state is
swept in register blocks of ``rows`` x ``lanes``: a block is loaded into one small local buffer
per row (LLVM keeps those in vector registers), carried through every step of the tile (rows
unrolled, V vectorized, ``parts`` independent readout sums) and stored back.  The row blocks of
a V block take turns on the tile's staged output rows; the last one writes them out with
contiguous vector stores.  After each block the task prefetches its share of the next tile's
rows, so memory streams under the arithmetic.  Tasks run in parallel.  Nothing of size
(B, H, L, K, V) exists.  How the operands are staged and the outputs written in either layout
(channel-major: time innermost, transposed in local memory), the skip ``D * v`` and the gate
``silu(z)`` included, is ``matrix_cpu_io``.

A decay would add a multiply per state element and step (3 operations instead of 2).  Instead
the tile runs in ``chunk``-step pieces, each in the frame of its end E: with H_s the product of
the decays after step s up to E, G_t the product from the piece's start through t and
G_E = G_t H_t its whole product, ``U_t = G_E S_start + sum_{s<=t} H_s k_s v_s^T`` is what the
registers carry and ``S_t = (G_t / G_E) U_t``.  So k_s is scaled by H_s and q_t by G_t / G_E
(key and scalar decay; value decay scales v_s and the output per column), the block multiplies
its registers by G_E once per piece, U_E = S_E, and no step divides.  Every term of U_t carries
the same factor G_E / G_t relative to S_t, so rounding is relative to the same magnitudes as in
the direct recurrence; only the range matters: a tile with a |g| > 1 or a chunk whose |G_E| is
below 2**-60 (a near-zero decay, a NaN) runs the direct recurrence instead.  This is the
chunked form's inter-chunk recurrence with its intra-chunk part done step by step in the
registers; an intra-chunk matmul would add C/2 (1/K + 1/V) multiply-adds per state element and
step to the same 2 of the inter-chunk part, so the chunked form cannot beat this on a CPU.

The selective decay (Mamba-1: ``exp(dt'[v] A[k, v])``) varies over both of the state's dims,
so it has no such frame (its products do not factor into a row and a column scale): every tile
runs the direct recurrence, the decay computed in the registers' loop, one vector ``exp2``
(``fast_math.exp2``) of dt' times A log2(e) per state element (A log2(e) is kept
per task in a local buffer), the input k_t[row] (dt' v)[column] read from the stage.  At
Mamba's shape (K = N = 16 states, V = the channels) a block of all 16 rows x 16 lanes is
``selective_cpu``'s pack of 16 channels with its N states in registers, and the two kernels
do the same arithmetic in the same order (their outputs agree bit for bit there).

A V tile that overhangs V clamps its columns to V - 1 (those lanes recompute and rewrite the
last column: branch-free).  A symbolic batch or L is an int64 Var in the argument shapes; the
L // tile full tiles run in a loop and the L % tile tail is one more tile (guarded when it may be
empty; time-major staging stays vectorized along K or V, constant extents; channel-major
staging along t is serial in a symbolic tail).
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MatrixScanSpec, static_or

from . import matrix_cpu_io as io
from .fast_math import LOG2E, exp2

NAME = "matrix_cpu"
TARGET = "cpu"
FORM = "matrix"
F32 = "float32"
SMALLEST = 2.0 ** -60   # the rescaled form needs |decay| <= 1 and each chunk's |E| >= this
RESCALABLE = ("scalar", "key", "value")


def _c(x):
    return tirx.const(x, F32)


def applies(spec):
    return isinstance(spec, MatrixScanSpec)


def default_config(spec, cores=2):
    """Blocks of 8 rows x 32 lanes (16 zmm of state; with 2 readout sums and v_t ~22 of
    AVX-512's 32 registers; 16 lanes where that pads V less, one vector below 16), tiles of 32
    steps rescaled in chunks of 16 (the range holds for decays down to ~0.07 a step), the next
    tile prefetched into L2, the whole V in one task unless there are fewer than 2 tasks per
    core (then V is split).  Measured on a 2-core AVX-512 Xeon: 8 x 32 and 4 x 64 blocks and
    tiles of 16 to 64 within noise of each other, 16 x 16 blocks slower, chunk 0 (the direct
    recurrence) ~20% slower.  A symbolic batch counts as large.

    The selective decay: ``selective_cpu``'s pack, a block of 16 rows (all of Mamba's N = 16)
    x 16 lanes (fewer lanes below 16 columns, or while there are fewer than 2 tasks per
    core), 4 readout sums, tiles of 64 steps, prefetched; V tiles of 16 columns channel-major
    (its staging transposes; a wider tile was ~25% slower) and of 64 time-major (a row of a
    step is then 4 cache lines; 16 was ~15% slower).  Measured at Mamba's shape (V = 1536,
    L = 1024, N = 16; 1 and 2 threads, interleaved, on a shared machine): channel-major
    0.84-1.03x ``selective_cpu``'s time on the same bytes (median ~0.95x), time-major
    0.70-0.91x (it stages with contiguous loads and no transpose); prefetching gains ~5% (the
    96 rows of a channel-major task are more streams than the hardware prefetcher follows)."""
    tasks = static_or(spec.batch, 1 << 30) * spec.heads
    if spec.decay == "selective":
        return _selective_config(spec, tasks, cores)
    padded = {n: -(-spec.value // n) * n for n in (16, 32)}
    lanes = (32 if padded[32] <= padded[16] else 16) if spec.value >= 16 else \
        1 << (spec.value - 1).bit_length()
    vtile = -(-spec.value // lanes) * lanes
    while vtile > lanes and tasks * -(-spec.value // vtile) < 2 * cores:
        vtile = -(-(vtile // 2) // lanes) * lanes
    return {"vtile": vtile, "lanes": lanes, "rows": 8, "parts": 2, "tile": 32, "chunk": 16,
            "prefetch": 1, "locality": 2}


def _selective_config(spec, tasks, cores):
    lanes = 16
    while lanes > 1 and (lanes // 2 >= spec.value or tasks * -(-spec.value // lanes) < 2 * cores):
        lanes //= 2
    vtile = lanes if spec.layout == "channel_major" else \
        min(4 * lanes, -(-spec.value // lanes) * lanes)
    while vtile > lanes and tasks * -(-spec.value // vtile) < 2 * cores:
        vtile = -(-(vtile // 2) // lanes) * lanes
    return {"vtile": vtile, "lanes": lanes, "rows": 16, "parts": 4, "tile": 64, "chunk": 0,
            "prefetch": 1, "locality": 2}


def generate(spec: MatrixScanSpec, vtile=64, lanes=32, rows=8, parts=2, tile=32, chunk=16,
             prefetch=1, locality=2):
    """The PrimFunc ``scanweaver_scan``: parallel (batch, head, V tile) tasks, sequential in L.

    ``vtile``: state columns per task (rounded up to a multiple of ``lanes``); ``lanes``:
    columns of a register block (the vector width); ``rows``: state rows of a register block;
    ``parts``: independent readout sums; ``tile``: steps staged at a time; ``chunk``: steps per
    rescaled piece (0: always the direct recurrence; no decay and the selective decay have
    none); ``prefetch``: how many tiles ahead the rows are prefetched (0: none), into the cache
    level ``locality`` (LLVM's 3: L1, 2: L2)."""
    n_k, n_v = spec.key, spec.value
    lanes = max(1, min(lanes, vtile))
    vtile = -(-vtile // lanes) * lanes
    vtiles = -(-n_v // vtile)
    rows = max(1, min(rows, n_k))
    chunk = min(chunk, tile) if spec.decay in RESCALABLE else 0
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            ops = io.Operands(spec)
            with T.parallel(0, ops.batch * spec.heads * vtiles) as task:
                b = task // (spec.heads * vtiles)
                h = task // vtiles % spec.heads
                c0 = task % vtiles * vtile
                clamp = n_v % vtile != 0      # the last tile overhangs V

                def col(w):                   # the state column of V-tile lane w
                    return tirx.min(c0 + w, n_v - 1) if clamp else c0 + w

                state = T.alloc_buffer((n_k * vtile,), F32, scope="local")
                with T.serial(0, n_k) as i:
                    with T.vectorized(0, vtile) as w:
                        T.buffer_store(state, ops.load("h0", b, h, i, col(w)) if spec.has_h0
                                       else _c(0.0), [i * vtile + w])
                ctx = dict(spec=spec, ops=ops, b=b, h=h, col=col, state=state, vtile=vtile,
                           lanes=lanes, rows=rows, parts=max(1, min(parts, rows)), tile=tile,
                           chunk=chunk, prefetch=prefetch, locality=locality)
                _allocate(ctx)
                full, rest = ops.length // tile, ops.length % tile
                if not isinstance(full, int) or full:
                    with T.serial(0, full) as j:
                        _tile(ctx, j * tile, tile)
                if isinstance(rest, int):
                    if rest:
                        _tile(ctx, full * tile, rest)
                else:
                    with T.If(rest > 0):
                        with T.Then():
                            _tile(ctx, full * tile, rest)
                if spec.return_last_state:
                    with T.serial(0, n_k) as i:
                        with T.vectorized(0, vtile) as w:
                            ops.store("last", state[i * vtile + w], b, h, i, col(w))
    return ib.get()


def _allocate(ctx):
    """The task's stage (``ctx["stage"]``, widths ``ctx["widths"]``) and what is staged:
    what is rescaled, any narrower dtype (but the direct recurrence of a decay that can be
    rescaled reads every operand where it lies, except those staged unscaled: ``raw``), every
    channel-major operand (v under the selective decay only as dt' * v, ``du``); float32
    time-major q, k, v otherwise are read in place.  The selective decay's A log2(e) too."""
    spec, vtile, tile, chunk = ctx["spec"], ctx["vtile"], ctx["tile"], ctx["chunk"]
    n_k, decay, selective = spec.key, spec.decay, spec.decay == "selective"
    gw = {"scalar": 1, "key": n_k, "value": vtile}.get(decay, 1)
    scaled = {"scalar": "qk", "key": "qk", "value": "v"}[decay] if chunk else ""
    if spec.layout == "channel_major":
        staged = set("qkv")
    else:
        staged = {n for n in "qkv" if n in scaled or
                  spec.dtype != F32 and (chunk or decay in ("none", "selective"))}
    staged -= {"v"} if selective else set()
    widths = {"q": n_k, "k": n_k, "v": vtile, "o": vtile, "g": gw, "G": gw, "H": gw,
              "dt": vtile, "du": vtile}
    names = sorted(staged) + ["o"] + (["g"] if decay in RESCALABLE else []) + \
        (["G", "H"] if chunk else []) + (["dt", "du"] if selective else [])
    st = {n: T.alloc_buffer((tile * widths[n],), F32, scope="local") for n in names}
    if chunk:
        for name in ("E", "R"):
            st[name] = T.alloc_buffer((-(-tile // chunk) * gw,), F32, scope="local")
        st["big"] = T.alloc_buffer((gw,), F32, scope="local")   # max |g|, per lane
    if spec.layout == "channel_major" and (selective or io.has_epilogue(spec)):
        st["row"] = T.alloc_buffer((2 * tile,), F32, scope="local")   # a row along t, z's
    if selective:
        ctx["a2"] = T.alloc_buffer((n_k * vtile,), F32, scope="local")
        with T.serial(0, n_k) as i:
            with T.vectorized(0, vtile) as w:
                T.buffer_store(ctx["a2"], ctx["ops"].load("A", ctx["h"], i, ctx["col"](w)) *
                               _c(LOG2E), [i * vtile + w])
    row_major = set()
    if spec.layout == "channel_major":   # read a number at a time and not rescaled
        row_major = set("qk") - set(scaled) | ({"g"} if decay == "key" and not chunk else set())
    ctx.update(stage=st, staged=staged, raw=staged - set(scaled), row_major=row_major,
               widths=widths, gw=gw)


def _tile(ctx, s0, size):
    """``size`` (>= 1) steps from step ``s0``: stage (with the decays' prefix products), sweep
    the register blocks (the rescaled form when its range holds, else the direct recurrence),
    write channel-major outputs out."""
    spec, st = ctx["spec"], ctx["stage"]
    io.stage(ctx, s0, size)
    if spec.decay in ("none", "selective"):
        _sweep(ctx, s0, size, "plain" if spec.decay == "none" else "selective")
    elif not ctx["chunk"]:
        _sweep(ctx, s0, size, "direct")
    else:
        _rescale(ctx, size)
        with T.If(st["big"][0] <= _c(1.0)):
            with T.Then():
                _sweep(ctx, s0, size, "rescaled")
            with T.Else():
                _sweep(ctx, s0, size, "direct")
    if ctx["ops"].channel_major:
        io.write_out(ctx, s0, size)


def _rescale(ctx, size):
    """Into each chunk's end frame, in the stage: G (the running product since the chunk
    started) and big (max |g|); E (the chunk's whole decay) and R = 1/E per chunk; backwards
    through each chunk, H (the suffix products, 1 at its end); then k_s *= H_s, q_t *= G_t / E
    (scalar, key decay) or v_s *= H_s (value decay: the output gets G_t / E as it is written).
    With every |g| <= 1, |G| and |H| lie in [|E|, 1], so the form holds if that is so and each
    |E| >= ``SMALLEST``: big[0] ends <= 1 then, else 2 (a NaN fails too), and the direct
    recurrence runs on the operands where they lie.  (No index divides an expression that
    falls with the loop variable: TVM 0.27's FlattenBuffer rewrites ``(19 - j) // 16`` into
    ``j // -16 + 1``, a different number.)"""
    spec, st, n_k, gw, chunk = ctx["spec"], ctx["stage"], ctx["spec"].key, ctx["gw"], ctx["chunk"]
    g, pre, suf, big = st["g"], st["G"], st["H"], st["big"]
    with T.vectorized(0, gw) as i:
        T.buffer_store(big, _c(0.0), [i])
    with T.serial(0, size) as s:
        with T.vectorized(0, gw) as i:
            prev = tirx.Select(s % chunk == 0, _c(1.0), pre[tirx.max(s - 1, 0) * gw + i])
            T.buffer_store(pre, g[s * gw + i] * prev, [s * gw + i])
            T.buffer_store(big, tirx.max(big[i], tirx.abs(g[s * gw + i])), [i])
    with T.serial(0, (size + chunk - 1) // chunk) as c:
        n = tirx.min(chunk, size - c * chunk)
        with T.vectorized(0, gw) as i:
            whole = pre[(c * chunk + n - 1) * gw + i]
            T.buffer_store(st["E"], whole, [c * gw + i])
            T.buffer_store(st["R"], _c(1.0) / whole, [c * gw + i])
            T.buffer_store(big, tirx.Select(tirx.abs(whole) >= _c(SMALLEST), big[i], _c(2.0)),
                           [i])
        with T.serial(0, n) as j:
            s = c * chunk + n - 1 - j
            with T.vectorized(0, gw) as i:
                nxt = tirx.min(s + 1, size - 1) * gw + i
                T.buffer_store(suf, tirx.Select(j == 0, _c(1.0), suf[nxt] * g[nxt]), [s * gw + i])
                if spec.decay == "value":
                    v = io.slot(ctx, "v", s, i)
                    T.buffer_store(st["v"], st["v"][v] * suf[s * gw + i], [v])
            if spec.decay != "value":
                with T.vectorized(0, n_k) as k:
                    i, gi = io.slot(ctx, "q", s, k), (k if spec.decay == "key" else 0)
                    T.buffer_store(st["q"], st["q"][i] * pre[s * gw + gi] * st["R"][c * gw + gi],
                                   [i])
                    T.buffer_store(st["k"], st["k"][i] * suf[s * gw + gi], [i])
    with T.serial(1, gw) as i:
        T.buffer_store(big, tirx.max(big[0], big[i]), [0])


def _sweep(ctx, s0, size, mode):
    """All register blocks through the tile.  Per V block the row blocks run in turn: the
    first stores its readout into the staged output rows, the middle ones add to them, the
    last adds and writes the finished rows out (a single block writes directly).  After each
    block, prefetch its share of the next tile's rows (outside the step loop: a prefetch call
    in there keeps LLVM from promoting the block's registers)."""
    n_k, rows, lanes, vtile = ctx["spec"].key, ctx["rows"], ctx["lanes"], ctx["vtile"]
    per_v = -(-n_k // rows)
    blocks = vtile // lanes * per_v
    last = (per_v - 1) * rows

    def after(block):
        if ctx["prefetch"]:
            io.prefetch(ctx, s0, block, blocks)

    with T.serial(0, vtile // lanes) as vb:
        c = vb * lanes
        _block(ctx, s0, 0, min(rows, n_k), c, size, mode, "only" if per_v == 1 else "first")
        after(vb * per_v)
        if per_v > 2:
            with T.serial(1, per_v - 1) as kb:
                _block(ctx, s0, kb * rows, rows, c, size, mode, "middle")
                after(vb * per_v + kb)
        if per_v > 1:
            _block(ctx, s0, last, n_k - last, c, size, mode, "last")
            after(vb * per_v + per_v - 1)


def _block(ctx, s0, r0, nrows, c, size, mode, role):
    """Carry state rows ``r0 .. r0+nrows`` x columns ``c .. c+lanes`` through the tile in
    registers (one local buffer per row).  ``mode``: "plain" (no decay), "direct" (multiply
    by g every step), "rescaled" (the inputs are rescaled; multiply by the chunk's whole
    decay E as it starts) or "selective" (multiply by exp2(dt' A log2 e), add k (dt' v)).
    ``role``: what the readout does with the staged output rows ("first": store, "middle":
    add, "last": add and finish, "only": finish); a finished row is scaled by G_t / E per
    column under the rescaled value decay, and written out through the epilogue (time-major)
    or left in the stage for ``write_out`` (channel-major)."""
    spec, ops, st, state = ctx["spec"], ctx["ops"], ctx["stage"], ctx["state"]
    vtile, lanes, gw, chunk = ctx["vtile"], ctx["lanes"], ctx["gw"], ctx["chunk"]
    parts = min(ctx["parts"], nrows)
    regs = [T.alloc_buffer((lanes,), F32, scope="local") for _ in range(nrows)]
    acc = [T.alloc_buffer((lanes,), F32, scope="local") for _ in range(parts)]
    inline_epilogue = io.has_epilogue(spec) and not ops.channel_major and \
        role in ("only", "last")
    out = T.alloc_buffer((2 * lanes,), F32, scope="local") if inline_epilogue else None
    for r, reg in enumerate(regs):
        with T.vectorized(0, lanes) as w:
            T.buffer_store(reg, state[(r0 + r) * vtile + c + w], [w])

    def operand(name, s, i):        # q, k (i: a row) or v (i: a lane) at step s, as float32
        if name in ctx["staged"] and (mode != "direct" or name in ctx["raw"]):
            return st[name][io.slot(ctx, name, s, c + i if name == "v" else i)]
        return ops.load(name, ctx["b"], ctx["h"], io.time_of(ctx, s0 + s),
                        ctx["col"](c + i) if name == "v" else i)

    def decay_of(name, s, row, w):  # the factor of state element (row, c + w) in g's or E's row s
        i = {"key": row, "value": c + w}.get(spec.decay, 0)
        return st[name][io.slot(ctx, name, s, i) if name == "g" else s * gw + i]

    with T.serial(0, size) as s:
        if mode == "rescaled":   # a chunk starts: U = E S (its whole decay, ahead of time)
            with T.If(s % chunk == 0):
                with T.Then():
                    for r, reg in enumerate(regs):
                        with T.vectorized(0, lanes) as w:
                            T.buffer_store(reg, reg[w] * decay_of("E", s // chunk, r0 + r, w),
                                           [w])
        for p in range(parts):
            with T.vectorized(0, lanes) as w:
                T.buffer_store(acc[p], _c(0.0), [w])
        for r, reg in enumerate(regs):
            row = r0 + r
            with T.vectorized(0, lanes) as w:
                if mode == "selective":
                    j = io.slot(ctx, "du", s, c + w)
                    kv = operand("k", s, row) * st["du"][j]
                    old = reg[w] * exp2(st["dt"][j] * ctx["a2"][row * vtile + c + w])
                else:
                    kv = operand("k", s, row) * operand("v", s, w)
                    old = reg[w] * decay_of("g", s, row, w) if mode == "direct" else reg[w]
                T.buffer_store(reg, old + kv, [w])
                a = acc[r % parts]
                T.buffer_store(a, a[w] + operand("q", s, row) * reg[w], [w])
        with T.vectorized(0, lanes) as w:
            y = acc[0][w]
            for p in range(1, parts):
                y = y + acc[p][w]
            i = io.slot(ctx, "o", s, c + w)
            if role in ("middle", "last"):
                y = st["o"][i] + y
            if role in ("first", "middle"):
                T.buffer_store(st["o"], y, [i])
            else:
                if mode == "rescaled" and spec.decay == "value":
                    y = y * st["G"][i] * st["R"][s // chunk * vtile + c + w]
                t, column = io.time_of(ctx, s0 + s), ctx["col"](c + w)
                if ops.channel_major:
                    T.buffer_store(st["o"], y, [i])
                elif inline_epilogue:
                    T.buffer_store(out, y, [w])
                    io.epilogue(ctx, (out, w), (out, lanes + w), t, column)
                    ops.store("o", out[w], ctx["b"], ctx["h"], t, column)
                else:
                    ops.store("o", y, ctx["b"], ctx["h"], t, column)
    for r, reg in enumerate(regs):
        with T.vectorized(0, lanes) as w:
            T.buffer_store(state, reg[w], [(r0 + r) * vtile + c + w])
