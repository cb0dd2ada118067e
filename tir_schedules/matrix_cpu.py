"""CPU realization of the matrix-state scan (LLVM target).

Per (batch, head) the state S is K x V float32 and a step costs 2 K V multiply-adds (update and
readout) against K + 2 V loaded numbers, so the kernel is bound by arithmetic only if S never
goes to memory between steps.  A task owns one (batch, head, V tile) and its state (a local
buffer).  L is walked in time tiles: the tile's rows of g and of the operands that are rescaled
(below) or narrower than float32 are staged as float32 in processing order (reverse scans run
backwards; other operands are read where they lie), then the state is swept in register blocks of
``rows`` x ``lanes``: a block is loaded into one small local buffer per row (LLVM keeps those in
vector registers), carried through every step of the tile (rows unrolled, V vectorized,
``parts`` independent readout sums) and stored back.  The row blocks of a V block take turns
on the tile's staged output rows; the last one writes them out with contiguous vector stores.
After each block the task prefetches its share of the next tile's rows, so memory streams under
the arithmetic.  Tasks run in parallel.  Nothing of size (B, H, L, K, V) exists.

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

A V tile that overhangs V clamps its columns to V - 1 (those lanes recompute and rewrite the
last column: branch-free).  A symbolic batch or L is an int64 Var in the argument shapes; the
L // tile full tiles run in a loop and the L % tile tail is one more tile (guarded when it may be
empty; the staging stays vectorized along K or V, constant extents).
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import MatrixScanSpec, static_or

from .layout import buffer_layout, extent_vars

NAME = "matrix_cpu"
TARGET = "cpu"
FORM = "matrix"
F32 = "float32"
SMALLEST = 2.0 ** -60   # the rescaled form needs |decay| <= 1 and each chunk's |E| >= this


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
    recurrence) ~20% slower.  A symbolic batch counts as large."""
    padded = {n: -(-spec.value // n) * n for n in (16, 32)}
    lanes = (32 if padded[32] <= padded[16] else 16) if spec.value >= 16 else \
        1 << (spec.value - 1).bit_length()
    tasks = static_or(spec.batch, 1 << 30) * spec.heads
    vtile = -(-spec.value // lanes) * lanes
    while vtile > lanes and tasks * -(-spec.value // vtile) < 2 * cores:
        vtile = -(-(vtile // 2) // lanes) * lanes
    return {"vtile": vtile, "lanes": lanes, "rows": 8, "parts": 2, "tile": 32, "chunk": 16,
            "prefetch": 1, "locality": 2}


class _Operands:
    """The PrimFunc's arguments (README order) and their float32 loads by (b, h, t, i), t the
    third index (a row for h0 and last): operands broadcast on B, H (g also on L) read index 0
    there."""

    def __init__(self, spec):
        resolve = extent_vars(spec)
        self.spec, self.batch, self.length = spec, resolve(spec.batch), resolve(spec.length)
        shapes = dict(spec.operand_shapes())
        shapes["o"] = spec.out_shape
        if spec.return_last_state:
            shapes["last"] = spec.state_shape
        self.full = {n: tuple(s) for n, s in shapes.items()}
        self.bufs = {}
        for name, shape in shapes.items():
            dims = tuple(resolve(d) for d in shape)
            self.bufs[name] = T.arg(name, T.buffer(dims, spec.dtype, layout=buffer_layout(dims)))

    def index(self, name, b, h, t, i):
        """(b, h, t, i) with the broadcast dims of operand ``name`` at 0 (an extent of 1 where
        the full extent is not 1, or may not be)."""
        full = (self.spec.batch, self.spec.heads)
        return [0 if s == 1 and f != 1 else x for s, f, x in zip(self.full[name], full, (b, h))] + \
            [0 if name == "g" and self.full[name][2] == 1 else t, i]

    def load(self, name, b, h, t, i):
        x = self.bufs[name][tuple(self.index(name, b, h, t, i))]
        return x if self.spec.dtype == F32 else tirx.Cast(F32, x)

    def store(self, name, value, b, h, t, i):
        value = value if self.spec.dtype == F32 else tirx.Cast(self.spec.dtype, value)
        T.buffer_store(self.bufs[name], value, self.index(name, b, h, t, i))

    def prefetch(self, name, b, h, t, i, locality, write=False):
        """Ask for the cache line of element (b, h, t, i) (LLVM locality 3: L1, 2: L2), to
        write (``o``: the line is owned when the row is stored) or to read."""
        addr = tirx.address_of(self.bufs[name][tuple(self.index(name, b, h, t, i))])
        T.evaluate(tirx.call_intrin("void", "tirx.prefetch", addr, int(write), locality, 1))


def generate(spec: MatrixScanSpec, vtile=64, lanes=32, rows=8, parts=2, tile=32, chunk=16,
             prefetch=1, locality=2):
    """The PrimFunc ``scanweaver_scan``: parallel (batch, head, V tile) tasks, sequential in L.

    ``vtile``: state columns per task (rounded up to a multiple of ``lanes``); ``lanes``:
    columns of a register block (the vector width); ``rows``: state rows of a register block;
    ``parts``: independent readout sums; ``tile``: steps staged at a time; ``chunk``: steps per
    rescaled piece (0: always the direct recurrence); ``prefetch``: how many tiles ahead the
    rows are prefetched (0: none), into the cache level ``locality`` (LLVM's 3: L1, 2: L2)."""
    n_k, n_v = spec.key, spec.value
    lanes = max(1, min(lanes, vtile))
    vtile = -(-vtile // lanes) * lanes
    vtiles = -(-n_v // vtile)
    rows = max(1, min(rows, n_k))
    chunk = min(chunk, tile) if spec.decay != "none" else 0
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            ops = _Operands(spec)
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
                g_width = {"none": 1, "scalar": 1, "key": n_k, "value": vtile}[spec.decay]
                # staged: what is rescaled, and any narrower dtype (but the direct recurrence reads
                # every operand where it lies); float32 q, k, v otherwise are read in place
                scaled = {"none": "", "scalar": "qk", "key": "qk", "value": "v"}[spec.decay]
                staged = {n for n in "qkv" if chunk and n in scaled or
                          spec.dtype != F32 and (chunk or spec.decay == "none")}
                widths = {"q": n_k, "k": n_k, "v": vtile, "o": vtile, "g": g_width,
                          "G": g_width if chunk else 1, "H": g_width if chunk else 1}
                stage = {name: T.alloc_buffer((tile * width,), F32, scope="local")
                         for name, width in widths.items() if name not in "qkv" or name in staged}
                chunks = -(-tile // chunk) if chunk else 1
                for name in ("E", "R"):
                    stage[name] = T.alloc_buffer((chunks * g_width,), F32, scope="local")
                stage["big"] = T.alloc_buffer((g_width,), F32, scope="local")  # max |g|, per lane
                ctx = dict(spec=spec, ops=ops, b=b, h=h, col=col, state=state, stage=stage,
                           staged=staged,
                           vtile=vtile, lanes=lanes, rows=rows, parts=max(1, min(parts, rows)),
                           tile=tile, chunk=chunk, gw=g_width, prefetch=prefetch,
                           locality=locality)
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


def _time(ctx, step):
    """Tensor time index of the ``step``-th step processed."""
    return ctx["ops"].length - 1 - step if ctx["spec"].reverse else step


def _tile(ctx, s0, size):
    """``size`` (>= 1) steps from step ``s0``: stage (with the decays' prefix products), sweep
    the register blocks (the rescaled form when its range holds, else the direct recurrence)."""
    spec, ops, b, h, col, st = (ctx[k] for k in ("spec", "ops", "b", "h", "col", "stage"))
    vtile, n_k, gw, chunk = ctx["vtile"], spec.key, ctx["gw"], ctx["chunk"]
    if chunk:
        with T.vectorized(0, gw) as i:
            T.buffer_store(st["big"], _c(0.0), [i])
    with T.serial(0, size) as s:
        t = _time(ctx, s0 + s)
        for name in "qk":
            if name in ctx["staged"]:
                with T.vectorized(0, n_k) as i:
                    T.buffer_store(st[name], ops.load(name, b, h, t, i), [s * n_k + i])
        if "v" in ctx["staged"]:
            with T.vectorized(0, vtile) as w:
                T.buffer_store(st["v"], ops.load("v", b, h, t, col(w)), [s * vtile + w])
        if spec.decay != "none":
            with T.vectorized(0, gw) as i:
                g = ops.load("g", b, h, t, col(i) if spec.decay == "value" else i)
                T.buffer_store(st["g"], g, [s * gw + i])
                if chunk:   # G: the running product since the chunk started; max |g| so far
                    prev = tirx.Select(s % chunk == 0, _c(1.0),
                                       st["G"][tirx.max(s - 1, 0) * gw + i])
                    T.buffer_store(st["G"], g * prev, [s * gw + i])
                    T.buffer_store(st["big"], tirx.max(st["big"][i], tirx.abs(g)), [i])
    if spec.decay == "none":
        _sweep(ctx, s0, size, "plain")
    elif not chunk:
        _sweep(ctx, s0, size, "direct")
    else:
        _rescale(ctx, size)
        with T.If(st["big"][0] <= _c(1.0)):
            with T.Then():
                _sweep(ctx, s0, size, "rescaled")
            with T.Else():
                _sweep(ctx, s0, size, "direct")


def _rescale(ctx, size):
    """Into each chunk's end frame, in the stage: E (the chunk's whole decay) and R = 1/E per
    chunk; backwards through each chunk, H (the suffix products, 1 at its end); then
    k_s *= H_s, q_t *= G_t / E (scalar, key decay) or v_s *= H_s (value decay: the output gets
    G_t / E as it is written).  With every |g| <= 1, |G| and |H| lie in [|E|, 1], so the form
    holds if that is so and each |E| >= ``SMALLEST``: big[0] (max |g| so far) ends <= 1 then,
    else 2 (a NaN fails too), and the direct recurrence runs on the operands where they lie.
    (No index divides an expression that falls with the loop variable: TVM 0.27's
    FlattenBuffer rewrites ``(19 - j) // 16`` into ``j // -16 + 1``, a different number.)"""
    spec, st, n_k, gw, chunk = ctx["spec"], ctx["stage"], ctx["spec"].key, ctx["gw"], ctx["chunk"]
    g, pre, suf, big = st["g"], st["G"], st["H"], st["big"]
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
                    T.buffer_store(st["v"], st["v"][s * gw + i] * suf[s * gw + i], [s * gw + i])
            if spec.decay != "value":
                with T.vectorized(0, n_k) as k:
                    i, gi = s * n_k + k, (k if spec.decay == "key" else 0)
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
    n_k, rows, lanes, vtile, tile = (ctx["spec"].key, ctx["rows"], ctx["lanes"], ctx["vtile"],
                                     ctx["tile"])
    per_v = -(-n_k // rows)
    blocks = vtile // lanes * per_v
    last = (per_v - 1) * rows

    def after(block):
        if ctx["prefetch"]:
            lo, hi = block * tile // blocks, (block + 1) * tile // blocks
            with T.serial(lo, hi) as s:
                _prefetch_row(ctx, s0 + ctx["prefetch"] * tile + s)

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
    by g every step) or "rescaled" (the inputs are rescaled; multiply by the chunk's whole
    decay E as it starts).  ``role``: what the readout does with the staged output rows
    ("first": store, "middle": add, "last": add and write out, "only": write out); the
    rescaled form's output is scaled by G_t / E per column under value decay."""
    spec, ops, st, state = ctx["spec"], ctx["ops"], ctx["stage"], ctx["state"]
    vtile, lanes, n_k, gw, chunk = ctx["vtile"], ctx["lanes"], spec.key, ctx["gw"], ctx["chunk"]
    parts = min(ctx["parts"], nrows)
    regs = [T.alloc_buffer((lanes,), F32, scope="local") for _ in range(nrows)]
    acc = [T.alloc_buffer((lanes,), F32, scope="local") for _ in range(parts)]
    for r, reg in enumerate(regs):
        with T.vectorized(0, lanes) as w:
            T.buffer_store(reg, state[(r0 + r) * vtile + c + w], [w])

    def operand(name, s, i):        # q, k (i: a row) or v (i: a lane) at step s, as float32
        if name in ctx["staged"] and mode != "direct":
            return st[name][s * (vtile if name == "v" else n_k) + (c + i if name == "v" else i)]
        return ops.load(name, ctx["b"], ctx["h"], _time(ctx, s0 + s),
                        ctx["col"](c + i) if name == "v" else i)

    def decay_of(buf, s, row, w):   # the factor of state element (row, c + w) in buf's row s
        if spec.decay == "key":
            return buf[s * gw + row]
        return buf[s * gw + c + w] if spec.decay == "value" else buf[s]

    with T.serial(0, size) as s:
        if mode == "rescaled":   # a chunk starts: U = E S (its whole decay, ahead of time)
            with T.If(s % chunk == 0):
                with T.Then():
                    for r, reg in enumerate(regs):
                        with T.vectorized(0, lanes) as w:
                            T.buffer_store(reg, reg[w] * decay_of(st["E"], s // chunk, r0 + r, w),
                                           [w])
        for p in range(parts):
            with T.vectorized(0, lanes) as w:
                T.buffer_store(acc[p], _c(0.0), [w])
        for r, reg in enumerate(regs):
            row = r0 + r
            with T.vectorized(0, lanes) as w:
                kv = operand("k", s, row) * operand("v", s, w)
                old = reg[w] * decay_of(st["g"], s, row, w) if mode == "direct" else reg[w]
                T.buffer_store(reg, old + kv, [w])
                a = acc[r % parts]
                T.buffer_store(a, a[w] + operand("q", s, row) * reg[w], [w])
        with T.vectorized(0, lanes) as w:
            y = acc[0][w]
            for p in range(1, parts):
                y = y + acc[p][w]
            i = s * vtile + c + w
            if role in ("middle", "last"):
                y = st["o"][i] + y
            if role in ("first", "middle"):
                T.buffer_store(st["o"], y, [i])
            else:
                if mode == "rescaled" and spec.decay == "value":
                    y = y * st["G"][i] * st["R"][s // chunk * vtile + c + w]
                ops.store("o", y, ctx["b"], ctx["h"], _time(ctx, s0 + s), ctx["col"](c + w))
    for r, reg in enumerate(regs):
        with T.vectorized(0, lanes) as w:
            T.buffer_store(state, reg[w], [(r0 + r) * vtile + c + w])


def _prefetch_row(ctx, step):
    """Prefetch the cache lines of step ``step`` (clamped to the last) of q, k, v, g, and of o
    to be written."""
    spec, ops, b, h, col = (ctx[k] for k in ("spec", "ops", "b", "h", "col"))
    t = _time(ctx, tirx.min(step, ops.length - 1))
    widths = {"q": spec.key, "k": spec.key, "v": ctx["vtile"], "o": ctx["vtile"],
              "g": {"none": 0, "scalar": 1, "key": spec.key, "value": ctx["vtile"]}[spec.decay]}
    for name, width in widths.items():
        for i in range(0, width, 16):
            per_column = name in ("v", "o") or spec.decay == "value" and name == "g"
            ops.prefetch(name, b, h, t, col(i) if per_column else i, ctx["locality"],
                         write=name == "o")
