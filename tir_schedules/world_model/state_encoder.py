"""Encoder input for the INITIAL (unscheduled) TensorIR program: a fixed-length feature vector.

The world model never looks at the scheduled program: it starts from this state and rolls the
scheduling actions forward.  Features are per block (iteration space, loop nest, buffer traffic,
arithmetic mix, dtype) pooled over blocks by sum and max, plus the block count.  Magnitudes
are ``log2(1 + x)`` so shapes of very different sizes share a scale.
"""
import math

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx

from ..tir_blocks import blocks_with_loops, const_int

BLOCK_FEATURES = ("loops", "loop_iters", "spatial_iters", "reduce_iters", "spatial_extent",
                  "reduce_extent", "reads", "writes", "read_elems", "write_elems", "loads",
                  "arith", "transcendental", "compares", "dtype_bits", "has_init")
STATE_DIM = 1 + 2 * len(BLOCK_FEATURES)

# node classes by name: in TVM 0.27 some (BufferLoad, Call) are not exported as Python classes,
# and a load prints as TensorLoad
_KIND = {**{n: "arith" for n in ("Add", "Sub", "Mul", "Div", "FloorDiv", "FloorMod", "Mod")},
         **{n: "compares" for n in ("Max", "Min", "Select", "LT", "LE", "GT", "GE", "EQ")},
         "BufferLoad": "loads", "TensorLoad": "loads", "Call": "transcendental"}


def _lg(x):
    return math.log2(1.0 + max(float(x), 0.0))


def _elems(region):
    return math.prod(const_int(s) for s in region.source.shape) if len(region.source.shape) else 1


def _block_row(block, loop_extents):
    counts = {"loads": 0, "arith": 0, "transcendental": 0, "compares": 0}

    def visit(node):
        kind = _KIND.get(type(node).__name__)
        if kind is not None:
            counts[kind] += 1

    tvm_ffi.structural_walk(block.body, visit)
    spatial = [const_int(iv.dom.extent) for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [const_int(iv.dom.extent) for iv in block.iter_vars if iv.iter_type != tirx.IterVar.DataPar]
    bits = max([tvm.DataType(str(w.source.dtype)).bits for w in block.writes] or [32])
    row = {
        "loops": len(loop_extents), "loop_iters": _lg(math.prod(loop_extents)),
        "spatial_iters": len(spatial), "reduce_iters": len(reduce),
        "spatial_extent": _lg(math.prod(spatial)), "reduce_extent": _lg(math.prod(reduce)),
        "reads": len(block.reads), "writes": len(block.writes),
        "read_elems": _lg(sum(_elems(r) for r in block.reads)),
        "write_elems": _lg(sum(_elems(w) for w in block.writes)),
        "loads": _lg(counts["loads"]), "arith": _lg(counts["arith"]),
        "transcendental": _lg(counts["transcendental"]), "compares": _lg(counts["compares"]),
        "dtype_bits": bits / 32.0, "has_init": float(block.init is not None),
    }
    return [float(row[k]) for k in BLOCK_FEATURES]


def main_func(mod):
    """The PrimFunc of a task (``IRModule`` with one PrimFunc, or a PrimFunc)."""
    if isinstance(mod, tirx.PrimFunc):
        return mod
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ValueError(f"state encoder: expected one PrimFunc in the task module, got {len(funcs)}")
    return funcs[0]


def encode_state(mod):
    """``float32[STATE_DIM]``: block count, then per-block features summed, then maxed."""
    rows = np.array([_block_row(b, loops) for b, loops in blocks_with_loops(main_func(mod))],
                    dtype=np.float64).reshape(-1, len(BLOCK_FEATURES))
    if rows.shape[0] == 0:
        raise ValueError("state encoder: the PrimFunc has no blocks (not a TensorIR workload)")
    vec = np.concatenate([[_lg(rows.shape[0])], rows.sum(0), rows.max(0)])
    return vec.astype(np.float32)


def block_loop_extents(mod):
    """``{block name: [loop extents]}`` of the initial program (the action encoder's start state)."""
    return {b.name_hint: loops for b, loops in blocks_with_loops(main_func(mod))}


def state_key(mod):
    """A stable key for a task's initial program (structural hash)."""
    return str(tvm_ffi.structural_hash(main_func(mod)))
