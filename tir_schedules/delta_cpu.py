"""CPU realization of the delta-rule scan (``DeltaScanSpec``; LLVM target).

Tasks (batch, head, column tile) run in parallel; each walks L sequentially with its ``lanes``
columns of the K x V state in a local buffer (K x lanes float32: 8 KB at K = 128, 16 lanes, so
it stays in L1), the columns in vector lanes.  A step, in float32, for the task's columns:

    (l2norm: q, k, p divided by their norms; q scaled)       K-vectors, scalar work
    S = D S;  r = p^T S                                       one pass over the tile
    u = beta (v - r);  S = S + k u^T;  o = q^T S              a second pass

so 4 K multiply-adds per column a step and nothing of size (B, H, L, K, V) exists.  The DPLR
rule reads before it decays: ``r = a^T S; S = D S`` in the first pass, ``S = S + b r^T + k v^T;
o = q^T S`` in the second.  Every
task of a head recomputes the head's K-vectors (K flops, against the K x lanes of its tile).
Columns past V are clamped to V - 1 (those lanes recompute and rewrite the last column).
"""
from contextlib import contextmanager

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import DeltaScanSpec, static_or

from .layout import buffer_layout, extent_vars, from_f32, named, to_f32

NAME = "delta_cpu"
TARGET = "cpu"
FORM = "delta"
F32 = "float32"
L2_EPS = 1e-6          # under the root, as fla's l2norm


def applies(spec):
    return isinstance(spec, DeltaScanSpec)


