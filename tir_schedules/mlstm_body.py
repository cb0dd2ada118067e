"""The mLSTM scan's step, written once for its CPU and CUDA realizations (``MLSTMScanSpec``).

A *task* owns ``lanes`` columns of one (batch, head)'s state: those columns of ``C`` (K x
lanes floats), the whole normalizer ``n`` (K floats: every task of a head recomputes it, K
multiply-adds a step against the K x lanes of its columns) and the max ``m``, all in local
buffers, and walks L sequentially (backwards when reversed).  A step, in float32:

    m' = max(f + m, i);  a = exp(f + m - m');  e = exp(i - m')
    n = a n + e k;  C[:, cols] = a C[:, cols] + (e k) v[cols]^T;  y = q^T C[:, cols]
    h[cols] = y / (max(|q . n|, exp(-m')) + eps)        (y without ``normalized``)

with the columns innermost (``each_lane``: one vector on the CPU, one thread's column on CUDA).
Columns past V are clamped to V - 1 (those lanes recompute and rewrite the last column:
branch-free).  Nothing but the outputs is written to memory.
"""
from tvm import tirx
from tvm.script.ir_builder import tirx as T

from .layout import from_f32, named, to_f32

F32 = "float32"


def _c(x):
    return tirx.const(x, F32)


class MLSTMTask:
    """One task: columns ``first + [0, lanes)`` of head ``(b, h)``; ``each_lane()`` is a
    context manager over the lanes yielding the lane index (``lanes`` of them)."""

    def __init__(self, spec, bufs, b, h, first, lanes, each_lane, length, writes_shared_state, clamp):
        self.spec, self.bufs, self.b, self.h, self.first, self.lanes = spec, bufs, b, h, first, lanes
        self.clamp = clamp                                   # some task's columns pass V
        self.each_lane, self.length = each_lane, length
        self.writes_shared_state = writes_shared_state   # this task writes last_n and last_m
        key = spec.key
        self.C = named("C", T.alloc_buffer((key * lanes,), F32, scope="local"))
        self.n = named("n", T.alloc_buffer((key,), F32, scope="local"))
        self.vrow = named("vrow", T.alloc_buffer((lanes,), F32, scope="local"))
        self.acc = named("acc", T.alloc_buffer((lanes,), F32, scope="local"))
        self.sc = named("sc", T.alloc_buffer((6,), F32, scope="local"))   # m, m', a, e, q.n, den

    def col(self, w):
        c = self.first + w
        return tirx.min(c, self.spec.value - 1) if self.clamp else c

    def time(self, s):
        return self.length - 1 - s if self.spec.reverse else s

    def _ld(self, name, *idx):
        return to_f32(self.bufs[name][list(idx)], self.spec.dtype)

    def emit(self):
        spec, bufs, b, h = self.spec, self.bufs, self.b, self.h
        with T.serial(0, spec.key) as r:
            with self.each_lane() as w:
                start = bufs["C0"][b, h, r, self.col(w)] if spec.has_h0 else _c(0.0)
                T.buffer_store(self.C, start, [r * self.lanes + w])
            if spec.normalized:
                T.buffer_store(self.n, bufs["n0"][b, h, r] if spec.has_h0 else _c(0.0), [r])
        T.buffer_store(self.sc, bufs["m0"][b, h] if spec.has_h0 else _c(0.0), [0])
        with T.serial(0, self.length) as s:
            named("step", s)
            self._step(self.time(s))
        if spec.return_last_state:
            self._write_last()

    def _step(self, t):
        spec, sc, b, h = self.spec, self.sc, self.b, self.h
        f, i = self._ld("f", b, h, t), self._ld("i", b, h, t)
        m = sc[0]
        T.buffer_store(sc, tirx.max(f + m, i), [1])
        T.buffer_store(sc, T.exp(f + m - sc[1]), [2])
        T.buffer_store(sc, T.exp(i - sc[1]), [3])
        a, e = sc[2], sc[3]
        if spec.normalized:
            T.buffer_store(sc, _c(0.0), [4])
            with T.serial(0, spec.key) as r:
                T.buffer_store(self.n, a * self.n[r] + e * self._ld("k", b, h, t, r), [r])
                T.buffer_store(sc, sc[4] + self._ld("q", b, h, t, r) * self.n[r], [4])
            T.buffer_store(sc, tirx.max(tirx.abs(sc[4]), T.exp(-sc[1])) + _c(spec.eps), [5])
        with self.each_lane() as w:
            T.buffer_store(self.vrow, self._ld("v", b, h, t, self.col(w)), [w])
            T.buffer_store(self.acc, _c(0.0), [w])
        with T.serial(0, spec.key) as r:
            ek = e * self._ld("k", b, h, t, r)
            qr = self._ld("q", b, h, t, r)
            with self.each_lane() as w:
                idx = r * self.lanes + w
                T.buffer_store(self.C, a * self.C[idx] + ek * self.vrow[w], [idx])
                T.buffer_store(self.acc, self.acc[w] + qr * self.C[idx], [w])
        with self.each_lane() as w:
            y = self.acc[w] / sc[5] if spec.normalized else self.acc[w]
            T.buffer_store(self.bufs["h"], from_f32(y, spec.dtype), [b, h, t, self.col(w)])
        T.buffer_store(sc, sc[1], [0])

    def _write_last(self):
        spec, bufs, b, h = self.spec, self.bufs, self.b, self.h
        with T.serial(0, spec.key) as r:
            with self.each_lane() as w:
                T.buffer_store(bufs["last_C"], self.C[r * self.lanes + w], [b, h, r, self.col(w)])
        with T.If(self.writes_shared_state):
            with T.Then():
                if spec.normalized:
                    with T.serial(0, spec.key) as r:
                        T.buffer_store(bufs["last_n"], self.n[r], [b, h, r])
                T.buffer_store(bufs["last_m"], self.sc[0], [b, h])
