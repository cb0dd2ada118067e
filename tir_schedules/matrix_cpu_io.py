"""Data movement of the CPU matrix-scan kernel (``matrix_cpu``): its arguments, a time tile's
rows staged as float32, the outputs written through the epilogue, and prefetches.

Both layouts of ``MatrixScanSpec`` are read with contiguous vector loads.  Time-major, a step's
row of an operand is contiguous: a tile is staged step by step, each row one vector load.
Channel-major (time innermost, Mamba's layout), each row of the operand along t is contiguous:
the tile is staged row by row, each one vector load along t.  In the stage, a step's values
over the V tile (v, dt, dt * v, o, a decay) lie together in either layout, as the register
blocks read them (a vector per step); q, k and a key decay, read one number at a time, keep
the operand's order (step-major time-major, row-major channel-major) unless they are
rescaled, which works on a step's row.  So channel-major the transpose happens once, in the
task's local memory, as the tile is staged and written out: a scattered store per value
(LLVM writes a strided vector one lane at a time).  At Mamba's shape that costs what
``selective_cpu``'s gathers cost; at GLA's (K = V = 64, every operand 64 rows of a few cache
lines per tile) the channel-major kernel takes about twice the time-major one's time.  (The
direct recurrence a rescaled tile falls back to reads the rescaled operands where they lie,
one number per column channel-major: slow, but only where a decay leaves the rescaled range.)

The epilogue ``o = (o + D * v) * silu(z)`` is applied where o goes to memory: time-major as the
register block writes a finished step, channel-major as the tile's staged output rows go out
contiguous along t.  Under the selective decay the stage holds dt' = softplus(dt + dt_bias)
(each optional) and dt' * v, computed as the rows are staged.
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .layout import buffer_layout, extent_vars, matrix_index
from .fast_math import silu, softplus

F32 = "float32"


class Operands:
    """The PrimFunc's arguments (``spec.buffer_shapes()`` order) and their float32 loads,
    stores and prefetches by logical index (``layout.matrix_index``)."""

    def __init__(self, spec):
        resolve = extent_vars(spec)
        self.spec, self.batch, self.length = spec, resolve(spec.batch), resolve(spec.length)
        self.channel_major = spec.layout == "channel_major"
        dtypes = {**spec.operand_dtypes(), "o": spec.dtype, "last": spec.dtype}
        self.bufs = {}
        for name, shape in spec.buffer_shapes().items():
            dims = tuple(resolve(d) for d in shape)
            self.bufs[name] = T.arg(name, T.buffer(dims, dtypes[name], layout=buffer_layout(dims)))

    def index(self, name, *idx):
        """The buffer index of logical element ``idx`` of ``name`` (``layout.matrix_index``)."""
        return matrix_index(self.spec, name, *idx)

    def load(self, name, *idx):
        x = self.bufs[name][tuple(self.index(name, *idx))]
        return x if x.ty.dtype == F32 else tirx.Cast(F32, x)

    def store(self, name, value, *idx):
        buf = self.bufs[name]
        T.buffer_store(buf, value if buf.dtype == F32 else tirx.Cast(buf.dtype, value),
                       self.index(name, *idx))

    def prefetch(self, name, locality, *idx):
        """Ask for the cache line of an element (LLVM locality 3: L1, 2: L2), to write (``o``:
        the line is owned when it is stored) or to read."""
        addr = tirx.address_of(self.bufs[name][tuple(self.index(name, *idx))])
        T.evaluate(tirx.call_intrin("void", "tirx.prefetch", addr, int(name == "o"), locality, 1))


def time_of(ctx, step):
    """Tensor time index of the ``step``-th step processed (reverse scans run backwards)."""
    return ctx["ops"].length - 1 - step if ctx["spec"].reverse else step


def slot(ctx, name, s, i):
    """Where value ``i`` (a row of q, k; a column of the V tile; a lane of the decay) of
    tile step ``s`` lies in the stage buffer ``name``: step-major, but row-major for the
    operands in ``ctx["row_major"]``."""
    if name in ctx["row_major"]:
        return i * ctx["tile"] + s
    return s * ctx["widths"][name] + i


def _along(size):
    """The loop over a tile's steps when it is a vector: vectorized at a constant extent."""
    return T.vectorized if isinstance(size, int) else T.serial


def stage(ctx, s0, size):
    """Stage steps ``s0 .. s0+size`` of q, k, v (those in ``ctx["staged"]``), of g, and under
    the selective decay dt' and dt' * v, as float32 in processing order."""
    spec, ops, b, h, col, st = (ctx[k] for k in ("spec", "ops", "b", "h", "col", "stage"))
    n_k, vtile, selective = spec.key, ctx["vtile"], spec.decay == "selective"
    rows = [(n, n_k, lambda i: i) for n in "qk" if n in ctx["staged"]]   # (name, width, index)
    if "v" in ctx["staged"]:
        rows.append(("v", vtile, col))
    if spec.decay in ("scalar", "key", "value"):
        rows.append(("g", ctx["gw"], col if spec.decay == "value" else lambda i: i))

    def row(name, index, s, i):
        T.buffer_store(st[name], ops.load(name, b, h, time_of(ctx, s0 + s), index(i)),
                       [slot(ctx, name, s, i)])

    if not ops.channel_major:
        with T.serial(0, size) as s:
            for name, width, index in rows:
                with T.vectorized(0, width) as i:
                    row(name, index, s, i)
            if selective:
                with T.vectorized(0, vtile) as w:
                    _stage_dt(ctx, s0, s, w, (st["dt"], slot(ctx, "dt", s, w)))
        return
    for name, width, index in rows:
        with T.serial(0, width) as i:
            with _along(size)(0, size) as s:
                row(name, index, s, i)
    if selective:   # dt' computed on a contiguous row, then spread into the stage
        with T.serial(0, vtile) as w:
            with _along(size)(0, size) as s:
                _stage_dt(ctx, s0, s, w, (st["row"], s))


