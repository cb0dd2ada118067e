"""CUDA realization of the max-stabilized scan (``StabilizedScanSpec``).

A block owns ``tile`` channels of one batch row and splits L into ``chunks`` pieces, one thread
per (channel, chunk): adjacent threads hold adjacent channels, so time-major (B, L, C) loads
and stores are coalesced (channel-major ones are correct, strided).  Three phases, the monoid
written once (``algebra.log_compose`` / ``log_apply``):

1. each thread composes its chunk's steps into one element ``(w, m, n, d)`` (registers);
2. after one barrier through shared memory, it applies the elements of the chunks before its
   own to the initial state: the state entering its chunk (``chunks`` is small, <= 16);
3. it replays its chunk from that state, writing the readouts (and the chunk that ends the
   sequence writes the final state).

So every step is computed twice (phases 1 and 3) and L runs in ``L / chunks`` sequential steps
per thread.  ``exp`` is CUDA's ``expf``; each value the algebra uses twice is kept in a local
slot.  A channel past C loads channel C - 1 and stores nothing.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.algebra import LOG_FLOOR, LOG_IDENTITY, log_apply, log_compose, log_step
from scanweaver_core.spec import StabilizedScanSpec, static_or

from .layout import extent_vars, from_f32, grid, to_f32

NAME = "stabilized_gpu"
TARGET = "cuda"
FORM = "stabilized"
F32 = "float32"
SMS = 132


def _c(x):
    return tirx.const(x, F32)


def applies(spec):
    return isinstance(spec, StabilizedScanSpec)


def default_config(spec):
    """32 channels a block (one warp wide; fewer when C is small), and as many chunks (up to 16,
    each at least 16 steps) as it takes to put ~8 warps on every SM."""
    tile = 32
    while tile > 1 and tile // 2 >= spec.channels:
        tile //= 2
    blocks = static_or(spec.batch, 1 << 30) * -(-spec.channels // tile)
    chunks = 1
    while chunks < 16 and blocks * tile * chunks < SMS * 256 and static_or(spec.length, 1 << 30) // (2 * chunks) >= 16:
        chunks *= 2
    return {"tile": tile, "chunks": chunks}


class _Slots:
    """A value the algebra reads twice, computed once into a local slot."""

    def __init__(self, size):
        self.buf = T.alloc_buffer((size,), F32, scope="local")
        self.size, self.next = size, 0

    def reset(self):
        self.next = 0

    def keep(self, value):
        if self.next >= self.size:
            raise RuntimeError("stabilized_gpu: out of scratch slots")
        i = self.next
        self.next += 1
        T.buffer_store(self.buf, value, [i])
        return self.buf[i]

    def exp(self, x):
        return self.keep(T.exp(self.keep(x)))

    def maximum(self, x, y):
        return self.keep(tirx.max(x, y))


def generate(spec: StabilizedScanSpec, tile=32, chunks=8):
    """The PrimFunc ``scanweaver_scan`` for ``spec``."""
    if tile < 1 or chunks < 1 or tile * chunks > 1024:
        raise ValueError(f"tile {tile} x chunks {chunks}: a block holds 1 to 1024 threads")
    packs = -(-spec.channels // tile)
    resolve = extent_vars(spec)      # a symbolic batch or L: its int64 Var
    length = resolve(spec.length)
    size = (length + chunks - 1) // chunks
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            dtypes = spec.buffer_dtypes()
            bufs = {n: T.arg(n, T.buffer(tuple(resolve(d) for d in s), dtypes[n]))
                    for n, s in spec.buffer_shapes().items()}
            bx, tx = T.env_thread("blockIdx.x"), T.env_thread("threadIdx.x")
            # a root block: Relax's RewriteDataflowReshape probes a one-input kernel (the
            # den-only scan) and requires its body to be one (as stabilized_cpu)
            with T.sblock("root"):
                with T.launch_thread(bx, grid(resolve(spec.batch) * packs)):
                    with T.launch_thread(tx, tile * chunks):
                        _Kernel(spec, bufs, bx, tx, tile, chunks, packs, size, length).emit()
    return ib.get()


class _Kernel:  # pylint: disable=too-many-instance-attributes
    def __init__(self, spec, bufs, bx, tx, tile, chunks, packs, size, length):
        self.length = length
        self.spec, self.bufs, self.tile, self.chunks, self.size = spec, bufs, tile, chunks, size
        self.b, p = bx // packs, bx % packs
        lane, self.chunk = tx % tile, tx // tile
        self.channel = p * tile + lane
        self.c = tirx.min(self.channel, spec.channels - 1)
        self.lane = lane
        self.parts = 4 if spec.has_values else 3           # element (w, m, [n], d)
        self.shared = T.alloc_buffer((chunks * tile * self.parts,), F32, scope="shared")
        self.agg = T.alloc_buffer((4,), F32, scope="local")
        self.state = T.alloc_buffer((3,), F32, scope="local")   # num, den, max
        self.par = T.alloc_buffer((2,), F32, scope="local")     # w, u per channel
        self.slots = _Slots(24)

    def seq(self, t):
        return [self.b, t, self.c] if self.spec.layout == "time_major" else [self.b, self.c, t]

    def time(self, s):
        return self.length - 1 - s if self.spec.reverse else s

    def loads(self, s):
        t, spec = self.time(s), self.spec
        k = self.slots.keep(to_f32(self.bufs["k"][self.seq(t)], spec.dtype))
        v = self.slots.keep(to_f32(self.bufs["v"][self.seq(t)], spec.dtype)) if spec.has_values else None
        w = {"none": _c(0.0), "channel": self.par[0]}.get(spec.decay) if spec.decay != "step" else \
            self.slots.keep(to_f32(self.bufs["w"][self.seq(t)], spec.dtype))
        return w, k, v

    def _agg(self):
        a = self.agg
        return a[0], a[1], a[2] if self.spec.has_values else None, a[3]

    def _set_agg(self, elem):
        for i, x in enumerate(elem):
            if x is not None:
                T.buffer_store(self.agg, x, [i])

    def _state(self):
        s = self.state
        return s[0] if self.spec.has_values else None, s[1], s[2]

    def _set_state(self, state):
        for i, x in enumerate(state):
            if x is not None:
                T.buffer_store(self.state, x, [i])

    def emit(self):
        spec, tile, slots = self.spec, self.tile, self.slots
        ops = (slots.exp, slots.maximum)
        if spec.decay == "channel":
            T.buffer_store(self.par, self.bufs["w"][self.c], [0])
        if spec.has_bonus:
            T.buffer_store(self.par, self.bufs["u"][self.c], [1])
        lo = tirx.min(self.chunk * self.size, self.length)
        hi = tirx.min(lo + self.size, self.length)
        # 1. this chunk's element
        self._set_agg([_c(x) for x in LOG_IDENTITY])
        with T.serial(lo, hi) as s:
            slots.reset()
            w, k, v = self.loads(s)
            self._set_agg(log_compose(self._agg(), log_step(w, k, v), *ops))
        names = [0, 1, 2, 3] if spec.has_values else [0, 1, 3]
        for j, i in enumerate(names):
            T.buffer_store(self.shared, self.agg[i], [(self.chunk * tile + self.lane) * self.parts + j])
        T.evaluate(T.tvm_storage_sync("shared"))
        # 2. the state entering this chunk: the initial one, then the chunks before it
        start = {"num": _c(0.0), "den": _c(0.0), "max": _c(LOG_FLOOR)}
        for i, name in enumerate(["num", "den", "max"]):
            given = spec.has_h0 and (name != "num" or spec.has_values)
            T.buffer_store(self.state, self.bufs[f"{name}0"][self.b, self.c] if given else start[name], [i])
        with T.serial(0, self.chunk) as j:
            slots.reset()
            base = (j * tile + self.lane) * self.parts
            got = [self.shared[base + x] for x in range(self.parts)]
            elem = (got[0], got[1], got[2], got[3]) if spec.has_values else (got[0], got[1], None, got[2])
            self._set_state(log_apply(elem, self._state(), *ops))
        # 3. replay, writing the readouts
        with T.serial(lo, hi) as s:
            slots.reset()
            w, k, v = self.loads(s)
            out = None
            if spec.has_bonus:
                read = log_apply(log_step(_c(0.0), self.par[1] + k, v), self._state(), *ops)
                out = slots.keep(_readout(read))
            self._set_state(log_apply(log_step(w, k, v), self._state(), *ops))
            if out is None:
                out = _readout(self._state())
            with T.If(self.channel < spec.channels):
                with T.Then():
                    T.buffer_store(self.bufs["out"], from_f32(out, spec.dtype), self.seq(self.time(s)))
        if spec.return_last_state:
            with T.If(tirx.all(self.channel < spec.channels, self.chunk == self.chunks - 1)):
                with T.Then():
                    for i, name in enumerate(["num", "den", "max"]):
                        if name in spec.state_names():
                            T.buffer_store(self.bufs[f"last_{name}"], self.state[i], [self.b, self.c])


def _readout(state):
    num, den, top = state
    return num / den if num is not None else top + T.log(den)
