"""A DLight-style CPU schedule rule for dense layers: matmul-like reductions, tiled for registers.

TVM 0.27's CPU pipeline schedules nothing: a legalized ``matmul`` (a Linear layer, the lm head,
``x_proj``) runs as its naive ``i, j, k`` loop nest, and a whole model is bound by it.  DLight's
CPU rules cover GEMV and reductions only, so this rule takes one fused PrimFunc whose main
block is ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` (any operand layout: the schedule is
correct for all, fast when ``j`` is contiguous in ``B`` and ``C``, as a folded weight is) and
gives it the classic register-blocked form:

- an ``MR x NR`` tile of ``C`` accumulated in a local buffer over all of ``k``
  (``NR`` = two vector registers of ``j``, ``MR`` rows unrolled; ``register_tile`` picks them
  for the target's registers),
- tiles over ``(batch, i, j)`` in parallel (with symbolic rows, ``L`` or ``batch * L``: rows
  padded to ``MR`` into a copy made in parallel, column panels in parallel, row tiles in turn),
- producers inlined, the epilogue (bias, activation, residual) computed per tile while hot;
  a quantized weight's dequantization computed once a panel where several row tiles reuse it
  (to bf16 pairs for ``vdpbf16ps`` where a prefill asked for bf16 activations), inlined into
  the tile where there is one.

Anything it does not recognize returns ``None`` and is left to the next rule.
"""
from dataclasses import dataclass

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir import dlight as dl

from . import amx_bf16, bf16_dot, widen
from .cpu_rule import ApplyRules, Guarded, GuardedCPURule, has_feature, inline_epilogue, is_weight
from .dequantize_gemv_cpu import DequantizeGemvCPU
from .elementwise_cpu import PARALLEL_MIN, ElementwiseCPU
from .fold_constants import FoldConstantCalls
from .short_reduction_cpu import ShortReductionCPU

MR = 8
LANES = 16      # float32 lanes of a 512-bit vector
NR = 2 * LANES  # columns of C per register tile


@dataclass(frozen=True)
class RegisterTile:
    """An ``rows x cols`` tile of C held in vector registers over all of ``k``."""
    rows: int
    cols: int


def register_tile(target):
    """8 x 32 with AVX-512 (16 of its 32 zmm registers accumulate), 4 x 16 otherwise: with
    AVX2's 16 ymm registers 8 x 32 is 32 accumulators, spilled on every k (40 GFLOP/s on a
    (256, 768) x (768, 50304) lm head on 2 znver3 cores); 4 x 16 ran it at ~105 (6 x 16: 67,
    8 x 8: 105, 2 x 32: 109, 4 x 24: 12, measured once each, 4 x 16 best on a 3072-wide one)."""
    return RegisterTile(MR, NR) if has_feature(target, "avx512f") else RegisterTile(4, 16)
PREPROC = "meta_schedule.layout_rewrite_preproc"   # TVM's mark of a weight-repacking block


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


