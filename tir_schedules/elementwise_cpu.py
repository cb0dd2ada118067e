"""A DLight-style CPU schedule rule for injective PrimFuncs (elementwise ops, layout ops and their
fused chains): one loop, in parallel, vectorized.

TVM 0.27's CPU pipeline leaves them as they are legalized: one serial loop nest per stage with
an intermediate buffer between stages.  Two things follow, both seen on whole models:

- they run on one core, as scalar code: xLSTM's soft-cap of the logits (``tanh(x / 30) * 30``
  over (L, vocab)) took 117 ms of a 586 ms call at L = 256;
- on AVX2 targets (``znver3``, ``haswell``), TVM's LLVM emits invalid IR for some of these
  two-stage nests (a fused ``silu``: "Instruction does not dominate all uses!", the module
  fails to build); with the stages inlined into one loop it builds.

So the rule inlines every stage it can into the last (DLight's ``try_inline``), but a costly
stage that a broadcast reads (``_computed_once``: computed first, once an element); when one
all-spatial block is left (or several, each writing one output: a ``split``'s sections), its
loops are fused, split into an outer loop (parallel once there is enough work) and an inner one
of ``LANES`` elements (vectorized when it divides the extent).  A block that transposes (its
innermost axis reads its input along another axis: the (B, D, L) <-> (B, L, D) layout changes
around convs and scans) is walked in 16 x 16 tiles instead.  With a symbolic length L, the
loops after it are fused and vectorized apart from it (a transpose's: the static axis).
Anything else (a reduction, an opaque block, stages that do not inline) returns None.
"""
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base.common_schedules import try_inline

from .cpu_rule import GuardedCPURule, elements

LANES = 16                 # float32 lanes of a 512-bit vector; LLVM splits them for narrower ISAs
PARALLEL_MIN = 1 << 14     # elements below which the thread pool costs more than it saves
TILE = 16                  # a transpose's square tile: 16 float32 = one 64-byte cache line a row
BROADCAST = 4              # a costly stage this many times smaller than the output is computed once
TRANSCENDENTAL = {f"tirx.{name}" for name in ("exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "tanh",
                                              "sigmoid", "erf", "pow", "sqrt", "rsqrt", "sin", "cos", "atan")}


class ElementwiseCPU(GuardedCPURule):
    """Fused, parallel, vectorized schedule of an injective PrimFunc on LLVM targets."""

    def schedule(self, func, target):
        return _schedule(func)


def _schedule(func):
    sch = s_tir.Schedule(func, error_render_level="none")   # (failed trials are expected: no error text)
    infos = normalize_prim_func(sch)
    if not infos or any(sch.get(info.block_rv).init is not None for info in infos):
        return None                # (a reduction over unit loops: normalized, it has no reduce axis
    once = _computed_once(sch, infos)  # left, but an epilogue inlined into it would join its init too)
    try_inline(sch, [info for info in infos if sch.get(info.block_rv).name_hint not in once])
    infos = normalize_prim_func(sch)
    if not infos or not all(info.is_injective() for info in infos) or not _independent(sch, infos, once):
        return None
    for info in infos:
        if not _tiled_transpose(sch, info):
            _parallel_vector_loop(sch, info.block_rv)
    return sch


def _computed_once(sch, infos):
    """The names of the stages kept out of the broadcast that reads them: a stage at least
    ``BROADCAST`` times smaller than the function's output, costly (it calls a transcendental,
    or reads a costly stage that is not computed once) and read by a larger stage or by
    several.  Inlined, it would be recomputed for every element it is broadcast to: a Mamba
    decode step's ``softplus(dt)``, per channel, read twice per (channel, state) element, was
    2 x 3 exp/log an element of the state."""
    blocks = [sch.get(info.block_rv) for info in infos]
    sizes = [elements(b.writes[0].source.shape) for b in blocks]
    once, costly = set(), set()
    for info, block, size in zip(infos, blocks, sizes):      # (in order: producers first)
        calls = []
        tvm_ffi.structural_walk(block.body, lambda n: calls.append(n.op.name) if isinstance(n, tvm.ir.Call)
                                and isinstance(n.op, tvm.ir.Op) else None)
        producers = {sch.get(b).name_hint for b in sch.get_producers(info.block_rv)}
        if not (any(c in TRANSCENDENTAL for c in calls) or producers & (costly - once)):
            continue
        costly.add(block.name_hint)
        readers = [elements(sch.get(b).writes[0].source.shape) for b in sch.get_consumers(info.block_rv)]
        if size * BROADCAST <= sizes[-1] < float("inf") and (len(readers) > 1 or any(n > size for n in readers)):
            once.add(block.name_hint)
    return once


