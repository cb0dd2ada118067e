"""Indexing of a plain affine scan's operands, shared by every plain realization.

A spec's tensors are N-d with the scan axis anywhere and ``a`` broadcast against ``b``.  The
kernels see them through views whose non-axis dimensions are merged where that changes nothing
(adjacent dimensions on the same side of the axis with the same broadcast flag), so a lane's
coordinates cost one or two div/mods, and the innermost coordinate is contiguous in memory.
The argument buffers keep the spec's own shapes, so ``call_tir`` passes tensors unchanged.
A symbolic extent is one int64 ``tirx.Var`` per distinct name (``extent_vars``), bare in the
argument shapes, so TVM's argument binder binds it from the tensors at call time.
"""
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from scanweaver_core.spec import AffineScanSpec, is_symbolic, symbol_identifiers, symbol_name


def extent_vars(spec):
    """``resolve(extent)``: an int extent as is, a symbolic one as its spec-wide int64 Var."""
    syms = {name: tirx.Var(ident, "int64") for name, ident in symbol_identifiers(spec).items()}
    return lambda extent: syms[symbol_name(extent)] if is_symbolic(extent) else extent


def buffer_layout(shape):
    """``layout=`` for a buffer of ``shape``: TVM's default, or none when an extent is symbolic.
    TVM 0.27's default layout spells the strides with the shape's vars, and Relax's
    AttachAttrLayoutFreeBuffers (in the CPU pipeline) copies PrimFuncs without renaming the
    vars inside layouts: the copy then uses vars it never binds (MakePackedAPI rejects it)."""
    return "default" if all(isinstance(d, int) for d in shape) else None


PER_STEP = ("q", "k", "v", "g", "dt", "z")   # a matrix scan's operands indexed (b, h, t, i)


def matrix_index(spec, name, *idx):
    """The buffer index of logical element ``idx`` of a matrix scan's argument ``name``: (b, h,
    t, i) for a per-step operand and ``o``, (b, h, row, column) for ``h0`` and ``last``, (h, row,
    column) for ``A``, (h, column) for ``dt_bias`` and ``D``.  A per-step operand reads index 0
    on the dims it broadcasts (1 in its logical shape: B, H, a constant decay's L); a
    channel-major buffer has its last two dims swapped (``MatrixScanSpec.layout``)."""
    idx = list(idx)
    if name in PER_STEP:
        shape = spec.logical_shapes()[name]
        idx[:3] = [0 if n == 1 else x for n, x in zip(shape[:3], idx[:3])]
    if spec.layout == "channel_major" and name not in ("dt_bias", "D"):
        idx[-2:] = idx[-1:-3:-1]
    return idx


def grid(extent):
    """A launch extent as the int32 that ``blockIdx``/``threadIdx`` are: a symbolic (int64)
    extent is narrowed (CUDA grids stay below 2**31 blocks anyway)."""
    return extent if isinstance(extent, int) else tirx.Cast("int32", extent)


def _is_one(n):
    return isinstance(n, int) and n == 1


def _product(extents):
    n = 1
    for d in extents:
        n = d if _is_one(n) else n * d
    return n


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
        resolve = extent_vars(spec)
        shape = tuple(resolve(n) for n in spec.shape)
        a_shape = tuple(resolve(n) for n in spec.a_shape)
        self.length = shape[ax]
        flags = [(n, _is_one(spec.a_shape[i])) for i, n in enumerate(shape)]
        self.outer = _merge(flags[:ax])
        self.inner = _merge(flags[ax + 1:])
        self.a_varies_in_time = not _is_one(spec.a_shape[ax])
        state = shape[:ax] + shape[ax + 1:]
        self.state_shape = state
        self.lanes = _product(state)              # an int, or a PrimExpr when symbolic
        self.inner_extent = _product(shape[ax + 1:])

        dt = spec.dtype
        def arg(name, shape):
            return T.arg(name, tirx.decl_buffer(shape, dt, name, layout=buffer_layout(shape)))

        self.a, self.b = arg("a", a_shape), arg("b", shape)
        self.h0 = arg("h0", state) if spec.has_h0 else None
        self.states = arg("states", shape) if "states" in spec.outputs else None
        self.last = arg("last", state) if "last" in spec.outputs else None

    def divisible(self, group):
        """Whether the lane count is a multiple of ``group`` for every value of its symbols."""
        if isinstance(self.lanes, int):
            return self.lanes % group == 0
        return isinstance(self.inner_extent, int) and self.inner_extent % group == 0

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
                view = T.decl_buffer(shape, buf.dtype, data=buf.data, layout=buffer_layout(shape))
                self.views[name] = IRBuilder.name(f"{name}_view", view)

    # -- indexing ----------------------------------------------------------------------------
    def coords(self, lane):
        """Merged (outer, inner) coordinates of a lane (``0 <= lane < lanes``), innermost
        fastest.  The outermost needs no modulo, which matters for a symbolic extent: TVM's
        floormod by a value of unknown sign is a chain of selects."""
        extents = [n for n, _ in self.outer] + [n for n, _ in self.inner]
        out = []
        for i, n in reversed(list(enumerate(extents))):
            out.append(0 if _is_one(n) else lane if i == 0 else tirx.floormod(lane, n))
            lane = lane if _is_one(n) else tirx.floordiv(lane, n)
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