class DenseCPU(GuardedCPURule):
    """Register-blocked, vectorized, parallel schedule of a matmul PrimFunc on LLVM targets."""

    def schedule(self, func, target):
        return self._schedule(func, register_tile(target), bf16_dot.available(target), amx_bf16.available(target))

    def _schedule(self, func, tile, dot=False, amx=False):  # pylint: disable=too-many-locals,too-many-branches,too-many-statements
        """``dot``: the target has AVX512-BF16, ``amx``: AMX-BF16.  A bf16 x bf16 product with a
        weight then multiplies by ``bf16_dot``'s intrinsic (k in pairs), or, with 32 rows or
        more (prefill), by ``amx_bf16``'s 32 x 32 tiles (k in steps of 32); the weight is
        packed in pairs for both.  A quantized weight dequantized to bf16
        (``dequantize_matmul_bf16``) is dequantized a panel at a time, in pairs, under the
        parallel panel loop, and multiplied by ``bf16_dot``'s intrinsic."""
        mr, nr = tile.rows, tile.cols
        sch = s_tir.Schedule(func, error_render_level="none")   # (failed trials are expected: no error text)
        if not _has_root(sch):
            return None
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        main = [b for b in blocks if 2 in _iter_kinds(sch.get(b))]
        if len(main) != 1 or not _is_multiply_add(sch.get(main[0])):
            return None
        mm = main[0]
        kinds = _iter_kinds(sch.get(mm))
        if kinds.count(2) != 1 or kinds[-1] != 2 or len(kinds) < 2 or len(sch.get_loops(mm)) != len(kinds):
            return None
        position = [i for i, b in enumerate(blocks) if b.same_as(mm)][0]
        producers = blocks[:position]
        waits = [_is_dequantize(sch, b, func) for b in producers]   # (a weight's dequantization:
        dequantize = [b for b, wait in zip(producers, waits) if wait]   # inlined after padding)
        quantized_dot = (dot and len(kinds) > 2 and len(dequantize) == 1   # (rows: one dequantized
                         and _bf16_operands(sch.get(mm)) and _writes(sch, dequantize, mm, 1))   # panel, all rows)
        rounded = [b for b in producers if quantized_dot and _writes(sch, [b], mm, 0) and _casts_to_bf16(sch.get(b))]
        for b, wait in reversed(list(zip(producers, waits))):   # producers (reshapes, casts) into
            if not wait and b not in rounded:      # their users (one that will not: apply
                sch.compute_inline(b)              # leaves the func; activations rounded to bf16
                #                                    for a quantized weight's dot: kept whole)
        extents = [sch.get(loop).extent for loop in sch.get_loops(mm)]
        if not all(isinstance(e, tvm.tirx.IntImm) for e in extents[-2:]):
            return None                            # (rows and batch may be symbolic: B*L)
        static = [int(e) if isinstance(e, tvm.tirx.IntImm) else None for e in extents]
        rows, cols, depth = (static[-3] if len(extents) > 2 else 1), static[-2], static[-1]
        if cols == 1:                              # a matrix times a vector (a decode step's readout
            return None                            # h @ C): a tile would be 1 column of NR (the
            #                                        reduction rules take it)
        dot = (dot and nr % bf16_dot.LANES == 0 and _bf16_operands(sch.get(mm))   # (a weight: it is
               and (is_weight(func, sch.get(mm).reads[1].source) or quantized_dot))   # packed in pairs)
        amx = (dot and not dequantize and amx and nr == amx_bf16.COLS and len(kinds) > 2
               and (rows is None or rows >= amx_bf16.ROWS))
        tile_rows = amx_bf16.ROWS if amx else mr if rows is None or rows > mr else rows   # (few rows: one tile)
        k_step = amx_bf16.STEP if amx else 2 if dot else 1
        if rows is None or rows % tile_rows or cols % nr or depth % k_step:   # ragged: pad, so no
            sch.pad_einsum(mm, [1] * (len(kinds) - 3) + [tile_rows] * (len(kinds) > 2)   # tile needs
                           + [nr, k_step])                                          # a predicate
            for b in sch.get_producers(mm):        # the activations' padded copy: read in place
                if _reads_weights_only(sch, b, func):
                    continue                       # (the weight's is repacked: _pack_weight)
                if rows is None or dot:            # symbolic rows: the copy is kept whole, or
                    sch.parallel(sch.fuse(*sch.get_loops(b)[:-1]))   # every multiply-add would
                    continue                       # test its row; its rows copied in parallel
                try:                               # (the intrinsics read plain rows: kept whole)
                    sch.compute_inline(b)
                except RuntimeError:
                    pass
        for b in rounded:                          # the activations rounded to bf16: into their
            if _writes(sch, [b], mm, 0):           # padded copy, or a copy of their own
                sch.parallel(sch.fuse(*sch.get_loops(b)[:-1]))
            else:
                sch.compute_inline(b)
        if quantized_dot or (len(dequantize) == 1 and len(kinds) > 2 and (rows is None or rows > tile_rows)):
            (panel_weight,) = dequantize           # a panel dequantized once (to bf16 pairs for the
            sch.transform_layout(panel_weight, ("write", 0),   # dot), every row tile reusing it
                                 (bf16_dot.pairs_layout if quantized_dot else panels_layout)(nr))
        else:                                      # (one row tile: in the tile)
            for b in dequantize[::-1]:             # (after padding: pad_einsum reads plain loads)
                sch.compute_inline(b)
            panel_weight = None
        *outer, k = sch.get_loops(mm)
        j = outer.pop()
        i = outer.pop() if outer else None
        jo, ji = sch.split(j, [None, nr])
        ko, ki = sch.split(k, [None, 2]) if dot and not amx else (k, None)
        lanes = bf16_dot.LANES if dot and not amx else LANES if dequantize and nr > LANES else None
        jh, jl = sch.split(ji, [None, lanes]) if lanes else (None, ji)    # (a packed weight's
        inner = [ji, ko] if amx else [jh, jl, ki] if dot else [jh, jl] if lanes else [ji]   # lanes)
        if i is not None:
            io, ii = sch.split(i, [None, tile_rows])
            if amx:                                        # (one 32 x 32 tile over all of k)
                sch.reorder(*outer, jo, io, ii, *inner)
            else:                                          # the tiles of one B panel in a row
                sch.reorder(*outer, jo, io, ko, ii, *inner)
            tiles = [*outer, jo, io]
        else:
            sch.reorder(*outer, jo, ko, *inner)
            tiles, ii = [*outer, jo], None
        if panel_weight is None:                   # (a dequantized panel is laid out already: one
            _pack_weight(sch, mm, func, (bf16_dot.pairs_layout if dot else panels_layout)(nr))   # panel's
        #                                            layout simplifies to the plain one, not a pad)
        acc = sch.cache_write(mm, 0, "local")
        sch.reverse_compute_at(acc, tiles[-1])
        inline_epilogue(sch, acc)                  # bias, activation: on the tile, while hot
        sch.vectorize(sch.get_loops(acc)[-1])
        if rows is None or panel_weight is not None:   # panels in parallel, row tiles in turn:
            parallel = sch.fuse(*tiles[:-1])   # symbolic rows (a fused index would divide by L, and the
        else:                                  # tile's accumulator would not shrink to MR x NR), or a
            parallel = sch.fuse(*tiles)        # dequantized panel (every row tile reuses it)
        sch.parallel(parallel)
        if panel_weight is not None:               # each row of the panel a vector (bf16: its
            sch.compute_at(panel_weight, parallel)  # rows of k in pairs)
            k_rows, columns = sch.get_loops(panel_weight)[-2:]
            if quantized_dot:
                _, pair = sch.split(k_rows, [None, 2])
                sch.reorder(pair, columns)
                sch.unroll(pair)
            sch.vectorize(columns)
        if amx:
            sch.decompose_reduction(mm, ii)
            sch.tensorize(ii, amx_bf16.intrin(_padded(depth, k_step)))
            amx_bf16.import_configure(sch, parallel)
            return sch
        if jh is not None:
            sch.unroll(jh)
        if not dot:
            sch.vectorize(jl)                      # (before the init is split off: a reduction
        if ii is not None:                         # block may be vectorized, its parts not)
            sch.unroll(ii)
        sch.decompose_reduction(mm, ko)
        if dot:
            sch.tensorize(jl, bf16_dot.INTRIN)
            bf16_dot.import_wrapper(sch, parallel)
        return sch


