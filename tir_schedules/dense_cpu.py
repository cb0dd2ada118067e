"""A DLight-style CPU schedule rule for dense layers: matmul-like reductions, tiled for registers.

TVM 0.27's CPU pipeline schedules nothing: a legalized ``matmul`` (a Linear layer, the lm head,
``x_proj``) runs as its naive ``i, j, k`` loop nest, and a whole model is bound by it.  DLight's
CPU rules cover GEMV and reductions only, so this rule takes one fused PrimFunc whose main
block is ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` (any operand layout: the schedule is
correct for all, fast when ``j`` is contiguous in ``B`` and ``C``, as a folded weight is) and
gives it the classic register-blocked form:

- an ``MR x NR`` tile of ``C`` accumulated in a local buffer over all of ``k``
  (``NR`` = two vector registers of ``j``, ``MR`` rows unrolled),
- tiles over ``(batch, i, j)`` in parallel,
- producers inlined, the epilogue (bias, activation, residual) computed per tile while hot.

Anything it does not recognize returns ``None`` and is left to the next rule.
"""
import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight as dl

MR = 8
LANES = 16      # float32 lanes of a 512-bit vector; LLVM splits them for narrower ISAs
NR = 2 * LANES  # columns of C per register tile


def _iter_kinds(block):
    return [iv.iter_type for iv in block.iter_vars]


def _is_multiply_add(block):
    """``C[...] = C[...] + A[...] * B[...]`` (what ``matmul`` legalizes to), with an init."""
    store = block.body
    if block.init is None or not isinstance(store, tirx.BufferStore):
        return False
    value = store.value
    if not isinstance(value, tirx.Add) or not isinstance(value.b, tirx.Mul):
        return False
    acc = value.a
    return isinstance(acc, tvm.ir.expr.TensorLoad) and acc.source.same_as(store.buffer) and len(block.reads) == 2


class DenseCPU(dl.ScheduleRule):
    """Register-blocked, vectorized, parallel schedule of a matmul PrimFunc on LLVM targets."""

    def is_target_available(self, target):
        return target.kind.name == "llvm"

    def apply(self, func, target, _tunable):  # pylint: disable=too-many-locals
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root") if _has_root(sch) else None)
        main = [b for b in blocks if 2 in _iter_kinds(sch.get(b))]
        if len(main) != 1 or not _is_multiply_add(sch.get(main[0])):
            return None
        mm = main[0]
        kinds = _iter_kinds(sch.get(mm))
        if kinds.count(2) != 1 or kinds[-1] != 2 or len(kinds) < 2 or len(sch.get_loops(mm)) != len(kinds):
            return None
        others = [b for b in blocks if not b.same_as(mm)]
        position = [i for i, b in enumerate(blocks) if b.same_as(mm)][0]
        for b in others[:position][::-1]:          # producers (reshapes, casts) into their users
            try:
                sch.compute_inline(b)
            except tvm.error.TVMError:
                return None
        epilogue = others[position:]
        extent = sch.get(sch.get_loops(mm)[-2]).extent
        if not isinstance(extent, tvm.tirx.IntImm):
            return None
        if int(extent) % NR:                       # ragged j: pad it, so vectors need no mask
            sch.pad_einsum(mm, [1] * (len(kinds) - 2) + [NR, 1])
        *outer, k = sch.get_loops(mm)
        j = outer.pop()
        i = outer.pop() if outer else None
        jo, ji = sch.split(j, [None, NR])
        if i is not None:
            io, ii = sch.split(i, [None, MR])
            sch.reorder(*outer, jo, io, k, ii, ji)     # the tiles of one B panel in a row
            tiles = [*outer, jo, io]
        else:
            sch.reorder(*outer, jo, k, ji)
            tiles, ii = [*outer, jo], None
        _pack_weight(sch, mm, func)
        acc = sch.cache_write(mm, 0, "local")
        sch.reverse_compute_at(acc, tiles[-1])
        for b in epilogue:                         # bias, activation: on the tile, while hot
            try:
                sch.reverse_compute_inline(b)
            except tvm.error.TVMError:
                try:
                    sch.reverse_compute_at(b, tiles[-1])
                    sch.vectorize(sch.get_loops(b)[-1])
                except tvm.error.TVMError:
                    pass
        sch.vectorize(sch.get_loops(acc)[-1])
        sch.parallel(sch.fuse(*tiles))
        sch.vectorize(ji)                          # (before the init is split off: a reduction
        if ii is not None:                         # block may be vectorized, its parts not)
            sch.unroll(ii)
        sch.decompose_reduction(mm, k)
        return sch


