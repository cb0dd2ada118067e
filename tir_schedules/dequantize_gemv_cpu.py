"""A DLight-style CPU rule for a few rows times a packed integer weight, summed group by group
(``relax_pass.quantize_weights.dequantize_gemv``: a decode step's dense layer in int4 / int8_asym).

The function's reductions, ``partial[.., g, j] = sum_kk x * q`` (the integer weight widened in
registers), ``xsum[.., g] = sum_kk x`` and ``C[.., j] = sum_g partial * scale + xsum * low``,
become one tile per few panels of the weight (``PANEL`` columns each; tiles in parallel): for
each group, ``partial`` accumulates in registers over the group's rows of the tile's panels,
streamed once, then folds into ``C``'s accumulator; ``xsum`` (a few hundred additions) is
computed first, serially.  The epilogue (bias, activation, cast) is computed on the tile.

Anything else returns ``None`` and is left to the next rule.
"""
import tvm

from scanweaver_core.weight_formats import GEMV_ROWS, PANEL
from .cpu_rule import GuardedCPURule, elements, has_feature, inline_epilogue, is_weight

HALF = PANEL // 2   # the columns of one nibble of a panel's bytes: one vector's lanes


class DequantizeGemvCPU(GuardedCPURule):
    """``dequantize_gemv``'s reductions, scheduled as one tile per few panels."""

    def schedule(self, func, target):
        sch = tvm.s_tir.Schedule(func, error_render_level="none")   # (failed trials are expected: no error text)
        stages = _stages(sch, func)
        if stages is None:
            return None
        partial, main = stages
        *lead, j, g = sch.get_loops(main)
        extents = [sch.get(loop).extent for loop in (*lead, j)]
        if not all(isinstance(e, tvm.tirx.IntImm) for e in extents) or int(extents[-1]) % PANEL:
            return None
        panels = _panels_per_tile(target, int(extents[-1]) // PANEL)
        if elements(extents[:-1]) > GEMV_ROWS:   # (more rows: a GEMM, ``dense_cpu``'s)
            return None
        names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
        for name in names[:names.index(sch.get(main).name_hint)][::-1]:
            if not _is_reduction(sch, sch.get_sblock(name)):
                sch.compute_inline(sch.get_sblock(name))   # (x's reshapes and casts: read in the tile)
        panel, half, lanes = sch.split(j, [None, 2 * panels, HALF])
        sch.reorder(panel, g, *lead, half, lanes)
        acc = sch.cache_write(main, 0, "local")
        sch.reverse_compute_at(acc, panel)
        inline_epilogue(sch, acc)                  # bias, activation, cast: on the tile
        sch.vectorize(sch.get_loops(acc)[-1])
        sch.parallel(panel)
        sch.compute_at(partial, g)                 # one group of one panel, in registers
        *columns, k = sch.get_loops(partial)[2:]   # (its rows and columns under the panel and g)
        unrolled, lanes_of_partial = sch.split(sch.fuse(*columns), [None, HALF])
        sch.reorder(k, unrolled, lanes_of_partial)
        sch.set_scope(partial, 0, "local")
        sch.unroll(unrolled)
        sch.vectorize(lanes_of_partial)            # (before the init is split off: a reduction
        sch.decompose_reduction(partial, k)        # block may be vectorized, its parts not)
        for loop in (*lead, half):
            sch.unroll(loop)
        sch.vectorize(lanes)
        sch.decompose_reduction(main, g)
        return sch


def _panels_per_tile(target, panels):
    """Panels a tile spans: each column vector of ``partial`` accumulates one chain of FMAs
    over its group, so a tile of one panel (two vectors) waits on the FMA's latency; 4 panels
    (8 chains) with AVX-512's 32 registers, 2 with AVX2's 16 (a vector of 16 lanes is two of
    them), fewer where ``panels`` does not divide."""
    widest = 4 if has_feature(target, "avx512f") else 2
    return next(p for p in (widest, 2, 1) if p <= widest and panels % p == 0)


def _is_reduction(sch, block):
    return any(iv.iter_type == 2 for iv in sch.get(block).iter_vars)


def _stages(sch, func):
    """``(partial, main)`` when the function's reductions are ``dequantize_gemv``'s: the last
    (``main``) reads the others' outputs, ``partial`` reads a packed integer weight (a
    layout-free parameter), ``xsum`` no weight; None otherwise."""
    try:
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except (RuntimeError, ValueError):
        return None
    *first, main = [b for b in blocks if _is_reduction(sch, b)] or [None]
    if len(first) != 2:
        return None
    reads = [r.source for r in sch.get(main).reads]
    if not all(any(sch.get(b).writes[0].source.same_as(r) for r in reads) for b in first):
        return None
    packed = [b for b in first if any(is_weight(func, r.source) and "int" in str(r.source.dtype)
                                      for r in sch.get(b).reads)]
    others = [b for b in first if b is not (packed or [None])[0]]
    if len(packed) != 1 or any(is_weight(func, r.source) for b in others for r in sch.get(b).reads):
        return None
    return packed[0], main
