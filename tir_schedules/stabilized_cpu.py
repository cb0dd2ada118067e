"""CPU realization of the max-stabilized scan (``StabilizedScanSpec``; LLVM target).

Every lane (batch, channel) is an independent recurrence over three float32 numbers
``(num', den', max)``, and a step is a handful of operations (two exps, a max, four
multiply-adds), so the kernel streams memory: a task owns ``group`` *packs* of ``lanes``
channels of one batch row, keeps their states in local buffers (one vector each) and walks L
sequentially (backwards when reversed), one vector step per pack and time step; tasks run in
parallel.  Time-major (B, L, C) operands are read and written with contiguous vector accesses
(a task's packs in turn, so a step reads ``group * lanes`` contiguous channels); channel-major
(B, C, L) ones are staged through a local tile of ``tile`` steps per channel (rows loaded and
stored contiguously along t) so the step itself stays vectorized across the pack.

The step is ``algebra.log_apply`` (the monoid written once) with this kernel's ``exp`` and
``max``: each of them stores its value into a slot of a small local vector buffer and returns
the load, so a value the algebra uses twice (``e1``, ``e2``, the new max) is computed once.
``exp`` is ``fast_math``'s float32 polynomial (LLVM lowers ``exp`` to one scalar libm
call per element), 0 below -87.3 (where float32's exp underflows; the polynomial would clamp
to 2**-126 there), so an empty sum (all keys -inf) stays 0 and its log -inf.  The den-only
output ``max + log(den')`` uses TVM's ``log`` (one per output element).

A pack that overhangs C clamps its channels to C - 1 (those lanes recompute and rewrite the
last channel: branch-free).  Nothing but the outputs is written to memory.
"""
from contextlib import contextmanager

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import LOG_FLOOR, log_apply, log_step
from scanweaver_core.spec import StabilizedScanSpec, static_or

from .layout import buffer_layout, extent_vars, from_f32, named, to_f32
from .fast_math import exp as poly_exp

NAME = "stabilized_cpu"
TARGET = "cpu"
FORM = "stabilized"
F32 = "float32"
EXP_UNDERFLOW = -87.33   # exp(x) < 2**-126 below this: 0


def _c(x):
    return tirx.const(x, F32)


@contextmanager
def _each_lane(group, lanes):
    if group == 1:
        with T.vectorized(0, lanes) as w:
            yield w
    else:
        with T.serial(0, group) as j:
            with T.vectorized(0, lanes) as w:
                yield j * lanes + w


def applies(spec):
    return isinstance(spec, StabilizedScanSpec)