def _pack_weight(sch, mm, func):
    """Read a weight ``B[..., k, j]`` (a layout-free buffer: a constant or parameter, as
    ``AttachAttrLayoutFreeBuffers`` marks them) in panels ``[..., j // NR, k, j % NR]``, so a
    tile streams its ``k x NR`` panel contiguously instead of touching one page per ``k``.  The
    repacking block is marked as a layout-rewrite preprocess: ``SplitLayoutRewritePreproc``
    moves it out and ``FoldConstant`` runs it once, at compile time, on constant weights."""
    attrs = func.attrs or {}
    free = {int(i) for i in attrs["layout_free_buffers"]} if "layout_free_buffers" in attrs else set()
    block = sch.get(mm)
    j_var, k_var = block.iter_vars[-2].var, block.iter_vars[-1].var

    def weight_param(source):
        params = [i for i, p in enumerate(func.params) if p.same_as(source)]
        return bool(params) and params[0] in free

    def panels(*i):
        return (*i[:-2], i[-1] // NR, i[-2], i[-1] % NR)

    for index, read in enumerate(block.reads):
        mins = [r.min for r in read.region]
        if len(mins) < 2 or not (mins[-1].same_as(j_var) and mins[-2].same_as(k_var)):
            continue
        if weight_param(read.source):
            cache = sch.cache_read(mm, index, "global")
        else:                                      # the zero-padded copy pad_einsum made
            producers = sch.get_producers(mm)
            pads = [p for p in producers if any(w.source.same_as(read.source) for w in sch.get(p).writes)]
            if len(pads) != 1 or not all(weight_param(r.source) for r in sch.get(pads[0]).reads):
                continue
            cache = pads[0]
        sch.transform_layout(cache, ("write", 0), panels, pad_value=0.0)
        sch.annotate(cache, "meta_schedule.layout_rewrite_preproc", True)
        return


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except (tvm.error.TVMError, ValueError):
        return False


def schedule_passes():
    """After FuseTIR: schedule the dense PrimFuncs, then pack their constant weights once."""
    return [relax.transform.AttachAttrLayoutFreeBuffers(), dl.ApplyDefaultSchedule(DenseCPU()),
            _split_layout_rewrite_preproc, relax.transform.FoldConstant()]


@tvm.transform.module_pass(opt_level=0, name="scanweaver.SplitLayoutRewritePreproc")
def _split_layout_rewrite_preproc(mod, _ctx):
    """TVM's ``SplitLayoutRewritePreproc``, shown only the PrimFuncs with a root block: it
    fails on any other ("The body of the primfunc should be a root block"), and our scan
    kernels (``LowerScans``) are already scheduled TIR without one."""
    hidden = {gv: f for gv, f in mod.functions_items()
              if isinstance(f, tirx.PrimFunc) and not isinstance(f.body, s_tir.SBlockRealize)}
    shown = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv not in hidden},
                         attrs=mod.attrs)
    out = relax.transform.SplitLayoutRewritePreproc()(shown)
    for gv, f in hidden.items():
        out[gv] = f
    return out


def cpu_pipeline(target):
    """TVM's CPU pipeline (``relax.backend.cpu_generic``) with ``schedule_passes`` after its
    legalization and fusion."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.CPUPipeline")
    def _pipeline(mod, _ctx):
        with target:
            return tvm.transform.Sequential(
                cpu.library_dispatch_passes(target) + cpu.legalize_passes(target) + schedule_passes()
                + cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))(mod)

    return _pipeline