def _padded(n, step):
    return -(-n // step) * step


def _bf16_operands(block):
    """``C[..] += float32(A[..]) * float32(B[..])`` with A and B in bf16 (C float32)."""
    product = block.body.value.b
    return (str(block.body.buffer.dtype) == "float32" and isinstance(product.a, tirx.Cast)
            and isinstance(product.b, tirx.Cast) and all(str(r.source.dtype) == "bfloat16" for r in block.reads))


def _writes(sch, blocks, mm, operand):
    """One of ``blocks`` writes ``mm``'s read ``operand``."""
    source = sch.get(mm).reads[operand].source
    return any(sch.get(b).writes[0].source.same_as(source) for b in blocks)


def _casts_to_bf16(block):
    """``block`` writes bf16 from float32 reads (activations rounded for ``bf16_dot``)."""
    return (str(block.writes[0].source.dtype) == "bfloat16"
            and any(str(r.source.dtype) == "float32" for r in block.reads))


def _is_dequantize(sch, block, func):
    """``block`` computes a float weight from packed integer weights (``quantize_weights``'
    ``dequantize_matmul``): it reads layout-free buffers only, one of them integer."""
    got = sch.get(block)
    return (bool(got.reads) and _reads_weights_only(sch, block, func)
            and any("int" in str(r.source.dtype) for r in got.reads) and "float" in str(got.writes[0].source.dtype))


def _reads_weights_only(sch, block, func):
    return all(is_weight(func, r.source) for r in sch.get(block).reads)


def panels_layout(nr):
    """A packed weight's index map: ``[..., k, j] -> [..., j // nr, k, j % nr]``."""
    def panels(*i):
        return (*i[:-2], i[-1] // nr, i[-2], i[-1] % nr)
    return panels


def _pack_weight(sch, mm, func, layout):
    """Read a weight ``B[..., k, j]`` (a layout-free buffer: a constant or parameter, as
    ``AttachAttrLayoutFreeBuffers`` marks them) through ``layout``: ``panels_layout``, or
    ``bf16_dot.pairs_layout``, so a tile streams its ``k x nr`` panel contiguously instead of
    touching one page per ``k``.  The
    repacking block is marked as a layout-rewrite preprocess: ``SplitLayoutRewritePreproc``
    moves it out and ``FoldConstant`` runs it once, at compile time, on constant weights."""
    block = sch.get(mm)
    j_var, k_var = block.iter_vars[-2].var, block.iter_vars[-1].var
    for index, read in enumerate(block.reads):
        mins = [r.min for r in read.region]
        if len(mins) < 2 or not (mins[-1].same_as(j_var) and mins[-2].same_as(k_var)):
            continue
        if is_weight(func, read.source):
            cache = sch.cache_read(mm, index, "global")
        else:                                      # the zero-padded copy pad_einsum made
            producers = sch.get_producers(mm)
            pads = [p for p in producers if any(w.source.same_as(read.source) for w in sch.get(p).writes)]
            if len(pads) != 1 or not _reads_weights_only(sch, pads[0], func):
                continue
            cache = pads[0]
        zero = 0 if "int" in str(read.source.dtype) else 0.0      # (an int8 weight pads with 0)
        sch.transform_layout(cache, ("write", 0), layout, pad_value=zero)
        sch.annotate(cache, PREPROC, True)
        return


def _has_root(sch):
    try:
        sch.get_sblock("root")
        return True
    except (RuntimeError, ValueError):
        return False


def schedule_passes():
    """After FuseTIR: schedule the dense PrimFuncs (and the injective ones:
    ``elementwise_cpu``), then pack their constant weights once (in one build)."""
    return [_attach_layout_free_buffers, ApplyRules(DequantizeGemvCPU(), DenseCPU(), ElementwiseCPU(), ShortReductionCPU(),
                                                    Guarded(dl.cpu.Reduction(), PARALLEL_MIN)),
            _split_layout_rewrite_preproc, FoldConstantCalls]


@tvm.transform.module_pass(opt_level=0, name="scanweaver.AttachAttrLayoutFreeBuffers")
def _attach_layout_free_buffers(mod, _ctx):
    """What TVM's ``AttachAttrLayoutFreeBuffers`` marks (a PrimFunc's buffers that a
    ``call_tir`` passes constants to may change layout: ``DenseCPU`` packs such weights), on
    a copy of the PrimFunc per set of such buffers.  Ours: TVM's pass copies every PrimFunc,
    and over a symbolic shape its copy of a legalized ``cumsum`` gives the output buffer a
    layout over a fresh ``L``, which the build then finds unbound ("variables (L,) are used,
    but are not passed in as API arguments")."""
    copies = {}                                   # (callee, indices) -> GlobalVar of the copy
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class _Marker(relax.PyExprMutator):
        def visit_call_(self, call):               # pylint: disable=arguments-renamed
            call = super().visit_call_(call)
            if call.op != call_tir or not isinstance(mod[call.args[0]], tirx.PrimFunc):
                return call
            args = call.args[1].fields
            indices = tuple(i for i, a in enumerate(args) if isinstance(a, tvm.ir.Constant))
            if not indices:
                return call
            key = (call.args[0], indices)
            if key not in copies:
                func = mod[call.args[0]].with_attr("layout_free_buffers", list(indices))
                copies[key] = self.builder_.add_func(func, f"{call.args[0].name_hint}_weights")
            return relax.Call(call.op, [copies[key]] + list(call.args[1:]), call.attrs, call.ty_args)

    marker = _Marker(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            marker.builder_.update_func(gv, marker.visit_expr(func))
    return relax.transform.DeadCodeElimination()(marker.builder_.get())


@tvm.transform.module_pass(opt_level=0, name="scanweaver.SplitLayoutRewritePreproc")
def _split_layout_rewrite_preproc(mod, _ctx):
    """TVM's ``SplitLayoutRewritePreproc``, shown only the PrimFuncs ``DenseCPU`` packed a
    weight in: it fails on many others ("The body of the primfunc should be a root block" on
    our scan kernels, "There should be a compute block ..." on some legalized ops)."""
    packed = {gv for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc) and _packs(f)}
    if not packed:
        return mod
    shown = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                          if gv in packed or not isinstance(f, tirx.PrimFunc)}, attrs=mod.attrs)
    out = relax.transform.SplitLayoutRewritePreproc()(shown)
    for gv, f in mod.functions_items():
        if isinstance(f, tirx.PrimFunc) and gv not in packed:
            out[gv] = f
    return out


