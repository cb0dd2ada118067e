"""The affine scan as a ``gpu.func`` in upstream dialects, from the Blelloch stage.

One block per lane (``gpu.block_id x``), ``threads`` threads, tiles of ``tile = 2*threads``
pairs in workgroup memory; per tile: load pairs (identity past L), Blelloch exclusive scan,
each element's state from its inclusive prefix applied to the carry, then the carry advances
by the tile's total.  Any L; reverse reads the lane back to front; h0 seeds the carry; fp16/bf16
are widened to f32 on load and narrowed on store.
"""
from . import emit
from .emit import MLIR_DTYPES
from .kernel_common import (Kernel, barrier, bind_params, blelloch_tile, compose, identity,
                            param_type, workgroup_buffer)
from .operands import digest, operands, symbolic


def _stride(b, stride, length):
    coef, pow_l = stride
    value = b.index(coef)
    return b.mul(value, length) if pow_l else value


def _lane_offsets(b, layout, lane, length):
    """Base offsets of b (and states) and of a for this lane (a's broadcast dims stride 0)."""
    base_b, base_a, rem = b.index(0), b.index(0), lane
    for extent, b_stride, a_stride in reversed(layout.dims):
        idx = b.binary("remui", rem, b.index(extent))
        rem = b.binary("divui", rem, b.index(extent))
        base_b = b.add(base_b, b.mul(idx, _stride(b, b_stride, length)))
        if a_stride[0]:
            base_a = b.add(base_a, b.mul(idx, _stride(b, a_stride, length)))
    return base_b, base_a


def generate(stage):
    """Kernel for a ``stage_blelloch.BlellochStage`` of an affine spec."""
    spec, layout, tile, threads = stage.spec, stage.layout, stage.tile, stage.threads
    ops, syms = operands(spec), symbolic(spec)
    elem = MLIR_DTYPES[spec.dtype]
    arg_types = [param_type(shape, dt) for _, shape, dt, _ in ops] + ["i64"] * len(syms)
    b, globals_ = emit.Builder(), []
    name = "scanweaver_affine_scan_" + digest(spec)

    def body(args):
        smem_a = workgroup_buffer(b, globals_, "sw_pairs_a", tile)
        smem_u = workgroup_buffer(b, globals_, "sw_pairs_u", tile)
        smem_c = workgroup_buffer(b, globals_, "sw_carry", 3)   # [total_a, total_u, carry]
        tid = b.op("gpu.thread_id", [], ["index"], props={"dimension": "#gpu<dim x>"}, hint="tid")
        lane = b.op("gpu.block_id", [], ["index"], props={"dimension": "#gpu<dim x>"}, hint="lane")
        length = b.index_cast(args[-1], "index") if syms else b.index(layout.length)
        v = bind_params(b, ops, args, length)
        base_b, base_a = _lane_offsets(b, layout, lane, length)
        last_t = b.sub(length, b.index(1))
        zero = b.index(0)

        def element(pos):
            """(valid, a, b) of sequence position ``pos`` (clamped load, identity past L)."""
            valid = b.cmpi("ult", pos, length)
            clamped = b.select(valid, pos, last_t)
            t = b.sub(last_t, clamped) if layout.reverse else clamped
            a = b.to_f32(b.load(v["a"], [b.add(base_a, b.mul(t, _stride(b, layout.a_tstride, length)))]))
            x_off = b.add(base_b, b.mul(t, _stride(b, layout.b_tstride, length)))
            u = b.to_f32(b.load(v["b"], [x_off]))
            one, nil = identity(b)
            return valid, (b.select(valid, a, one), b.select(valid, u, nil)), x_off

        with b.if_(b.cmpi("eq", tid, zero)):                          # carry <- h0 or 0
            h0 = b.to_f32(b.load(v["h0"], [lane])) if spec.has_h0 else b.f32(0.0)
            b.store(h0, smem_c, [b.index(2)])
        barrier(b)
        ntiles = b.binary("ceildivui", length, b.index(tile))
        with b.for_(zero, ntiles) as tile_idx:
            start = b.mul(tile_idx, b.index(tile))
            for k in range(2):                                         # stage the tile's pairs
                j = b.add(b.mul(tid, b.index(2)), b.index(k))
                _, pair, _ = element(b.add(start, j))
                b.store(pair[0], smem_a, [j])
                b.store(pair[1], smem_u, [j])
            barrier(b)
            blelloch_tile(b, tid, tile, smem_a, smem_u, smem_c)
            if "states" in spec.outputs:                               # states = incl prefix o carry
                for k in range(2):
                    j = b.add(b.mul(tid, b.index(2)), b.index(k))
                    valid, pair, x_off = element(b.add(start, j))
                    with b.if_(valid):
                        inc = compose(b, (b.load(smem_a, [j]), b.load(smem_u, [j])), pair)
                        h = b.add(b.mul(inc[0], b.load(smem_c, [b.index(2)])), inc[1])
                        b.store(b.from_f32(h, elem), v["states"], [x_off])
                barrier(b)
            with b.if_(b.cmpi("eq", tid, zero)):                       # carry advances by the total
                carry = b.add(b.mul(b.load(smem_c, [b.index(0)]), b.load(smem_c, [b.index(2)])),
                              b.load(smem_c, [b.index(1)]))
                b.store(carry, smem_c, [b.index(2)])
            barrier(b)
        if "last" in spec.outputs:
            with b.if_(b.cmpi("eq", tid, zero)):
                b.store(b.from_f32(b.load(smem_c, [b.index(2)]), elem), v["last"], [lane])
        b.op("gpu.return")

    func = emit.func(b, name, arg_types, [], body, op_name="gpu.func",
                     attrs={"gpu.kernel": "unit", "known_block_size": emit.attr_dense([threads, 1, 1], "i32")})
    lanes = layout.lanes
    return Kernel(name, func, globals_, [("ptr", n) for n, *_ in ops] + [("i64", s) for s in syms],
                  threads, lambda env=None: (lanes, 1, 1), 4 * (2 * tile + 3))
