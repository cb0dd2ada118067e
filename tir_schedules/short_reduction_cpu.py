"""A DLight-style CPU rule for reductions over a few taps along a long row: the depthwise causal
``conv1d`` of Mamba, Mamba-2 and Gated DeltaNet layers (4 taps) with its bias, slice and SiLU.

DLight's CPU ``Reduction`` rule fuses all the leading spatial loops of the last block and
computes every earlier block under that loop, so the conv runs one output element at a time
(2.9 ms for (1536, 512) x 4 taps, where the arithmetic is 3 M multiply-adds).  This rule inlines
the padding and the epilogue (DLight's ``try_inline``), runs the rows (every spatial axis but
the last) in parallel, and in each row puts the taps outside the row's positions, so the
innermost loop walks the row contiguously (a plain loop LLVM vectorizes; the init and the
epilogue are vectorized when their extent is static and a multiple of ``LANES``); the
epilogue is computed per row, right after it.  It applies when the reduce
loops are static and at most ``MAX_TAPS`` iterations; anything else returns None.
"""
import re

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base.common_schedules import try_inline

from .cpu_rule import GuardedCPURule, elements
from .elementwise_cpu import LANES, PARALLEL_MIN

MAX_TAPS = 16


class ShortReductionCPU(GuardedCPURule):
    """Rows in parallel, taps outside, positions inside, epilogue per row."""

    def schedule(self, func, target):
        sch = s_tir.Schedule(func, error_render_level="none")   # (failed trials are expected: no error text)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        infos = try_inline(sch, infos)
        if len(infos) not in (1, 2) or infos[0].is_injective() or (len(infos) == 2 and not infos[1].is_injective()):
            return None
        red = infos[0]
        kinds = red.dom_kind()
        if not re.fullmatch("S{2,}R+", kinds):
            return None
        n_s = kinds.count("S")
        loops = sch.get_loops(red.block_rv)
        extents = [sch.get(loop).extent for loop in loops]
        taps = 1
        for e in extents[n_s:]:
            if not isinstance(e, tirx.IntImm):
                return None
            taps *= int(e)
        if taps > MAX_TAPS:
            return None
        rows, row, reduce_loops = loops[:n_s - 1], loops[n_s - 1], loops[n_s:]
        sch.reorder(*rows, *reduce_loops, row)
        fused = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        if elements(extents[:n_s]) >= PARALLEL_MIN:
            sch.parallel(fused)
        init = sch.decompose_reduction(red.block_rv, reduce_loops[0])
        _vectorize_last(sch, init)        # (the update's row loop is LLVM's to vectorize: TVM
                                          # refuses it, the block no longer being complete)
        if len(infos) == 2:
            epilogue = infos[1].block_rv
            sch.reverse_compute_at(epilogue, fused)
            inner = sch.get_loops(epilogue)[1:]
            if len(inner) > 1:
                sch.fuse(*inner)
            if inner:
                _vectorize_last(sch, epilogue)
        return sch


def _vectorize_last(sch, block):
    """Vectorize ``block``'s innermost loop in ``LANES`` when its extent is static and a
    multiple of them (a symbolic row stays scalar: TVM cannot vectorize its ragged tail)."""
    loop = sch.get_loops(block)[-1]
    extent = sch.get(loop).extent
    if isinstance(extent, tirx.IntImm) and int(extent) % LANES == 0 and int(extent) > LANES:
        _, lanes = sch.split(loop, [None, LANES])
        sch.vectorize(lanes)