def _transposed_iter(sch, info):
    """The block iter that is the last index of a read which the innermost iter indexes along
    another axis (``B[.., i, j] = A[.., j, i]``: a transpose), or None."""
    iters = info.iters
    if len(iters) < 2:
        return None
    inner = iters[-1].var
    for read in sch.get(info.block_rv).reads:
        index = [r.min for r in read.region]
        if len(index) < 2 or not any(_is_offset(x, inner) for x in index[:-1]):
            continue
        return next((it for it in iters[:-1] if it.var.same_as(index[-1])), None)
    return None


def _is_offset(index, var):
    """``index`` is ``var`` or ``var + c`` (a ``split``'s later sections read at an offset)."""
    if isinstance(index, tirx.Add) and isinstance(index.b, tirx.IntImm):
        index = index.a
    return index.same_as(var)


def _tiled_transpose(sch, info):
    """A transposing block in ``TILE x TILE`` tiles (its innermost axis and the one the input
    is contiguous in), so both the reads and the writes of a tile stay in cache lines already
    loaded; tiles in parallel, the innermost axis vectorized.  False when it is no transpose or
    one of its two axes is shorter than ``TILE`` (a symbolic one, L, counts as long)."""
    axis = _transposed_iter(sch, info)
    if axis is None:
        return False
    loops = [it.loop_rv for it in info.iters]
    spans = [sch.get(loop).extent for loop in loops]
    extents = [int(e) if isinstance(e, tirx.IntImm) else None for e in spans]   # None: symbolic (L)
    j = [it.var.same_as(axis.var) for it in info.iters].index(True)
    n_inner, n_axis = extents[-1], extents[j]
    if any(n is not None and n < TILE for n in (n_inner, n_axis)):
        return False
    inner_o, inner_i = sch.split(loops[-1], [None, TILE])
    axis_o, axis_i = sch.split(loops[j], [None, TILE])
    outer = loops[:j] + [axis_o] + loops[j + 1:-1] + [inner_o]
    if n_inner is None and n_axis is not None and n_axis % TILE == 0:
        sch.reorder(*outer, inner_i, axis_i)   # (a symbolic innermost axis cannot be vectorized:
        vector = axis_i                        # the input's rows are, written with a stride:
    else:                                      # 3-4x faster on (L, 6144) -> (6144, L) bf16)
        sch.reorder(*outer, axis_i, inner_i)
        vector = inner_i if n_inner is not None and n_inner % TILE == 0 else None
    fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    if elements(spans) >= PARALLEL_MIN:
        sch.parallel(fused)
    if vector is not None:
        sch.vectorize(vector)
    return True


def _independent(sch, infos, once=()):
    """Every block left writes a parameter of the function and reads none of the others' outputs
    (a ``split``'s sections: one block per output, each from the same input), but those of the
    stages computed ``once``, which come first."""
    blocks = [sch.get(info.block_rv) for info in infos]
    first = sum(b.name_hint in once for b in blocks)
    if any(b.name_hint in once for b in blocks[first:]):
        return False
    rest = blocks[first:]
    written = {b.writes[0].source for b in rest}
    for block in blocks:
        if len(block.writes) != 1 or any(r.source in written for r in block.reads):
            return False
    return len(rest) == 1 or all(_is_param(sch, b) for b in written)


def _is_param(sch, buffer):
    return any(buffer.same_as(p) for p in sch.mod["main"].params)


def _parallel_vector_loop(sch, block):
    """Fuse ``block``'s loops into one, split off ``LANES`` (vectorized when they divide it) and
    run the rest in parallel once there is enough work.  With a symbolic extent (L), the loops
    after the last symbolic one are fused apart when ``LANES`` divides them: all in one, every
    element would divide its index by L to find its place, and nothing could be vectorized."""
    loops = sch.get_loops(block)
    if not loops:
        return
    static = _static_suffix(sch, loops)
    if 0 < static < len(loops):
        outer = sch.fuse(*loops[:-static]) if len(loops) - static > 1 else loops[0]
        inner = sch.fuse(*loops[-static:]) if static > 1 else loops[-1]
        sch.parallel(outer)
        sch.vectorize(sch.split(inner, [None, LANES])[1])
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = sch.get(fused).extent
    size = int(extent) if isinstance(extent, tirx.IntImm) else None     # None: symbolic
    if size is not None and size < LANES:
        return
    outer, inner = sch.split(fused, [None, LANES])
    if size is None or size >= PARALLEL_MIN:
        sch.parallel(outer)
    if size is not None and size % LANES == 0:
        sch.vectorize(inner)


def _static_suffix(sch, loops):
    """How many innermost loops follow the last symbolic one, when ``LANES`` divides the product
    of their extents; else 0."""
    extents = [sch.get(loop).extent for loop in loops]
    count, size = 0, 1
    for extent in reversed(extents):
        if not isinstance(extent, tirx.IntImm):
            break
        count, size = count + 1, size * int(extent)
    return count if count < len(loops) and size % LANES == 0 else 0