def _packs(func):
    """``func`` has a block marked as a layout-rewrite preprocess (``_pack_weight``); only a
    scheduled function with layout-free buffers can (TVM 0.27 has no Python TIR visitor, so
    the few candidates are read as text)."""
    attrs = func.attrs or {}
    return "layout_free_buffers" in attrs and "tirx.is_scheduled" in attrs and PREPROC in func.script()


def cpu_pipeline(target, after_lowering=(), database=None):
    """TVM's CPU pipeline (``relax.backend.cpu_generic``) with ``schedule_passes`` after its
    legalization and fusion, and ``after_lowering`` (the caller's passes) after its dataflow
    lowering (the kernels called in destination-passing style, before memory planning).
    With a MetaSchedule ``database``, each fused PrimFunc with a record takes its best
    schedule first (``apply_database``); the rules schedule the rest."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu  # pylint: disable=import-outside-toplevel

    @tvm.transform.module_pass(opt_level=0, name="scanweaver.CPUPipeline")
    def _pipeline(mod, _ctx):
        if amx_bf16.available(target) and amx_bf16.host_has_amx():
            amx_bf16.request_permission()       # (its kernels may run in this process)
        with target:
            return tvm.transform.Sequential(
                tunable_passes(target) + ([apply_database(database)] if database is not None else [])
                + schedule_passes() + cpu.dataflow_lower_passes(target) + list(after_lowering)
                + cpu.finalize_passes(target) + [_mark_single_pointer_funcs_noalias])(mod)

    return _pipeline


def tunable_passes(target):
    """The CPU pipeline up to its fused PrimFuncs (library dispatch, legalization, fusion):
    the functions MetaSchedule tunes, and finds again in its database when compiling."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu  # pylint: disable=import-outside-toplevel

    return widen.passes(target) + cpu.library_dispatch_passes(target) + cpu.legalize_passes(target)


