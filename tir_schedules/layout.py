"""Indexing of a plain affine scan's operands, shared by every plain realization.

A spec's tensors are N-d with the scan axis anywhere and ``a`` broadcast against ``b``.  The
kernels see them through views whose non-axis dimensions are merged where that changes nothing
(adjacent dimensions on the same side of the axis with the same broadcast flag), so a lane's
coordinates cost one or two div/mods, and the innermost coordinate is contiguous in memory.
The argument buffers keep the spec's own shapes, so ``call_tir`` passes tensors unchanged.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import AffineScanSpec


def _merge(dims):
    """Merge adjacent (extent, broadcast) dims with the same flag."""
    merged = []
    for extent, bcast in dims:
        if merged and merged[-1][1] == bcast:
            merged[-1] = (merged[-1][0] * extent, bcast)
        else:
            merged.append((extent, bcast))
    return merged


class ScanLayout:
    """Declares a plain scan's PrimFunc arguments and indexes them by (lane, step).

    Use inside ``T.prim_func()``: ``lay = ScanLayout(spec)`` declares ``a, b, [h0], [states],
    [last]`` in that order (the repo-wide argument convention) plus their merged views.
    """

    def __init__(self, spec: AffineScanSpec):
        self.spec = spec
        ax = spec.axis
        self.length = spec.length if spec.length is not None else tirx.Var("L", "int64")
        shape = tuple(self.length if i == ax else n for i, n in enumerate(spec.shape))
        a_shape = tuple(self.length if (i == ax and n != 1) else n for i, n in enumerate(spec.a_shape))
        flags = [(n, spec.a_shape[i] == 1) for i, n in enumerate(spec.shape)]
        self.outer = _merge(flags[:ax])
        self.inner = _merge(flags[ax + 1:])
        self.a_varies_in_time = spec.a_shape[ax] != 1
        self.lanes = spec.lanes
        self.inner_extent = spec.inner

        dt = spec.dtype
        self.a = T.arg("a", tirx.decl_buffer(a_shape, dt, "a"))
        self.b = T.arg("b", tirx.decl_buffer(shape, dt, "b"))
        self.h0 = T.arg("h0", tirx.decl_buffer(spec.state_shape, dt, "h0")) if spec.has_h0 else None
        self.states = (T.arg("states", tirx.decl_buffer(shape, dt, "states"))
                       if "states" in spec.outputs else None)
        self.last = (T.arg("last", tirx.decl_buffer(spec.state_shape, dt, "last"))
                     if "last" in spec.outputs else None)

    # -- views -------------------------------------------------------------------------------
    def declare_views(self):
        """Emit the merged views (once, at the top of the body, outside any kernel)."""
        o = [n for n, _ in self.outer]
        i = [n for n, _ in self.inner]
        ao = [1 if bc else n for n, bc in self.outer]
        ai = [1 if bc else n for n, bc in self.inner]
        la = self.length if self.a_varies_in_time else 1
        self.views = {}
        for name, buf, shape in [("a", self.a, ao + [la] + ai), ("b", self.b, o + [self.length] + i),
                                 ("states", self.states, o + [self.length] + i),
                                 ("h0", self.h0, o + i), ("last", self.last, o + i)]:
            if buf is not None:
                view = T.decl_buffer(shape, buf.dtype, data=buf.data)
                self.views[name] = IRBuilder.name(f"{name}_view", view)

    # -- indexing ----------------------------------------------------------------------------
    def coords(self, lane):
        """Merged (outer, inner) coordinates of a lane, innermost fastest."""
        extents = [n for n, _ in self.outer] + [n for n, _ in self.inner]
        out = []
        for n in reversed(extents):
            out.append(tirx.floormod(lane, n) if n > 1 else 0)
            lane = tirx.floordiv(lane, n) if n > 1 else lane
        return tuple(reversed(out))

    def time(self, step):
        """Tensor index of the ``step``-th element processed (reverse scans run backwards)."""
        return self.length - 1 - step if self.spec.reverse else step

    def _split(self, coords):
        k = len(self.outer)
        return list(coords[:k]), list(coords[k:])

    def _a_index(self, coords, t):
        o, i = self._split(coords)
        o = [0 if bc else c for c, (_, bc) in zip(o, self.outer)]
        i = [0 if bc else c for c, (_, bc) in zip(i, self.inner)]
        return o + [t if self.a_varies_in_time else 0] + i

    def load_pair(self, coords, t):
        """``(a_t, b_t)`` of a lane as float32 expressions."""
        o, i = self._split(coords)
        a = self.views["a"][tuple(self._a_index(coords, t))]
        b = self.views["b"][tuple(o + [t] + i)]
        return to_f32(a, self.spec.dtype), to_f32(b, self.spec.dtype)

    def load_h0(self, coords):
        """The lane's initial state (float32), zero without ``h0``."""
        if self.h0 is None:
            return tirx.const(0.0, "float32")
        return to_f32(self.views["h0"][tuple(coords)], self.spec.dtype)

    def store_state(self, coords, t, h):
        """Write state ``h`` (float32) at time ``t`` (when states are an output)."""
        if self.states is not None:
            o, i = self._split(coords)
            T.buffer_store(self.views["states"], from_f32(h, self.spec.dtype), o + [t] + i)

    def store_last(self, coords, h):
        if self.last is not None:
            T.buffer_store(self.views["last"], from_f32(h, self.spec.dtype), list(coords))


def build_plain(spec, emit_body):
    """A plain-scan PrimFunc ``scanweaver_scan``: arguments and views declared, then
    ``emit_body(layout)`` writes the schedule."""
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("scanweaver_scan")
            T.func_attr({"tirx.noalias": True})
            lay = ScanLayout(spec)
            lay.declare_views()
            emit_body(lay)
    return ib.get()


def to_f32(x, dtype):
    """Widen a load of ``dtype`` to the float32 accumulator."""
    return x if dtype == "float32" else tirx.Cast("float32", x)


def from_f32(x, dtype):
    """Narrow a float32 value to the output ``dtype``."""
    return x if dtype == "float32" else tirx.Cast(dtype, x)


def named(name, frame_value):
    """Give an IR-builder variable or buffer a readable name in the printed TIR."""
    return IRBuilder.name(name, frame_value)