def default_config(spec, cores=2):
    """16 channels per pack (one AVX-512 vector, two AVX2 ones) when C has them, else the next
    power of two at or above C.  Time-major: a task walks as many packs of its batch row per
    step as leaves 2 tasks per core (a whole row of 768 channels: contiguous 3 KB per step
    and stream; one pack per task strides 3 KB per step and was 3.5x slower, measured at
    (8, 1024, 768) on 2 cores: 12 ms against 43 ms).  Channel-major: one pack per task, halved
    (down to 4 lanes) while there are fewer packs than 2 per core, tiles of 64 steps."""
    lanes = 16
    while lanes > 1 and lanes // 2 >= spec.channels:
        lanes //= 2
    packs = -(-spec.channels // lanes)
    if spec.layout == "time_major":
        splits = min(packs, -(-2 * cores // static_or(spec.batch, 1 << 30)))
        return {"lanes": lanes, "tile": 64, "group": -(-packs // splits)}
    while lanes > 4 and static_or(spec.batch, 1 << 30) * -(-spec.channels // lanes) < 2 * cores:
        lanes //= 2
    return {"lanes": lanes, "tile": 64, "group": 1}


def generate(spec: StabilizedScanSpec, lanes=16, tile=64, group=1, native_exp=False):
    """The PrimFunc ``scanweaver_scan`` for ``spec``; a task owns ``group`` packs (time-major
    only: one step then reads ``group * lanes`` contiguous channels)."""
    if spec.layout == "channel_major" or group < 1:
        group = 1
    group = min(group, -(-spec.channels // lanes))
    packs = -(-spec.channels // (lanes * group))
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            dtypes = spec.buffer_dtypes()
            resolve = extent_vars(spec)    # a symbolic batch or L: its int64 Var
            shapes = {n: tuple(resolve(d) for d in s) for n, s in spec.buffer_shapes().items()}
            bufs = {n: T.arg(n, T.buffer(s, dtypes[n], layout=buffer_layout(s))) for n, s in shapes.items()}
            # a root block: a one-input kernel of one same-sized output is probed by Relax's
            # RewriteDataflowReshape, whose HasReshapePattern requires the body to be a block
            with T.sblock("root"):
                with T.parallel(0, resolve(spec.batch) * packs) as task:
                    named("task", task)
                    _Pack(spec, bufs, task // packs, task % packs, (lanes, group), tile, native_exp,
                          resolve(spec.length)).emit()
    return ib.get()


class _Pack:
    """One task: ``lanes`` channels of batch row ``b``, the whole sequence."""

    def __init__(self, spec, bufs, b, p, lanes, tile, native_exp, length):
        self.length = length
        (self.lanes, self.group), lanes = lanes, lanes[0] * lanes[1]
        self.width = lanes                                    # channels of this task
        self.spec, self.bufs, self.b, self.tile = spec, bufs, b, tile
        self.native_exp = native_exp
        self.p = p
        self.clamp = spec.channels % lanes != 0
        self.parts = spec.state_names()                       # num (with values), den, max
        self.state = named("state", T.alloc_buffer((3 * lanes,), F32, scope="local"))
        self.par = named("par", T.alloc_buffer((2 * lanes,), F32, scope="local"))   # w, u
        self.scratch = named("scratch", T.alloc_buffer((16 * lanes,), F32, scope="local"))
        self.slot = 0
        if spec.layout == "channel_major":
            rows = ["k"] + (["v"] if spec.has_values else []) + (["w"] if spec.decay == "step" else [])
            self.rows = {n: i for i, n in enumerate(rows + ["out"])}
            self.stage = named("stage", T.alloc_buffer((len(self.rows) * lanes * tile,), F32, scope="local"))

    def each_lane(self):
        """The task's channels: ``group`` packs in turn, each one vector."""
        return _each_lane(self.group, self.lanes)

    def chan(self, w):
        c = self.p * self.width + w
        return tirx.min(c, self.spec.channels - 1) if self.clamp else c

    def seq(self, c, t):
        return [self.b, t, c] if self.spec.layout == "time_major" else [self.b, c, t]

    def time(self, s):
        return self.length - 1 - s if self.spec.reverse else s

    # this kernel's exp and max for the algebra: computed once into a scratch slot
    def _keep(self, value, w):
        index = self.slot * self.width + w
        self.slot += 1
        T.buffer_store(self.scratch, value, [index])
        return self.scratch[index]

    def emit(self):
        spec, lanes = self.spec, self.width
        with self.each_lane() as w:
            c = self.chan(w)
            start = {"num": _c(0.0), "den": _c(0.0), "max": _c(LOG_FLOOR)}
            for i, name in enumerate(["num", "den", "max"]):
                value = self.bufs[f"{name}0"][self.b, c] if spec.has_h0 and name in self.parts else start[name]
                T.buffer_store(self.state, value, [i * lanes + w])
            if spec.decay == "channel":
                T.buffer_store(self.par, self.bufs["w"][c], [w])
            if spec.has_bonus:
                T.buffer_store(self.par, self.bufs["u"][c], [lanes + w])
        if spec.layout == "time_major":
            with T.serial(0, self.length) as s:
                named("step", s)
                t = self.time(s)
                with self.each_lane() as w:
                    loads = {n: to_f32(self.bufs[n][self.seq(self.chan(w), t)], spec.dtype)
                             for n in ("k", "v", "w") if self._per_step(n)}
                    out = self._step(w, loads)
                    T.buffer_store(self.bufs["out"], from_f32(out, spec.dtype), self.seq(self.chan(w), t))
        else:
            # full tiles in a loop, then the tail (PrimExprs when L is symbolic)
            full, rest = self.length // self.tile, self.length % self.tile
            if not isinstance(full, int) or full:
                with T.serial(0, full) as j:
                    self._tile(j * self.tile, self.tile)
            if not isinstance(rest, int) or rest:
                self._tile(full * self.tile, rest)
        if spec.return_last_state:
            with self.each_lane() as w:
                for i, name in enumerate(["num", "den", "max"]):
                    if name in self.parts:
                        T.buffer_store(self.bufs[f"last_{name}"], self.state[i * lanes + w],
                                       [self.b, self.chan(w)])

    def _per_step(self, name):
        return name == "k" or (name == "v" and self.spec.has_values) or (name == "w" and self.spec.decay == "step")

    def _tile(self, s0, size):
        """``size`` steps from step ``s0`` of a channel-major scan: stage the rows (contiguous
        along t, in processing order), step across the pack, write the output rows."""
        spec, lanes, tile = self.spec, self.lanes, self.tile

        def row(name, w, i):
            return (self.rows[name] * lanes + w) * tile + i

        along_t = T.vectorized if isinstance(size, int) else T.serial   # (a symbolic tail: serial)

        with T.unroll(0, lanes) as w:
            with along_t(0, size) as i:
                for name in self.rows:
                    if name != "out":
                        value = to_f32(self.bufs[name][self.seq(self.chan(w), self.time(s0 + i))], spec.dtype)
                        T.buffer_store(self.stage, value, [row(name, w, i)])
        with T.serial(0, size) as i:
            with T.vectorized(0, lanes) as w:
                loads = {n: self.stage[row(n, w, i)] for n in self.rows if n != "out"}
                T.buffer_store(self.stage, self._step(w, loads), [row("out", w, i)])
        with T.unroll(0, lanes) as w:
            with along_t(0, size) as i:
                T.buffer_store(self.bufs["out"], from_f32(self.stage[row("out", w, i)], spec.dtype),
                               self.seq(self.chan(w), self.time(s0 + i)))

    def _step(self, w, loads):
        """One step of lane ``w`` (inside the vectorized loop): the state updated in place,
        returns the output (float32)."""
        spec, lanes = self.spec, self.width
        self.slot = 0
        exp = self._exp_of(w)

        def maximum(x, y):
            return self._keep(tirx.max(x, y), w)

        k = self._keep(loads["k"], w)
        v = self._keep(loads["v"], w) if spec.has_values else None
        decay = {"none": _c(0.0), "channel": self.par[w]}.get(spec.decay) if spec.decay != "step" else loads["w"]
        state = (self.state[w] if spec.has_values else None, self.state[lanes + w], self.state[2 * lanes + w])
        out = None
        if spec.has_bonus:            # read before the update, with the bonus step
            read = log_apply(log_step(_c(0.0), self.par[lanes + w] + k, v), state, exp, maximum)
            out = self._keep(self._readout(read), w)   # kept: the state is overwritten next
        num, den, top = log_apply(log_step(decay, k, v), state, exp, maximum)
        if num is not None:
            T.buffer_store(self.state, num, [w])
        T.buffer_store(self.state, den, [lanes + w])
        T.buffer_store(self.state, top, [2 * lanes + w])
        if out is None:
            out = self._readout((self.state[w] if spec.has_values else None, self.state[lanes + w],
                                 self.state[2 * lanes + w]))
        return out

    def _exp_of(self, w):
        def exp(x):
            if self.native_exp:
                return self._keep(T.exp(x), w)
            x = self._keep(x, w)
            return self._keep(tirx.Select(x < _c(EXP_UNDERFLOW), _c(0.0), poly_exp(x)), w)
        return exp

    @staticmethod
    def _readout(state):
        num, den, top = state
        return num / den if num is not None else top + T.log(den)