def default_config(spec, cores=2):
    """16 columns a task (one AVX-512 vector, two AVX2 ones), fewer when V is smaller (the
    next power of two), halved down to 4 while there are fewer than 2 tasks per core."""
    lanes = 16
    while lanes > 1 and lanes // 2 >= spec.value:
        lanes //= 2
    heads = static_or(spec.batch, 1 << 30) * spec.heads
    while lanes > 4 and heads * -(-spec.value // lanes) < 2 * cores:
        lanes //= 2
    return {"lanes": lanes}


def _c(x):
    return tirx.const(x, F32)


class _Task:
    """Columns ``first + [0, lanes)`` of head ``(b, h)``, walked over L."""

    def __init__(self, spec, bufs, b, h, first, lanes, length, writes_last, clamp):
        self.spec, self.bufs, self.b, self.h, self.first, self.lanes = spec, bufs, b, h, first, lanes
        self.hk = h // spec.group
        self.length, self.clamp = length, clamp
        self.writes_last = writes_last
        key = spec.key
        self.S = named("S", T.alloc_buffer((key * lanes,), F32, scope="local"))
        self.vec = {n: named(n + "_t", T.alloc_buffer((key,), F32, scope="local")) for n in self._vectors()}
        self.read = named("read", T.alloc_buffer((lanes,), F32, scope="local"))
        self.acc = named("acc", T.alloc_buffer((lanes,), F32, scope="local"))
        if spec.is_dplr:
            self.vcol = named("vcol", T.alloc_buffer((lanes,), F32, scope="local"))
        self.sc = named("sc", T.alloc_buffer((4,), F32, scope="local"))     # |q|^2, |k|^2, |p|^2, beta

    def _vectors(self):
        return self._loaded() + (["d"] if self.spec.decay == "key" else [])

    def _loaded(self):
        """The per-step K-vectors read from their buffers."""
        spec = self.spec
        return ["q", "k"] + (["p"] if spec.separate_read else []) + (["a", "b"] if spec.is_dplr else [])

    def col(self, w):
        c = self.first + w
        return tirx.min(c, self.spec.value - 1) if self.clamp else c

    def time(self, s):
        return self.length - 1 - s if self.spec.reverse else s

    def _ld(self, name, *idx):
        return to_f32(self.bufs[name][list(idx)], self.spec.dtype)

    @contextmanager
    def _lanes(self):
        with T.vectorized(0, self.lanes) as w:
            yield w

    def emit(self):
        spec, bufs, b, h = self.spec, self.bufs, self.b, self.h
        with T.serial(0, spec.key) as r:
            with self._lanes() as w:
                start = bufs["S0"][b, h, r, self.col(w)] if spec.has_h0 else _c(0.0)
                T.buffer_store(self.S, start, [r * self.lanes + w])
        with T.serial(0, self.length) as s:
            named("step", s)
            self._step(self.time(s))
        if spec.return_last_state:
            with T.serial(0, spec.key) as r:
                with self._lanes() as w:
                    T.buffer_store(bufs["last_S"], self.S[r * self.lanes + w], [b, h, r, self.col(w)])

    def _load_vectors(self, t):
        """q, k (and p) of this step into local K-vectors, normalized and q scaled; the
        per-key decay ``exp(g)``."""
        spec, sc, b, hk = self.spec, self.sc, self.b, self.hk
        names = self._loaded()
        if spec.l2norm:
            for j, _ in enumerate(names):
                T.buffer_store(sc, _c(0.0), [j])
            with T.serial(0, spec.key) as r:
                for j, n in enumerate(names):
                    x = self._ld(n, b, hk, t, r)
                    T.buffer_store(sc, sc[j] + x * x, [j])
        with T.serial(0, spec.key) as r:
            for j, n in enumerate(names):
                x = self._ld(n, b, hk, t, r)
                if spec.l2norm:
                    x = x / T.sqrt(sc[j] + _c(L2_EPS))
                if n == "q" and spec.scale != 1.0:
                    x = x * _c(spec.scale)
                T.buffer_store(self.vec[n], x, [r])
            if spec.decay == "key":
                T.buffer_store(self.vec["d"], T.exp(self._ld("g", b, self.h, t, r)), [r])

    def _step(self, t):
        spec, b, h, S, lanes = self.spec, self.b, self.h, self.S, self.lanes
        self._load_vectors(t)
        if not spec.is_dplr:
            T.buffer_store(self.sc, self._ld("beta", b, h, t), [3])
        head_decay = T.exp(self._ld("g", b, h, t)) if spec.decay == "head" else None
        read = self.vec["a" if spec.is_dplr else "p" if spec.separate_read else "k"]
        with self._lanes() as w:
            T.buffer_store(self.read, _c(0.0), [w])
            T.buffer_store(self.acc, _c(0.0), [w])
        with T.serial(0, spec.key) as r:             # S = D S; read = p^T S (DPLR: the read first)
            d = self.vec["d"][r] if spec.decay == "key" else head_decay
            with self._lanes() as w:
                idx = r * lanes + w
                if spec.is_dplr:
                    T.buffer_store(self.read, self.read[w] + read[r] * S[idx], [w])
                if d is not None:
                    T.buffer_store(S, d * S[idx], [idx])
                if not spec.is_dplr:
                    T.buffer_store(self.read, self.read[w] + read[r] * S[idx], [w])
        if spec.is_dplr:
            self._dplr_update(t)
        else:
            with self._lanes() as w:                  # u = beta (v - read)
                T.buffer_store(self.read, self.sc[3] * (self._ld("v", b, h, t, self.col(w)) - self.read[w]), [w])
            with T.serial(0, spec.key) as r:         # S += k u^T; o = q^T S
                with self._lanes() as w:
                    idx = r * lanes + w
                    T.buffer_store(S, S[idx] + self.vec["k"][r] * self.read[w], [idx])
                    T.buffer_store(self.acc, self.acc[w] + self.vec["q"][r] * S[idx], [w])
        with self._lanes() as w:
            T.buffer_store(self.bufs["o"], from_f32(self.acc[w], spec.dtype), [b, h, t, self.col(w)])

    def _dplr_update(self, t):
        """S += b read^T + k v^T; o = q^T S (``acc``); v's columns staged in ``vcol``."""
        S, lanes, vec = self.S, self.lanes, self.vec
        with self._lanes() as w:
            T.buffer_store(self.vcol, self._ld("v", self.b, self.h, t, self.col(w)), [w])
        with T.serial(0, self.spec.key) as r:
            with self._lanes() as w:
                idx = r * lanes + w
                T.buffer_store(S, S[idx] + vec["b"][r] * self.read[w] + vec["k"][r] * self.vcol[w], [idx])
                T.buffer_store(self.acc, self.acc[w] + vec["q"][r] * S[idx], [w])


def generate(spec: DeltaScanSpec, lanes=16):
    """The PrimFunc ``scanweaver_scan``: parallel (batch, head, column tile) tasks."""
    if lanes < 1:
        raise ValueError(f"lanes: {lanes} < 1")
    tiles = -(-spec.value // lanes)
    resolve = extent_vars(spec)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            dtypes = spec.buffer_dtypes()
            shapes = {n: tuple(resolve(d) for d in s) for n, s in spec.buffer_shapes().items()}
            bufs = {n: T.arg(n, T.buffer(s, dtypes[n], layout=buffer_layout(s))) for n, s in shapes.items()}
            with T.sblock("root"):
                with T.parallel(0, resolve(spec.batch) * spec.heads * tiles) as task:
                    named("task", task)
                    bh, part = task // tiles, task % tiles
                    _Task(spec, bufs, bh // spec.heads, bh % spec.heads, part * lanes, lanes,
                          resolve(spec.length), part == 0, spec.value % lanes != 0).emit()
    return ib.get()