def _stage_dt(ctx, s0, s, w, scratch):
    """dt' of step ``s`` and column ``w`` into ``scratch`` (a ``(buffer, index)`` slot), then
    dt' and dt' * v into the stage.  The load is stored before softplus binds it: TVM's bf16
    legalization miscompiles a Let whose value loads bf16 (``selective_staging.stage_delta``)."""
    spec, ops, b, h, st = (ctx[k] for k in ("spec", "ops", "b", "h", "stage"))
    (buf, i), c, t = scratch, ctx["col"](w), time_of(ctx, s0 + s)
    dt = ops.load("dt", b, h, t, c)
    T.buffer_store(buf, dt + ops.load("dt_bias", h, c) if spec.has_dt_bias else dt, [i])
    if spec.dt_softplus:
        T.buffer_store(buf, softplus(buf[i]), [i])
    if buf is not st["dt"]:
        T.buffer_store(st["dt"], buf[i], [slot(ctx, "dt", s, w)])
    T.buffer_store(st["du"], buf[i] * ops.load("v", b, h, t, c), [slot(ctx, "du", s, w)])


def epilogue(ctx, y, z, t, column):
    """``y = (y + D * v) * silu(z)`` in place at step ``t`` of state column ``column``, for
    the skip and gate the spec has; ``y`` and ``z`` are ``(buffer, index)`` slots, ``z``
    receiving the gate first (the bf16 reason of ``_stage_dt``)."""
    spec, ops, b, h = (ctx[k] for k in ("spec", "ops", "b", "h"))
    (ybuf, yi), (zbuf, zi) = y, z
    if spec.has_skip:
        T.buffer_store(ybuf, ybuf[yi] + ops.load("D", h, column) * ops.load("v", b, h, t, column),
                       [yi])
    if spec.has_gate:
        T.buffer_store(zbuf, ops.load("z", b, h, t, column), [zi])
        T.buffer_store(ybuf, ybuf[yi] * silu(zbuf[zi]), [yi])


def has_epilogue(spec):
    return spec.has_skip or spec.has_gate


def write_out(ctx, s0, size):
    """Channel-major: the tile's staged output rows through the epilogue to ``o``, each
    column's row contiguous along t."""
    spec, ops, b, h, col, st = (ctx[k] for k in ("spec", "ops", "b", "h", "col", "stage"))
    tile = ctx["tile"]
    with T.serial(0, ctx["vtile"]) as w:
        with _along(size)(0, size) as s:
            t, y = time_of(ctx, s0 + s), st["o"][slot(ctx, "o", s, w)]
            if has_epilogue(spec):
                T.buffer_store(st["row"], y, [s])
                epilogue(ctx, (st["row"], s), (st["row"], tile + s), t, col(w))
                y = st["row"][s]
            ops.store("o", y, b, h, t, col(w))


def prefetch(ctx, s0, share, shares):
    """Prefetch share ``share`` of ``shares`` of the rows of the tile ``ctx["prefetch"]``
    tiles after the one at step ``s0`` (clamped to the last step): of q, k, v, g or dt, z, and
    of o to be written.  Time-major a share is some of its steps (every line of their rows),
    channel-major some rows of each operand (every line of the tile along t)."""
    spec, ops, b, h, col = (ctx[k] for k in ("spec", "ops", "b", "h", "col"))
    tile, vtile, locality = ctx["tile"], ctx["vtile"], ctx["locality"]
    ahead = s0 + ctx["prefetch"] * tile
    widths = {"q": spec.key, "k": spec.key, "v": vtile, "o": vtile,
              "g": {"scalar": 1, "key": spec.key, "value": vtile}.get(spec.decay, 0),
              "dt": vtile if spec.decay == "selective" else 0,
              "z": vtile if spec.has_gate else 0}
    per_column = {"v", "o", "dt", "z"} | ({"g"} if spec.decay == "value" else set())
    widths = {n: w for n, w in widths.items() if w}

    def at(name, step, i):
        t = time_of(ctx, tirx.min(step, ops.length - 1))
        ops.prefetch(name, locality, b, h, t, col(i) if name in per_column else i)

    if not ops.channel_major:
        with T.serial(share * tile // shares, (share + 1) * tile // shares) as s:
            for name, width in widths.items():
                for i in range(0, width, 16):
                    at(name, ahead + s, i)
        return
    for name, width in widths.items():
        with T.serial(share * width // shares, (share + 1) * width // shares) as i:
            for s in range(0, tile, 16):
                at(name, ahead + s, i)