def apply_database(database):
    """TVM's ``MetaScheduleApplyDatabase`` with ``database``: the PrimFuncs it schedules are
    marked scheduled, so the rules after it leave them as tuned."""
    @tvm.transform.module_pass(opt_level=0, name="scanweaver.ApplyDatabase")
    def _apply(mod, _ctx):
        with database:
            return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)

    return _apply


@tvm.transform.module_pass(opt_level=0, name="scanweaver.MarkSinglePointerFuncsNoAlias")
def _mark_single_pointer_funcs_noalias(mod, _ctx):
    """Mark ``tirx.noalias`` on the PrimFuncs with at most one pointer parameter (nothing for
    it to alias): with symbolic shapes, ``VMShapeLower``'s host ``shape_func``.

    Why: TVM 0.27's LLVM codegen leaks a function's missing ``tirx.noalias`` onto the parallel
    lambdas of the functions it emits before it (``shape_func`` sorts after ``matmul*``): all
    their loads and stores then share one "may alias" TBAA tag.  ``DenseCPU``'s ``MR x NR``
    accumulator is a "local" buffer, which the CPU backend allocates with
    ``TVMBackendAllocWorkspace`` (never on the stack), so only TBAA tells LLVM that the
    activation and weight loads do not touch it; without it LLVM stores all 16 accumulator
    vectors back on every ``k`` step, and a symbolic-rows matmul ran ~2x slower than the static
    one (same TIR, same kernel otherwise)."""
    for gv, func in list(mod.functions_items()):
        if not isinstance(func, tirx.PrimFunc) or (func.attrs and "tirx.noalias" in func.attrs):
            continue
        if sum(not isinstance(p.ty, tvm.ir.type.PrimType) for p in func.params) <= 1:   # buffers
            mod[gv] = func.with_attr("tirx.noalias", True)
    return mod
