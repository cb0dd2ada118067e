"""Pieces both GPU kernels share: bare-pointer parameters, workgroup buffers, the pair
algebra, and the Blelloch tile schedule (upsweep, root, downsweep) on affine pairs.

Kernel contract (the CPU route relies on it, as tir_schedules' emulator does on TIR's): control
flow around a ``gpu.barrier`` is thread-uniform, and nothing computed by a thread lives across a
barrier except in workgroup memory.
"""
from dataclasses import dataclass
from typing import Callable

from scanweaver_core.algebra import IDENTITY

from . import emit
from .emit import MLIR_DTYPES, memref_type
from .operands import numel

WORKGROUP = "#gpu.address_space<workgroup>"
DYN = -9223372036854775808  # ShapedType::kDynamic in static_sizes


@dataclass
class Kernel:
    """A gpu.func and what launching it needs; ``func`` is the emit.Op the CPU route reads."""

    name: str
    func: emit.Op
    globals: list          # memref.global ops of workgroup buffers
    params: list           # ("ptr", operand) | ("i64", scalar)
    threads: int
    grid: Callable         # shape_env -> (x, y, z)
    shared_bytes: int


def param_type(shape, dtype):
    """Bare-pointer friendly: static memrefs, or memref<1xT> reinterpreted at a runtime size."""
    elem = MLIR_DTYPES[dtype]
    return memref_type((numel(shape),), elem) if None not in shape else memref_type((1,), elem)


def bind_params(b, operands, args, length):
    """Flat 1-D views of every operand (dynamic size when it depends on L)."""
    views = {}
    for (name, shape, dtype, _), arg in zip(operands, args):
        if None not in shape:
            views[name] = arg
            continue
        static = numel(tuple(1 if d is None else d for d in shape))
        size = b.mul(length, b.index(static))
        views[name] = b.op("memref.reinterpret_cast", [arg, size], [memref_type((None,), MLIR_DTYPES[dtype])],
                           props={"operandSegmentSizes": emit.attr_dense([1, 0, 1, 0], "i32"),
                                  "static_offsets": emit.attr_dense([0]),
                                  "static_sizes": emit.attr_dense([DYN]),
                                  "static_strides": emit.attr_dense([1])}, hint=name)
    return views


def workgroup_buffer(b, globals_, name, size):
    """A workgroup f32 buffer: a memref.global in the gpu.module, fetched in the kernel."""
    type_ = memref_type((size,), "f32", WORKGROUP)
    globals_.append(emit.Op("memref.global", [], [], props={
        "sym_name": emit.attr_str(name), "sym_visibility": emit.attr_str("private"),
        "type": type_, "alignment": emit.attr_int(16)}))
    return b.op("memref.get_global", [], [type_], props={"name": emit.attr_sym(name)}, hint=name)


def compose(b, first, second):
    """(a2*a1, a2*u1 + u2): ``first`` then ``second`` (scanweaver_core.algebra.compose)."""
    (a1, u1), (a2, u2) = first, second
    return b.mul(a2, a1), b.add(b.mul(a2, u1), u2)


def identity(b):
    return b.f32(IDENTITY[0]), b.f32(IDENTITY[1])


def barrier(b):
    b.op("gpu.barrier")


def load_pair(b, sa, su, j):
    return b.load(sa, [j]), b.load(su, [j])


def store_pair(b, pair, sa, su, j):
    b.store(pair[0], sa, [j])
    b.store(pair[1], su, [j])


def blelloch_tile(b, tid, tile, sa, su, stot):
    """Exclusive scan of ``tile`` pairs in (sa, su), two per thread; the tile's total goes to
    stot[0:2] before the root is cleared.  Levels are unrolled (tile is static)."""
    levels = tile.bit_length() - 1
    two_t = b.mul(tid, b.index(2))
    for d in range(levels):                                   # upsweep
        offset = 1 << d
        with b.if_(b.cmpi("ult", tid, b.index(tile >> (d + 1)))):
            left = b.sub(b.mul(b.add(two_t, b.index(1)), b.index(offset)), b.index(1))
            right = b.sub(b.mul(b.add(two_t, b.index(2)), b.index(offset)), b.index(1))
            store_pair(b, compose(b, load_pair(b, sa, su, left), load_pair(b, sa, su, right)), sa, su, right)
        barrier(b)
    with b.if_(b.cmpi("eq", tid, b.index(0))):                 # root: save total, clear
        last = b.index(tile - 1)
        tot = load_pair(b, sa, su, last)
        b.store(tot[0], stot, [b.index(0)])
        b.store(tot[1], stot, [b.index(1)])
        store_pair(b, identity(b), sa, su, last)
    barrier(b)
    for d in reversed(range(levels)):                          # downsweep
        offset = 1 << d
        with b.if_(b.cmpi("ult", tid, b.index(tile >> (d + 1)))):
            left = b.sub(b.mul(b.add(two_t, b.index(1)), b.index(offset)), b.index(1))
            right = b.sub(b.mul(b.add(two_t, b.index(2)), b.index(offset)), b.index(1))
            left_total = load_pair(b, sa, su, left)
            prefix = load_pair(b, sa, su, right)
            store_pair(b, prefix, sa, su, left)
            store_pair(b, compose(b, prefix, left_total), sa, su, right)
        barrier(b)


def threads_for(length, limit=256):
    """Power-of-two thread count covering L with two elements per thread, at most ``limit``."""
    if length is None:
        return limit
    t = 1
    while t < limit and 2 * t < length:
        t *= 2
    return t


def gpu_module(kernel):
    """The gpu.module op holding the kernel and its workgroup globals."""
    blk = emit.Block()
    blk.ops = [*kernel.globals, kernel.func]
    return emit.Op("gpu.module", [], [], props={"sym_name": emit.attr_str("scanweaver")}, regions=[[blk]])
